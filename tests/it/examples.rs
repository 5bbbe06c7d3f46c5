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

#[test]
fn transactional_discards_the_first_attempts_writes_and_commits_the_second() {
    let out = run_example("transactional");
    let lines: Vec<&str> = out.lines().collect();
    let expected = [
        "after the signup was queued: signup_jobs=1 accounts=0 welcome_jobs=0",
        "after attempt 1 wrote, uncommitted: signup_jobs=1 accounts=0 welcome_jobs=0",
        "attempt 1: the CRM times out: retry",
        "after the retry rolled them back: signup_jobs=1 accounts=0 welcome_jobs=0",
        "after attempt 2 wrote, uncommitted: signup_jobs=1 accounts=0 welcome_jobs=0",
        "attempt 2: the CRM answers: ack",
        "after the ack committed them with the settlement: signup_jobs=0 accounts=1 welcome_jobs=1",
    ];
    assert_eq!(lines, expected, "{out}");
}

#[test]
fn unique_debounces_replaces_and_never_queues_a_welcome_email_twice() {
    let out = run_example("unique");
    let lines: Vec<&str> = out.lines().collect();
    let expected = [
        "edit 1: index refresh queued",
        "edit 2: index refresh pushed later",
        "edit 3: index refresh pushed later",
        "report for 2026-10: queued",
        "report for 2026-11: replaced",
        "signup of ann@example.com: welcome email queued",
        "signup of ann@example.com: welcome email already queued",
        "queued: refresh:42 = refresh account 42",
        "queued: report:monthly = 2026-11",
        "queued: welcome:ann@example.com = ann@example.com",
    ];
    assert_eq!(lines, expected, "{out}");
}

#[test]
fn metrics_renders_every_counter_and_gauge_of_the_drain_as_prometheus_text() {
    let out = run_example("metrics");
    let queue = r#"queue="emails""#;
    for line in [
        format!("sqlx_queue_deliveries_started_total{{{queue}}} 14"),
        format!(r#"sqlx_queue_deliveries_total{{{queue},outcome="ack"}} 9"#),
        format!(r#"sqlx_queue_deliveries_total{{{queue},outcome="retry"}} 4"#),
        format!(r#"sqlx_queue_deliveries_total{{{queue},outcome="dead_letter"}} 1"#),
        format!(r#"sqlx_queue_deliveries_total{{{queue},outcome="drop"}} 0"#),
        format!("sqlx_queue_panics_total{{{queue}}} 0"),
        format!("sqlx_queue_lease_lost_total{{{queue}}} 0"),
        format!("sqlx_queue_handler_duration_seconds_count{{{queue}}} 14"),
        format!("sqlx_queue_settlement_duration_seconds_count{{{queue}}} 14"),
        format!("sqlx_queue_pickup_latency_seconds_count{{{queue}}} 10"),
        format!("sqlx_queue_deliveries_in_work{{{queue}}} 0"),
        format!("sqlx_queue_workers_free{{{queue}}} 2"),
        format!("sqlx_queue_ready_jobs{{{queue}}} 0"),
        format!("sqlx_queue_oldest_ready_age_seconds{{{queue}}} 0"),
        "# TYPE sqlx_queue_deliveries_total counter".to_owned(),
    ] {
        assert!(out.lines().any(|l| l == line), "{line} in:\n{out}");
    }
}
