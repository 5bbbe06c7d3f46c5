//! Rows claimed ahead of the workers (plain queues of single deliveries): a row that waited on a
//! session the server ended is not delivered on the key it lost, rows that wait behind a worker
//! that does not end go back to other runners, and a claim too long for a statement's list of
//! ids still fills the place of a row settled since its snapshot.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Pool;
use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Running, Table};
use tokio::sync::{Semaphore, mpsc};

use crate::keys;
use crate::statements::claim_waits_for_a_row;
use crate::support::{Ctx, Spec, TestDb, recv};

/// A table of the test's own with an attempt column, a row for each of `payloads` in order.
pub(crate) async fn rows_of<DB: TestDb>(ctx: &mut Ctx<DB>, payloads: &[&str]) -> String {
    let t = ctx
        .table(Spec {
            attempt: true,
            ..Spec::default()
        })
        .await;
    let jobs: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &Table::new(&t), &jobs)
        .await
        .unwrap();
    t
}

/// A transaction that has deleted the first row of `t` and not ended: a claim's statement that
/// comes to the row waits for it.
pub(crate) async fn deleting_the_first<DB: TestDb>(
    ctx: &Ctx<DB>,
    t: &str,
) -> sqlx::Transaction<'static, DB> {
    let mut deleting = ctx.pool.begin().await.unwrap();
    let delete = match DB::LABEL {
        "postgres" => format!("DELETE FROM {t} WHERE id = (SELECT MIN(id) FROM {t})"),
        _ => format!("DELETE FROM {t} ORDER BY id LIMIT 1"),
    };
    DB::exec_on(&mut deleting, &delete).await.unwrap();
    deleting
}

/// A started runner on `pool` with a plain advisory queue of `workers` workers on `t`, its
/// attempts counted, whose handler sends each delivery's `(id, attempt)`, then waits for a
/// permit of `gate` before it acks; and what its handlers send.
pub(crate) async fn gated<DB: TestDb>(
    pool: Pool<DB>,
    t: &str,
    workers: usize,
    gate: &Arc<Semaphore>,
) -> (Running, mpsc::UnboundedReceiver<(i64, u32)>) {
    let (tx, started) = mpsc::unbounded_channel();
    let gate = Arc::clone(gate);
    let queue = Queue::table(Table::new(t))
        .advisory_lock()
        .workers(workers)
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send((d.id(), d.attempt()));
            let gate = Arc::clone(&gate);
            async move {
                gate.acquire().await.expect("never closed").forget();
                Outcome::ack()
            }
        });
    let running = Runner::new(pool)
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    (running, started)
}

/// A runner of one worker claims four rows on one session, one in work and three ahead of it;
/// the server ends that session while the first handler works. None of the three rows that
/// waited is delivered on the key its session lost (another runner could hold it by then): each
/// row's first attempt after the kill is a later claim's, on a session of its own.
pub(crate) async fn rows_claimed_ahead_on_an_ended_session_are_not_delivered<DB: TestDb>() {
    if DB::LABEL == "sqlite" {
        // Keys held in the process: no session to end.
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = rows_of(&mut ctx, &["a", "b", "c", "d"]).await;
    // The first delivery waits for the gate; every later one acks at once.
    let gate = Arc::new(Semaphore::new(0));
    let (runner, mut started) = gated(ctx.pool(4).await, &t, 1, &gate).await;
    let (first, attempt) = recv(&mut started, "the first delivery", 30).await;
    assert_eq!(attempt, 1);
    assert_eq!(
        keys::held(&ctx, &t).await,
        4,
        "one claim took the four rows: one in work, three ahead of the worker"
    );
    assert!(
        keys::end_sessions(&ctx, &t).await > 0,
        "a session held the keys"
    );
    // Past the 2 ms within which a session's last answer vouches for its keys: a clock
    // condition for the rows waiting, not a wait for another task.
    tokio::time::sleep(Duration::from_millis(20)).await;
    gate.add_permits(usize::MAX >> 4);
    ctx.wait_none(&t, "1 = 1", 30).await;
    runner.shutdown().await.unwrap();
    let mut deliveries = vec![(first, attempt)];
    while let Ok(delivery) = started.try_recv() {
        deliveries.push(delivery);
    }
    let on_the_lost_keys: Vec<_> = deliveries[1..]
        .iter()
        .filter(|(_, attempt)| *attempt == 1)
        .collect();
    assert!(
        on_the_lost_keys.is_empty(),
        "rows that waited on the ended session delivered on its keys: {on_the_lost_keys:?} \
         (every delivery: {deliveries:?})"
    );
    let mut ids: Vec<i64> = deliveries.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 4, "every row delivered: {deliveries:?}");
    assert_eq!(keys::held(&ctx, &t).await, 0, "no key left");
    ctx.drop_tables().await;
}

/// Eight workers' first claim wants 32 rows (one for each worker, three ahead of each), more
/// than a statement's list of ids passes over (16). Another transaction deletes the first of 33
/// rows while the claim waits for it: the claim, which took the 32 keys it wanted, takes one
/// more for the deleted row's place from above the largest id it took, so every row is
/// delivered without the queue waiting for its poll (a minute here). PostgreSQL and
/// MySQL/MariaDB; SQLite holds its keys in the process, and no claim waits for a row there.
pub(crate) async fn a_claim_too_long_to_list_fills_a_deleted_rows_place<DB: TestDb>() {
    if DB::LABEL == "sqlite" {
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let payloads: Vec<String> = (0..33).map(|i| format!("job {i}")).collect();
    let payloads: Vec<&str> = payloads.iter().map(String::as_str).collect();
    let t = rows_of(&mut ctx, &payloads).await;
    let deleting = deleting_the_first(&ctx, &t).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&seen);
    let queue = Queue::table(Table::new(&t))
        .advisory_lock()
        .workers(8)
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            recorded.lock().unwrap().push(d.payload().to_vec());
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool(10).await)
        .poll_interval(Duration::from_secs(60))
        .mount(queue)
        .start()
        .await
        .unwrap();
    claim_waits_for_a_row(&ctx, &t).await;
    assert_eq!(
        keys::held(&ctx, &t).await,
        32,
        "the claim took the 32 keys it wanted, the deleted row's among them"
    );
    deleting.commit().await.unwrap();
    ctx.wait_none(&t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_unstable();
    let mut expected: Vec<Vec<u8>> = payloads[1..]
        .iter()
        .map(|p| p.as_bytes().to_vec())
        .collect();
    expected.sort_unstable();
    assert_eq!(seen, expected, "every row but the deleted one, once");
    assert_eq!(keys::held(&ctx, &t).await, 0, "no key left");
    ctx.drop_tables().await;
}

/// A runner of one worker claims four rows, one in work behind a handler that does not end and
/// three ahead of it. The three go back once they have waited too long (their keys released,
/// their attempts uncounted), and another runner delivers each of them on its first attempt;
/// the first runner, its worker slower than it thought, claims none ahead again meanwhile.
pub(crate) async fn rows_claimed_ahead_behind_a_stuck_worker_go_to_another_runner<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = rows_of(&mut ctx, &["a", "b", "c", "d"]).await;
    let stuck = Arc::new(Semaphore::new(0));
    let (first, mut first_started) = gated(ctx.pool(4).await, &t, 1, &stuck).await;
    let (id, attempt) = recv(&mut first_started, "the first runner's delivery", 30).await;
    assert_eq!(attempt, 1);
    let free = Arc::new(Semaphore::new(usize::MAX >> 4));
    let (second, mut second_started) = gated(ctx.pool(4).await, &t, 1, &free).await;
    let mut others = Vec::new();
    for _ in 0..3 {
        others.push(recv(&mut second_started, "the rows given back, delivered", 30).await);
    }
    others.sort_unstable();
    let expected: Vec<(i64, u32)> = (1..=4)
        .map(|n| (id - 1 + n, 1))
        .filter(|(other, _)| *other != id)
        .collect();
    assert_eq!(
        others, expected,
        "the three rows claimed ahead, each on its first attempt"
    );
    stuck.add_permits(1);
    ctx.wait_none(&t, "1 = 1", 30).await;
    first.shutdown().await.unwrap();
    second.shutdown().await.unwrap();
    assert!(
        first_started.try_recv().is_err(),
        "the first runner delivered nothing more"
    );
    assert_eq!(keys::held(&ctx, &t).await, 0, "no key left");
    ctx.drop_tables().await;
}
