//! `examples/traceparent.rs` runs as a user runs it: the handler's span is in the trace of the
//! request that enqueued its job (here rather than in `tests/it/examples.rs`, so that it needs no
//! build of the `it` binary).

use std::process::Command;

#[test]
fn traceparent_carries_the_request_trace_into_the_handler() {
    let binary = crate::support::example_binary("traceparent");
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
    let trace = |prefix: &str| {
        let line = stdout
            .lines()
            .find(|line| line.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in\n{stdout}"));
        line.rsplit(' ').next().unwrap_or_default().to_owned()
    };
    let request = trace("request:");
    let handler = trace("handler:");
    assert_eq!(request.len(), 32, "a trace id: {request}");
    assert_ne!(request, "0".repeat(32));
    assert_eq!(handler, request, "{stdout}");
    assert!(
        stdout.contains(&format!("traceparent \"00-{request}-")),
        "the job carried the request's traceparent: {stdout}"
    );
}
