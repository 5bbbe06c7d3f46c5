//! What must not compile (DESIGN.md §2), one misuse per file under `tests/ui/`, each with the
//! error it gives. Re-bless the `.stderr` snapshots with `TRYBUILD=overwrite cargo test --test ui`
//! when the compiler's wording changes, and review them like code.

#[test]
fn misuse_does_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
    // What must compile: handlers that write and enqueue through their delivery's transaction
    // (their futures must be `Send` to be spawned).
    cases.pass("tests/ui/pass/*.rs");
}
