//! Throughput: this crate against a hand-written sqlx loop running the same statements.
//!
//! Not written yet: the comparison, its grid and its figures are issue 7. The bench target
//! exists so that `cargo bench --no-run` keeps building it.

fn main() {
    eprintln!("benches/throughput.rs: the throughput comparison is not written yet");
}
