//! FIFO groups across two runners, one of them a consumer process SIGKILLed mid-way: on the
//! lease form its rows in work return when their lease expires, on the row lock form when the
//! server ends its sessions.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};

use crate::support::{Consumer, Ctx, Form, Spec, TestDb, TestRow, wait_for};

const GROUPS: [&str; 3] = ["g0", "g1", "g2"];
const ROWS: usize = 300;
const WORKERS: usize = 8;
/// The killed process's lease: its rows in work return this long after the kill.
const LEASE_MS: u64 = 1500;

fn micros_now() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(since.as_micros()).unwrap()
}

/// One delivery: its row, its group, when it started and ended (`None`: killed in work), and
/// whether the killed process ran it.
#[derive(Debug, Clone, Copy)]
struct Run {
    id: i64,
    group: usize,
    start: i64,
    end: Option<i64>,
    killed: bool,
}

pub(crate) async fn fifo_groups_stay_in_order_across_runners_and_a_killed_one<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let ledger = format!("{t}_deliveries");
    ctx.exec(&format!(
        "CREATE TABLE {ledger} (job BIGINT NOT NULL, attempt BIGINT NOT NULL, \
         pid BIGINT NOT NULL, started_us BIGINT NOT NULL, ended_us BIGINT)"
    ))
    .await;
    let table = Table::new(&t).group("queue").retry_after("retry_after");
    // Interleaved, so that id order within a group is not table order.
    let jobs: Vec<Job<'_>> = (0..ROWS)
        .map(|i| Job::new(GROUPS[i % 3]).group(GROUPS[i % 3]))
        .collect();
    DB::enqueue_many(&ctx.pool, &table, &jobs).await.unwrap();
    let group_of: HashMap<i64, usize> =
        DB::rows(&ctx.pool, &format!("SELECT id, queue FROM {t}"), &[])
            .await
            .unwrap()
            .iter()
            .map(|row| {
                let group = row.text("queue").unwrap();
                let at = GROUPS.iter().position(|g| *g == group).unwrap();
                (row.int("id").unwrap(), at)
            })
            .collect();

    // The runner to kill: a process of its own, 8 workers, each delivery 100 ms (long, so that
    // the kill finds deliveries in work), written in the ledger table with this host's clock.
    let url = ctx.url.clone().expect("a database URL or file");
    let mut killed = Consumer::spawn(
        &url,
        &t,
        if F::NAME == "lease" {
            "lease_per_group:1"
        } else {
            "row_lock_fifo"
        },
        "ledger:100",
        &[&WORKERS.to_string(), &LEASE_MS.to_string()],
    );
    assert_eq!(killed.line(30).await, "running");

    // The runner that stays, in this process, on its own pool.
    let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
    let recorded = Arc::clone(&runs);
    let groups = group_of.clone();
    let queue = F::apply(Queue::table(table.clone()))
        .fifo()
        .workers(WORKERS)
        .handler(move |d: Delivery<DB>| {
            let (id, runs) = (d.id(), Arc::clone(&recorded));
            let group = groups[&id];
            async move {
                let start = micros_now();
                tokio::time::sleep(Duration::from_millis(5)).await;
                let end = Some(micros_now());
                runs.lock().unwrap().push(Run {
                    id,
                    group,
                    start,
                    end,
                    killed: false,
                });
                Outcome::ack()
            }
        });
    let pool = ctx.pool(u32::try_from(WORKERS).unwrap() + 2).await;
    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(20))
        .mount(queue)
        .start()
        .await
        .unwrap();

    // SIGKILL while the process has deliveries in work, once it has done a share of the rows.
    // A delivery that started within the last 30 ms of its 100 has most of its time left, so
    // the kill lands while it is in work.
    wait_for(
        "the process to finish 10 rows and have one just started",
        Duration::from_secs(60),
        || async {
            let fresh = format!(
                "ended_us IS NULL AND started_us > {}",
                micros_now() - 30_000
            );
            ctx.count(&ledger, "ended_us IS NOT NULL").await >= 10
                && ctx.count(&ledger, &fresh).await > 0
        },
    )
    .await;
    // Before the signal: the server frees what the killed process held only after it died, so
    // a delivery of those rows by the other runner starts after this instant (taken after the
    // kill, it came late by however long reaping the child took, and such a delivery seemed to
    // start before the kill).
    let killed_at = micros_now();
    killed.kill().await;

    ctx.wait_none(&t, "1 = 1", 120).await;
    running.shutdown().await.unwrap();
    pool.close().await;

    let mut all = runs.lock().unwrap().clone();
    let from_process = DB::rows(
        &ctx.pool,
        &format!("SELECT job, started_us, COALESCE(ended_us, -1) AS ended FROM {ledger}"),
        &[],
    )
    .await
    .unwrap();
    let mut unfinished = 0;
    for row in &from_process {
        let id = row.int("job").unwrap();
        let end = row.int("ended").unwrap();
        unfinished += usize::from(end < 0);
        all.push(Run {
            id,
            group: group_of[&id],
            start: row.int("started_us").unwrap(),
            end: (end >= 0).then_some(end),
            killed: true,
        });
    }
    assert!(
        from_process.len() >= 10 && unfinished > 0,
        "the killed process handled {} rows, {unfinished} in work at the kill",
        from_process.len()
    );
    check_groups(all, killed_at);
    ctx.exec(&format!("DROP TABLE {ledger}")).await;
    ctx.drop_tables().await;
}

/// Per group, by start time: ids strictly increase (but a row of the killed process, which may
/// start again: killed in work, or after its handler ended but before its settlement), and each
/// delivery starts after the one before it ended (a killed one ended at the kill).
fn check_groups(mut all: Vec<Run>, killed_at: i64) {
    all.sort_by_key(|run| run.start);
    let mut finished = vec![HashSet::new(); GROUPS.len()];
    for (group, name) in GROUPS.iter().enumerate() {
        let mut previous: Option<Run> = None;
        for run in all.iter().filter(|run| run.group == group) {
            if let Some(before) = previous {
                let again = before.killed && before.id == run.id;
                assert!(
                    run.id > before.id || again,
                    "group {name}: row {} started after row {}",
                    run.id,
                    before.id
                );
                let ended = before.end.unwrap_or(killed_at);
                assert!(
                    run.start >= ended,
                    "group {name}: row {} started {} µs before row {} ended",
                    run.id,
                    ended - run.start,
                    before.id
                );
            }
            if run.end.is_some() {
                finished[group].insert(run.id);
            }
            previous = Some(*run);
        }
    }
    let finished: Vec<usize> = finished.iter().map(HashSet::len).collect();
    assert_eq!(finished, [ROWS / 3; 3], "every row finished");
}
