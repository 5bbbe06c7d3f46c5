//! Scenario 1 — Process crash: two consumer processes (`examples/consumer.rs`, `ledger` mode) drain
//! 2,000 rows; one of them is killed with SIGKILL three times, each time with deliveries in work,
//! and started again. Each delivery writes its start and end into a ledger table, so the test can
//! tell which deliveries a kill cut short, when their rows were delivered next, and whether two
//! handlers ever held a row at once (a killed process's handlers ended when it died).
//!
//! On SQLite the advisory form keeps its keys in the process, so one consumer runs at a time.

use std::collections::HashMap;
use std::time::Duration;

use sqlx_queue::{Job, Queue};
use tokio::time::Instant;

use crate::support::{
    Consumer, Ctx, Delivered, Form, Spec, TestDb, assert_handled, assert_nothing_held, jobs, ms,
    overlaps, report, spread, wait_for,
};

const ROWS: usize = 2000;
const KILLS: usize = 3;
const WORKERS: &str = "4";
/// Each delivery's work: long enough for a kill to find deliveries in work.
const WORK_MS: u64 = 20;
/// A short lease, so that a killed lease consumer's rows come back within the test.
const LEASE: Duration = Duration::from_secs(1);

every_form!(process_crash);

/// Enqueues `rows` rows on `table` (no runner serving it) and returns their ids.
pub(crate) async fn fill<DB: TestDb>(ctx: &Ctx<DB>, table: &str, rows: usize) -> Vec<i64> {
    enqueue(ctx, table, rows).await;
    let ids = ctx.ids(table, "id").await;
    assert_eq!(ids.len(), rows);
    ids
}

/// Enqueues `rows` rows on `table`, which a runner may be draining meanwhile.
pub(crate) async fn enqueue<DB: TestDb>(ctx: &Ctx<DB>, table: &str, rows: usize) {
    let jobs = jobs(table);
    let payloads: Vec<String> = (0..rows).map(|i| format!("job {i}")).collect();
    let batch: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    let mut enqueued = 0;
    let max_batch = Queue::table(jobs.clone()).max_batch();
    for chunk in batch.chunks(max_batch) {
        enqueued += DB::enqueue_many(&ctx.pool, &jobs, chunk).await.unwrap();
    }
    assert_eq!(enqueued, rows as u64);
}

async fn process_crash<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let settled = ctx.settled_ledger(&t).await;
    let ledger = ctx.deliveries_ledger(&t).await;
    let ids = fill(&ctx, &t, ROWS).await;
    let single = DB::LABEL == "sqlite" && F::NAME == "advisory";
    let mode = format!("ledger:{WORK_MS}");
    let lease = LEASE.as_millis().to_string();
    let args = [mode.as_str(), WORKERS, lease.as_str()];
    let started = Instant::now();
    let steady = if single {
        None
    } else {
        Some(Consumer::start(&ctx.url, &t, F::NAME, &args).await)
    };
    let mut victim = Consumer::start(&ctx.url, &t, F::NAME, &args).await;

    // (pid, when SIGKILL was sent)
    let mut kills: Vec<(i64, i64)> = Vec::new();
    for k in 1..=KILLS {
        let due = (ROWS * k / (KILLS + 1)) as i64;
        let pid = victim.pid;
        let what = format!("{due} deliveries, and deliveries of consumer {pid} in work");
        wait_for(&what, Duration::from_secs(120), || async {
            ctx.count(&ledger, "1 = 1").await >= due
                && ctx
                    .count(&ledger, &format!("pid = {pid} AND ended_us IS NULL"))
                    .await
                    > 0
        })
        .await;
        kills.push((pid, victim.kill().await));
        victim = Consumer::start(&ctx.url, &t, F::NAME, &args).await;
    }
    ctx.wait_none(&t, "1 = 1", 180).await;
    let drained = started.elapsed();
    victim.kill().await;
    if let Some(steady) = steady {
        steady.kill().await;
    }

    let rows = ctx
        .ints(&format!(
            "SELECT job, attempt, pid, started_us, ended_us FROM {ledger}"
        ))
        .await;
    let deliveries: Vec<(Delivered, i64)> = rows
        .iter()
        .map(|r| {
            let delivered = Delivered {
                id: r[0].unwrap(),
                attempt: u32::try_from(r[1].unwrap()).unwrap(),
                start: r[3].unwrap(),
                end: r[4],
            };
            (delivered, r[2].unwrap())
        })
        .collect();
    let killed_at: HashMap<i64, i64> = kills.iter().copied().collect();
    let plain: Vec<Delivered> = deliveries.iter().map(|(d, _)| *d).collect();

    assert_handled(&plain, &ids);
    ctx.assert_settled_once(&settled, &ids).await;
    assert_nothing_held::<DB, F>(&ctx, &t, Some(&settled)).await;
    // A delivery left unended belongs to a killed process; it ended when that process died.
    let pid_of: HashMap<(i64, i64), i64> = deliveries
        .iter()
        .map(|(d, pid)| ((d.id, d.start), *pid))
        .collect();
    let ends_by = |d: &Delivered| killed_at.get(&pid_of[&(d.id, d.start)]).copied();
    let unended: Vec<_> = deliveries
        .iter()
        .filter(|(d, pid)| d.end.is_none() && !killed_at.contains_key(pid))
        .collect();
    assert!(
        unended.is_empty(),
        "deliveries of live consumers never ended: {unended:?}"
    );
    if F::HOLDS {
        let twice = overlaps(&plain, ends_by);
        assert!(twice.is_empty(), "rows in two handlers at once: {twice:?}");
    }

    // Kill → the next delivery of each row a kill cut short.
    let mut back = Vec::new();
    let mut cut_per_kill = Vec::new();
    for (pid, at) in &kills {
        let cut: Vec<&Delivered> = deliveries
            .iter()
            .filter(|(d, p)| p == pid && d.end.is_none())
            .map(|(d, _)| d)
            .collect();
        cut_per_kill.push(cut.len());
        for d in cut {
            let next = plain
                .iter()
                .filter(|n| n.id == d.id && n.start > d.start)
                .min_by_key(|n| n.start)
                .unwrap_or_else(|| panic!("row {} never delivered after the kill", d.id));
            if F::NAME == "row_lock" {
                // The server rolled the claim back: the attempt was not counted.
                assert_eq!(next.attempt, d.attempt, "row {}", d.id);
            } else {
                assert!(
                    next.attempt > d.attempt,
                    "row {}: attempt not counted",
                    d.id
                );
            }
            back.push(ms(next.start - at));
        }
    }
    assert!(
        cut_per_kill.iter().sum::<usize>() > 0,
        "no kill found a delivery in work"
    );
    let (fastest, slowest) = (
        back.iter().copied().fold(f64::MAX, f64::min),
        back.iter().copied().fold(0.0, f64::max),
    );
    if F::NAME == "lease" {
        // Not before the lease ran out (the kill came at most ~WORK_MS after the claim, and
        // 20 ms leaves no extension), nor long after.
        let lease_ms = LEASE.as_millis() as f64;
        assert!(
            fastest >= lease_ms / 2.0,
            "a leased row came back after {fastest} ms"
        );
        assert!(
            slowest < lease_ms + 5000.0,
            "a leased row came back after {slowest} ms"
        );
    } else {
        assert!(slowest < 5000.0, "a held row came back after {slowest} ms");
    }
    let repeats = plain.len() - ROWS;
    report(&format!(
        "crash: {} {}: {ROWS} rows drained in {:.1} s by {} consumer(s) x {WORKERS} workers, \
         {} killed by SIGKILL {KILLS} times (cut short per kill: {cut_per_kill:?}); \
         kill -> next delivery of a cut row: {}{}; {} deliveries ({repeats} repeats), \
         every row settled once",
        DB::LABEL,
        F::NAME,
        drained.as_secs_f64(),
        if single { 1 } else { 2 },
        if single { "the consumer" } else { "one" },
        spread(&mut back),
        if F::NAME == "lease" {
            format!(" (lease {LEASE:?})")
        } else {
            String::new()
        },
        plain.len(),
    ));
    ctx.drop_tables().await;
}
