//! What the two integration test crates share: `tests/it` and `tests/reliability` each include
//! this module in their `support` (`#[path = "../../common/mod.rs"] mod common;`) and re-export
//! its items from there. It holds the databases' common calls and tables (`databases`), the claim
//! forms as types (`forms`), and the helpers below: names, the databases' URLs, the waits, notices
//! and the example binaries; `pooler` connects through PgBouncer.
//!
//! Each crate compiles its own copy, and uses most but not all of it: what only one of them uses
//! says so with an `allow(dead_code)`.

pub(crate) mod databases;
pub(crate) mod forms;
#[allow(
    dead_code,
    reason = "the cancel and rate binaries test through the pooler; tests/it has its own"
)]
pub(crate) mod pooler;

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use databases::Db;

/// A name no other test (in this run or an earlier one) uses.
pub(crate) fn unique() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{}_{n}_{nanos:x}", std::process::id())
}

/// Whether `SQLX_QUEUE_REQUIRE_ALL=1` requires every database (a database whose URL is not set
/// then fails its tests instead of skipping them).
pub(crate) fn required() -> bool {
    std::env::var("SQLX_QUEUE_REQUIRE_ALL").as_deref() == Ok("1")
}

/// The URL of `DB`'s server, or (SQLite) a fresh file `<file>-<unique>.db` in the temporary
/// directory; `Err` with the name of the server's variable when it is not set and not required.
/// Installs the `tracing` subscriber first: `RUST_LOG=sqlx_queue=debug cargo test ..` shows the
/// runner's logs of failing tests.
#[allow(
    dead_code,
    reason = "`it` reads the variable of the server its test runs on"
)]
pub(crate) fn database_url<DB: Db>(file: &str) -> Result<String, &'static str> {
    database_url_in(DB::URL_VAR, file)
}

/// [`database_url`] read from `var` (`None`: SQLite), for a test that runs on another server
/// of its database than its own variable names.
pub(crate) fn database_url_in(
    var: Option<&'static str>,
    file: &str,
) -> Result<String, &'static str> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    match var {
        None => Ok(std::env::temp_dir()
            .join(format!("{file}-{}.db", unique()))
            .display()
            .to_string()),
        Some(var) => match std::env::var(var) {
            Ok(url) => Ok(url),
            Err(_) if required() => {
                panic!("{var} is not set, and SQLX_QUEUE_REQUIRE_ALL=1 requires every database")
            }
            Err(_) => Err(var),
        },
    }
}

/// Writes `line` once per process to its stderr. Written there directly: the test harness
/// captures `eprintln!` of passing tests, and a notice (a skipped database) must be seen.
pub(crate) fn note_once(line: String) {
    use std::io::Write as _;
    static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.contains(&line) {
        let _ = writeln!(std::io::stderr(), "{line}");
        said.push(line);
    }
}

/// Prints a measured figure where `cargo test` shows it (the harness captures `eprintln!`).
pub(crate) fn report(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "measured: {line}");
}

/// Polls `check` every 10 ms until it holds, failing the test with `what` after `timeout`.
pub(crate) async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Receives from `rx`, failing the test with `what` after `secs`.
pub(crate) async fn recv<T>(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>,
    what: &str,
    secs: u64,
) -> T {
    tokio::time::timeout(Duration::from_secs(secs), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("timed out after {secs} s waiting for {what}"))
        .unwrap_or_else(|| panic!("the channel closed while waiting for {what}"))
}

/// The path of an example's binary, which `cargo test` builds with the tests.
pub(crate) fn example_binary(name: &str) -> std::path::PathBuf {
    let deps = std::env::current_exe().expect("the test binary's path");
    let profile = deps
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let binary = profile.join("examples").join(name);
    assert!(
        binary.exists(),
        "{} is missing: `cargo test` builds the examples (or run `cargo build --example {name}`)",
        binary.display()
    );
    binary
}
