//! The consumer process the tests run.

use std::time::Duration;

use super::example_binary;

/// A consumer process (`examples/consumer.rs`) on `table`, and its standard output.
pub(crate) struct Consumer {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Consumer {
    pub(crate) fn spawn(
        database: &str,
        table: &str,
        form: &str,
        mode: &str,
        extra: &[&str],
    ) -> Self {
        let mut child = tokio::process::Command::new(example_binary("consumer"))
            .args([database, table, form, mode])
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the consumer starts");
        let stdout = child.stdout.take().expect("piped");
        use tokio::io::AsyncBufReadExt as _;
        Consumer {
            child,
            lines: tokio::io::BufReader::new(stdout).lines(),
        }
    }

    /// The next line the consumer prints, failing the test after `secs`.
    pub(crate) async fn line(&mut self, secs: u64) -> String {
        tokio::time::timeout(Duration::from_secs(secs), self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("the consumer printed nothing for {secs} s"))
            .expect("the consumer's output")
            .expect("the consumer exited")
    }

    /// Kills the process with SIGKILL and reaps it.
    pub(crate) async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL");
        self.child
            .wait()
            .await
            .expect("the killed consumer is reaped");
    }
}
