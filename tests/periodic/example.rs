//! `examples/periodic.rs` runs as a user runs it, and does what it prints (here rather than in
//! `tests/it/examples.rs`, so that it needs no build of the `it` binary).

use std::process::Command;

#[test]
fn periodic_makes_one_job_per_tick_and_catches_up_once() {
    let binary = crate::support::example_binary("periodic");
    let output = Command::new(&binary)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (cargo test builds the examples)", binary.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let expected = [
        "two runners carry \"report\" every 200 ms: the first 5 ticks handled, each once",
        "both stopped for 5 ticks",
        "restarted with Missed::CatchUp: the latest missed tick handled once, then the next on time",
    ];
    assert_eq!(lines, expected, "{stdout}");
}
