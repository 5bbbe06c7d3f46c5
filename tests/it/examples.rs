//! The examples run as a user runs them, and do what they print.

use std::process::Command;

/// Runs `target/<profile>/examples/<name>` (built by `cargo test`) and returns its output.
fn run_example(name: &str) -> String {
    let binary = crate::support::example_binary(name);
    let output = Command::new(&binary)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (cargo test builds the examples)", binary.display()));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{name} failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn quickstart_retries_one_email_and_empties_its_queue() {
    let out = run_example("quickstart");
    assert!(out.contains("enqueued 3 emails"), "{out}");
    assert!(
        out.contains("sending to bob@example.com timed out on attempt 1"),
        "{out}"
    );
    assert!(
        out.contains("sent to bob@example.com on attempt 2"),
        "{out}"
    );
    assert!(
        out.contains("done: 3 acked, 1 retried, queue empty"),
        "{out}"
    );
}
