//! The consumer process (`examples/consumer.rs`) the crash and soak scenarios start and kill.

use std::time::Duration;

use super::common::example_binary;
use super::micros_now;

/// A consumer process (`examples/consumer.rs`), started and running.
pub(crate) struct Consumer {
    child: tokio::process::Child,
    pub(crate) pid: i64,
}

impl Consumer {
    /// Starts a consumer and waits (at most 30 s) until its runner has started. Its output is
    /// read in the background from then on, so it never blocks on a full pipe.
    pub(crate) async fn start(database: &str, table: &str, form: &str, args: &[&str]) -> Self {
        use tokio::io::AsyncBufReadExt as _;
        let mut child = tokio::process::Command::new(example_binary("consumer"))
            .args([database, table, form])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the consumer starts");
        let pid = i64::from(child.id().expect("a running child"));
        let stdout = child.stdout.take().expect("piped");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("consumer {pid} did not start within 30 s"))
            .expect("the consumer's output");
        assert_eq!(
            first.as_deref(),
            Some("running"),
            "consumer {pid} failed to start"
        );
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Consumer { child, pid }
    }

    /// Kills the process with SIGKILL and reaps it; returns when the signal was sent (µs since
    /// the epoch): the process ran no handler after it.
    pub(crate) async fn kill(mut self) -> i64 {
        let sent = micros_now();
        self.child.start_kill().expect("SIGKILL");
        self.child
            .wait()
            .await
            .expect("the killed consumer is reaped");
        sent
    }
}
