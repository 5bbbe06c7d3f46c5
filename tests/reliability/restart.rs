//! Scenario 2 — Database restart: three runners — lease, row lock, advisory — drain a table each on
//! a dedicated server (`servers.rs`); a third of the way through, the server is stopped, kept down
//! for a few seconds, and started again (a form's handlers past three quarters of its table wait
//! for the stop, so every form has handlers in work across it and rows left after it). The runners
//! must log the failures, back off, reconnect and finish, with no row lost and none settled twice.
//! The server is started again whatever happens to the test.
//!
//! The test runs on one thread, so that the warnings its runners log can be captured (a
//! thread's default `tracing` subscriber) and counted apart from other tests'.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Pool;
use sqlx_queue::Running;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::crash::fill;
use crate::servers::{Dedicated, Restore};
use crate::support::{
    AdvisoryForm, ConnIds, Ctx, Form, Journal, LeaseForm, RowLockForm, Spec, TestDb,
    assert_handled, assert_nothing_held, database_url, journaled, micros_now, ms, overlaps,
    pool_for, report, required, skipped, start_runner, unique, wait_for,
};

const ROWS: usize = 600;
const WORKERS: usize = 4;
const WORK: Duration = Duration::from_millis(20);
const LEASE: Duration = Duration::from_secs(2);
/// How long the server stays down: longer than the runners' acquire timeout, so that their
/// claims fail rather than wait it out.
const DOWN: Duration = Duration::from_secs(3);
const ACQUIRE: Duration = Duration::from_secs(1);
/// Deliveries a form begins before the stop: the handler of any further one waits for the
/// server to be stopped before it works, so that no form can finish its table before the stop
/// and every form has rows to deliver after the restart (CI once saw a form with none: it had
/// finished while another, started late, reached the third of its table).
const BEFORE_STOP: usize = ROWS * 3 / 4;

#[tokio::test(flavor = "current_thread")]
async fn postgres_all_forms() {
    database_restart::<sqlx::Postgres>(Dedicated::Postgres).await;
}

#[tokio::test(flavor = "current_thread")]
async fn mysql_all_forms() {
    database_restart::<sqlx::MySql>(Dedicated::MariaDb).await;
}

/// The `tracing` output of this thread, from `capture` on.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || logs.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// Lines of the crate's warnings and errors that contain `text`.
    fn count(&self, text: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|line| line.contains("sqlx_queue") && line.contains(text))
            .count()
    }
}

/// One form's table and runner.
struct Drain<DB: TestDb> {
    form: &'static str,
    table: String,
    settled: String,
    ids: Vec<i64>,
    journal: Arc<Journal>,
    running: Running,
    pool: Pool<DB>,
}

async fn start_drain<DB: TestDb, F: Form<DB>>(
    ctx: &mut Ctx<DB>,
    stopped: &watch::Receiver<bool>,
) -> Drain<DB> {
    let table = ctx.table(Spec::lease()).await;
    let settled = ctx.settled_ledger(&table).await;
    let ids = fill(ctx, &table, ROWS).await;
    let journal = Arc::new(Journal::held_from(BEFORE_STOP, stopped.clone()));
    let tag = format!("sqlxq-restart-{}", unique());
    let pool = DB::connect_tagged(
        &ctx.url,
        pool_for(WORKERS),
        ACQUIRE,
        &tag,
        ConnIds::default(),
    )
    .await
    .unwrap();
    let running = start_runner(
        &pool,
        journaled::<DB, F>(&table, LEASE, WORKERS, &journal, WORK),
    )
    .await;
    Drain {
        form: F::NAME,
        table,
        settled,
        ids,
        journal,
        running,
        pool,
    }
}

async fn database_restart<DB: TestDb>(server: Dedicated)
where
    RowLockForm: Form<DB>,
{
    let logs = Logs::default();
    let _capture = logs.capture();
    if database_url::<DB>().is_none() {
        return;
    }
    if let Err(why) = server.ensure_up().await {
        assert!(!required(), "the dedicated {server:?} server: {why}");
        skipped(&format!("{server:?} restart"), &why);
        return;
    }
    let mut ctx = Ctx::<DB>::on(server.url()).await;
    let (stop, stopped) = watch::channel(false);
    let drains = vec![
        start_drain::<DB, LeaseForm>(&mut ctx, &stopped).await,
        start_drain::<DB, RowLockForm>(&mut ctx, &stopped).await,
        start_drain::<DB, AdvisoryForm>(&mut ctx, &stopped).await,
    ];
    let started = Instant::now();
    // A third of every table handled, or half of one while every form has begun: a form that
    // started late (a loaded machine) must not let the others finish before the stop, which
    // would leave them no delivery after the restart to check.
    wait_for(
        "a third of every table handled",
        Duration::from_secs(60),
        || async {
            let ended: Vec<usize> = drains.iter().map(|d| d.journal.ended()).collect();
            ended.iter().all(|n| *n >= ROWS / 3)
                || (ended.iter().all(|n| *n > 0) && ended.iter().any(|n| *n >= ROWS / 2))
        },
    )
    .await;

    let restore = Restore::new(server);
    let down_at = micros_now();
    server.stop().await.expect("the dedicated server stops");
    let stopped = micros_now();
    // The handlers held at `BEFORE_STOP` work now: their settlements fail, or wait for the
    // server, and their rows come again after the restart.
    stop.send_replace(true);
    // Rows each form had handled when the server went down (in the message of a form that
    // finished before the stop and so had no delivery after the restart).
    let ended_at_stop: Vec<usize> = drains.iter().map(|d| d.journal.ended()).collect();
    tokio::time::sleep(DOWN).await; // the outage
    server
        .start()
        .await
        .expect("the dedicated server starts again");
    let up_at = micros_now();
    restore.restored();

    for drain in &drains {
        ctx.wait_none(&drain.table, "1 = 1", 120).await;
    }
    let drained = started.elapsed();
    let claim_failures = logs.count("claim failed");
    let warnings = logs.count("WARN") + logs.count("ERROR");

    let mut lines = Vec::new();
    for (i, drain) in drains.into_iter().enumerate() {
        let stats = drain.running.stats();
        drain.running.shutdown().await.unwrap();
        drain.pool.close().await;
        let deliveries = drain.journal.entries();
        assert_handled(&deliveries, &drain.ids);
        ctx.assert_settled_once(&drain.settled, &drain.ids).await;
        // Whatever a handler held was lost at the stop. A stopping server ends its sessions one
        // after another: a session it has not ended yet may claim a row whose holder's session
        // already ended while that handler still works (as a killed session's row in
        // `killed.rs`). Any other overlap breaks the form's promise; the lease form's leases
        // outlive the outage, so it has none at all.
        let twice = overlaps(&deliveries, |_| None);
        let unexplained: Vec<_> = twice
            .iter()
            .filter(|(first, then)| {
                drain.form == "lease" || !(first.start < stopped && down_at <= then.start)
            })
            .collect();
        assert!(
            unexplained.is_empty(),
            "{}: rows in two handlers at once, not across the stop (began {down_at}, ended \
             {stopped}): {unexplained:?}",
            drain.form
        );
        let first_after = deliveries
            .iter()
            .map(|d| d.start)
            .filter(|start| *start >= up_at)
            .min()
            .unwrap_or_else(|| {
                panic!(
                    "{}: no delivery after the restart ({} of {ROWS} rows handled when the \
                     server went down, handled by form: {ended_at_stop:?})",
                    drain.form, ended_at_stop[i]
                )
            });
        match drain.form {
            "lease" => assert_nothing_held::<DB, LeaseForm>(&ctx, &drain.table, None).await,
            "row_lock" => assert_nothing_held::<DB, RowLockForm>(&ctx, &drain.table, None).await,
            _ => {
                assert_nothing_held::<DB, AdvisoryForm>(&ctx, &drain.table, Some(&drain.settled))
                    .await;
            }
        }
        lines.push(format!(
            "{}: first delivery {:.0} ms after the server answered, {} deliveries for {ROWS} \
             rows, {} settlements failed, {} leases lost",
            drain.form,
            ms(first_after - up_at),
            deliveries.len(),
            stats.failed,
            stats.lease_lost,
        ));
    }
    assert!(
        claim_failures >= 1,
        "no claim failure was logged while the server was down"
    );
    // Without a back-off, three queues polling every 20 ms would log hundreds.
    assert!(
        claim_failures <= 45,
        "{claim_failures} claim failures logged: the runners did not back off"
    );
    report(&format!(
        "restart: {}: server stopped in {:.0} ms and kept down {DOWN:?}, back {:.1} s after the \
         stop; {claim_failures} claim failures and {warnings} warnings/errors logged; all \
         {ROWS} rows of each table settled once in {:.1} s; {}",
        DB::LABEL,
        ms(stopped - down_at),
        ms(up_at - down_at) / 1000.0,
        drained.as_secs_f64(),
        lines.join("; ")
    ));
    ctx.drop_tables().await;
}
