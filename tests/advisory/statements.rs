//! The statements an advisory queue's acks run, as sqlx logs them: on PostgreSQL, the statement
//! that deletes acked rows releases their keys too — one statement per session and flush, not
//! two. MySQL/MariaDB have no lock of a transaction's to hand a key to until the commit: their
//! acks delete, then unlock, both sent in one round trip (two statements in one text, the
//! `DELETE` committing first), and a claim's re-read goes with the count of its attempts.

use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::{Context, SubscriberExt as _};

use crate::ahead::{deleting_the_first, rows_of};
use crate::keys;
use crate::support::{Ctx, Spec, TestDb, report, wait_for};

/// The statements sqlx ran that name a watched table (tests run side by side in this process:
/// each watches its own table).
static WATCHED: Mutex<Vec<(String, Vec<String>)>> = Mutex::new(Vec::new());

/// Records the statements of the watched tables.
struct Statements;

struct Text(String);

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "db.statement" {
            value.clone_into(&mut self.0);
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

impl<S: tracing::Subscriber> Layer<S> for Statements {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut text = Text(String::new());
        event.record(&mut text);
        let mut watched = WATCHED.lock().unwrap();
        for (table, statements) in watched.iter_mut() {
            if text.0.contains(table.as_str()) {
                statements.push(text.0.trim().to_owned());
            }
        }
    }
}

/// Installs the process's subscriber, before any test's `Ctx` would install its own: the log
/// `RUST_LOG` asks for, as the support's, and the statements of the watched tables.
pub(crate) fn install() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let log = tracing_subscriber::fmt::layer()
            .with_test_writer()
            .with_filter(EnvFilter::from_default_env());
        let statements = Statements.with_filter(
            Targets::new().with_target("sqlx::query", tracing::level_filters::LevelFilter::TRACE),
        );
        let subscriber = tracing_subscriber::registry().with(log).with(statements);
        tracing::subscriber::set_global_default(subscriber).expect("the first subscriber");
    });
}

/// Starts recording the statements that name `table` (sqlx's statement events, at any level).
pub(crate) fn watch(table: &str) {
    install();
    WATCHED.lock().unwrap().push((table.to_owned(), Vec::new()));
}

/// The statements recorded for `table` since `watch`, no longer recorded.
pub(crate) fn statements(table: &str) -> Vec<String> {
    let mut watched = WATCHED.lock().unwrap();
    let i = watched
        .iter()
        .position(|(t, _)| t == table)
        .expect("watched");
    watched.swap_remove(i).1
}

/// Eight advisory workers with `handler` drain 200 rows of a table of their own with an attempt
/// column, its statements watched: the context, the table and the statements naming it, or
/// `None` on SQLite, whose keys live in the process (or without the database's server).
async fn drain_watched<DB, H, F>(handler: H) -> Option<(Ctx<DB>, String, Vec<String>)>
where
    DB: TestDb,
    H: Fn(Delivery<DB>) -> F + Send + Sync + Clone + 'static,
    F: Future<Output = Outcome> + Send + 'static,
{
    drain_watched_named(handler, 0).await
}

/// [`drain_watched`] of a table whose name is padded to `len` characters.
async fn drain_watched_named<DB, H, F>(
    handler: H,
    len: usize,
) -> Option<(Ctx<DB>, String, Vec<String>)>
where
    DB: TestDb,
    H: Fn(Delivery<DB>) -> F + Send + Sync + Clone + 'static,
    F: Future<Output = Outcome> + Send + 'static,
{
    if DB::LABEL == "sqlite" {
        return None;
    }
    let mut ctx = Ctx::<DB>::new().await?;
    let spec = Spec {
        attempt: true,
        ..Spec::default()
    };
    let t = ctx.table_padded(spec, len).await;
    let payloads: Vec<String> = (0..200).map(|i| format!("job {i}")).collect();
    let jobs: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &Table::new(&t), &jobs)
        .await
        .unwrap();
    watch(&t);
    let queue = Queue::table(Table::new(&t))
        .advisory_lock()
        .workers(8)
        .attempt("attempt")
        .handler(handler);
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    ctx.wait_none(&t, "1 = 1", 60).await;
    // Every ack settled without an error: one whose key its statement did not release fails.
    wait_for("200 acks counted", Duration::from_secs(10), || async {
        running.stats().acked == 200
    })
    .await;
    assert_eq!(running.stats().failed, 0, "settlements that failed");
    running.shutdown().await.unwrap();
    let statements = statements(&t);
    Some((ctx, t, statements))
}

/// [`drain_watched`] with handlers that ack and record each delivery's `(id, attempt)`: also
/// what they recorded.
async fn drain_recording_attempts<DB: TestDb>()
-> Option<(Ctx<DB>, String, Vec<String>, Vec<(i64, u32)>)> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&seen);
    let handler = move |d: Delivery<DB>| {
        recorded.lock().unwrap().push((d.id(), d.attempt()));
        async { Outcome::ack() }
    };
    let (ctx, t, statements) = drain_watched(handler).await?;
    let seen = seen.lock().unwrap().clone();
    Some((ctx, t, statements, seen))
}

/// Each of the 200 rows was delivered once, at attempt 1.
pub(crate) fn each_once_at_attempt_one(mut seen: Vec<(i64, u32)>) {
    assert!(seen.iter().all(|(_, attempt)| *attempt == 1), "{seen:?}");
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 200, "each row delivered once");
}

/// Eight workers drain 200 rows whose handlers ack: every statement that deletes rows also
/// releases their keys (PostgreSQL: `WITH d AS (DELETE ..) SELECT .. pg_advisory_unlock`, each
/// key held by the statement's transaction until it commits; MySQL/MariaDB: `DELETE ..; SELECT
/// .. RELEASE_LOCK(..)` in one text, one round trip, by the names the client wrote), and no key
/// is left.
pub(crate) async fn acks_release_their_keys_in_the_settling_statement<DB: TestDb>() {
    acks_release_their_keys::<DB>(0, "; SELECT CONCAT(RELEASE_LOCK(").await;
}

/// [`acks_release_their_keys_in_the_settling_statement`] where the lock names are longer than
/// 64 characters (a table name of 60), hashed by the server (MySQL/MariaDB: `sqlxq:` and their
/// MD5), which the client does not write: the release computes them.
pub(crate) async fn acks_release_their_hashed_keys_in_the_settling_statement<DB: TestDb>() {
    acks_release_their_keys::<DB>(60, "; SELECT CAST(d.k").await;
}

/// Drains a table whose name is `len` long (as `drain_watched`), checking that each MySQL ack
/// releases its keys with `release`, and no key is left.
async fn acks_release_their_keys<DB: TestDb>(len: usize, release: &str) {
    let delivered = Arc::new(Mutex::new(0_usize));
    let counted = Arc::clone(&delivered);
    let handler = move |_: Delivery<DB>| {
        *counted.lock().unwrap() += 1;
        async { Outcome::ack() }
    };
    let Some((ctx, t, statements)) = drain_watched_named(handler, len).await else {
        return;
    };
    let deletes: Vec<&String> = statements
        .iter()
        .filter(|s| s.starts_with("DELETE") || s.starts_with("WITH d AS (DELETE"))
        .collect();
    assert!(!deletes.is_empty(), "the acks' statements were recorded");
    let apart: Vec<&&String> = deletes
        .iter()
        .filter(|s| !s.contains("pg_advisory_unlock(") && !s.contains(release))
        .collect();
    assert!(
        apart.is_empty(),
        "acks whose keys are released apart from their rows' DELETE: {apart:?}"
    );
    report(&format!(
        "{}: 200 acks in {} settling statements ({} statements naming the table)",
        DB::LABEL,
        deletes.len(),
        statements.len()
    ));
    assert_eq!(*delivered.lock().unwrap(), 200);
    assert_eq!(keys::held(&ctx, &t).await, 0, "no key left");
    ctx.drop_tables().await;
}

/// Whether `statement` takes keys without reading their rows (PostgreSQL): a claim's refill, or
/// a claim in two statements — not the one that takes keys and rows at once (`sqlxq_taken`).
fn takes_keys_apart(statement: &str) -> bool {
    statement.contains("pg_try_advisory_lock(") && !statement.contains("sqlxq_taken")
}

/// How many times a claim takes more keys for rows settled since its snapshot (the form's
/// `REFILLS`).
const REFILLS: usize = 2;

/// Eight workers drain 200 rows of a table with an attempt column: every claim takes its keys
/// and reads its rows in one statement (`WITH sqlxq_keys AS MATERIALIZED (.. pg_try_advisory_lock
/// ..), sqlxq_taken AS (UPDATE ..)`) — only a refill runs two, at most twice a claim — each row
/// is delivered once at attempt 1, and no key is left. PostgreSQL only.
pub(crate) async fn claims_take_keys_and_rows_in_one_statement<DB: TestDb>() {
    if DB::LABEL != "postgres" {
        return;
    }
    let Some((ctx, t, statements, seen)) = drain_recording_attempts::<DB>().await else {
        return;
    };
    let together = statements
        .iter()
        .filter(|s| s.contains("pg_try_advisory_lock(") && s.contains("sqlxq_taken"))
        .count();
    // A claim's first keys and rows are one statement. A refill — more keys for rows another
    // session settled since that statement's snapshot — runs the two statements on a session
    // that now holds keys: passing over the rows the claim took by their ids (`NOT IN (..)`),
    // or, for a claim of more rows than a statement lists, from above the largest it took (the
    // text of a claim in two statements, told apart only by their count: a claim runs at most
    // `REFILLS` refills).
    let refills = statements.iter().filter(|s| takes_keys_apart(s)).count();
    let rereads = statements
        .iter()
        .filter(|s| s.starts_with("UPDATE") && s.contains("\"attempt\" + 1") && s.contains(" IN ("))
        .count();
    report(&format!(
        "{}: 200 rows in {together} claims of one statement ({refills} refills), {} statements \
         naming the table",
        DB::LABEL,
        statements.len()
    ));
    assert!(
        together > 0,
        "no claim took its keys and rows in one statement"
    );
    assert!(
        refills <= REFILLS * together,
        "{refills} statements took keys apart from their rows, more than {REFILLS} refills \
         for each of the {together} claims of one statement: claims in two statements"
    );
    assert!(
        rereads <= refills,
        "{rereads} rows read apart from their keys, {refills} refills"
    );
    each_once_at_attempt_one(seen);
    assert_eq!(keys::held(&ctx, &t).await, 0, "no key left");
    ctx.drop_tables().await;
}

/// Eight workers drain 200 rows of a table with an attempt column (MySQL/MariaDB): a claim takes
/// its keys, then counts its rows' attempts and reads them in one round trip (`UPDATE ..;
/// SELECT ..`, the values written into the text) — no attempt is counted apart — each row is
/// delivered once at attempt 1, and no key is left.
pub(crate) async fn claims_read_and_count_their_rows_in_one_round_trip<DB: TestDb>() {
    if DB::LABEL != "mysql" {
        return;
    }
    let Some((ctx, t, statements, seen)) = drain_recording_attempts::<DB>().await else {
        return;
    };
    let keys = statements
        .iter()
        .filter(|s| s.contains("GET_LOCK("))
        .count();
    let together = statements
        .iter()
        .filter(|s| {
            s.starts_with("UPDATE") && s.contains("`attempt` + 1") && s.contains("; SELECT")
        })
        .count();
    let apart: Vec<&String> = statements
        .iter()
        .filter(|s| s.starts_with("UPDATE") && s.contains("`attempt` + 1"))
        .filter(|s| !s.contains("; SELECT"))
        .collect();
    report(&format!(
        "{}: 200 rows in {keys} claims, {together} re-reads with their count, {} statements \
         naming the table",
        DB::LABEL,
        statements.len()
    ));
    assert!(
        keys > 0 && together > 0,
        "the claims' statements were recorded"
    );
    assert!(together <= keys, "{together} re-reads for {keys} claims");
    assert!(apart.is_empty(), "attempts counted apart: {apart:?}");
    each_once_at_attempt_one(seen);
    assert_eq!(keys::held(&ctx, &t).await, 0, "no key left");
    ctx.drop_tables().await;
}

/// A queue whose name has quotes, a backslash, a question mark and a non-ASCII letter claims,
/// counts and settles the rows of its group and no other (MySQL/MariaDB write the name into the
/// text of the statements sent together, as hexadecimal): each once, at attempt 1; the other
/// group's rows keep their count, and no key is left.
pub(crate) async fn a_group_name_written_into_the_statements_claims_its_rows_only<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            attempt: true,
            ..Spec::default()
        })
        .await;
    let name = "o'brien \"é\" ?\\ `x`";
    let table = Table::new(&t).group("queue");
    for i in 0..20 {
        let mine = format!("mine {i}");
        DB::enqueue(&ctx.pool, &table, Job::new(&mine).group(name))
            .await
            .unwrap();
        let other = format!("other {i}");
        DB::enqueue(&ctx.pool, &table, Job::new(&other).group("o"))
            .await
            .unwrap();
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&seen);
    let queue = Queue::table(table)
        .named(name)
        .advisory_lock()
        .workers(4)
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            recorded
                .lock()
                .unwrap()
                .push((d.payload().to_vec(), d.attempt()));
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    ctx.wait_none(&t, "payload LIKE 'mine%'", 30).await;
    running.shutdown().await.unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_unstable();
    let mut expected: Vec<(Vec<u8>, u32)> = (0..20)
        .map(|i| (format!("mine {i}").into_bytes(), 1))
        .collect();
    expected.sort_unstable();
    assert_eq!(seen, expected, "the group's rows, each once at attempt 1");
    assert_eq!(
        ctx.count(&t, "attempt = 1").await,
        20,
        "the other group's rows untouched"
    );
    assert_eq!(keys::held(&ctx, &t).await, 0, "no key left");
    ctx.drop_tables().await;
}

/// A row another transaction deletes while a claim's statement waits for it (the claim took
/// its key, then found the row locked) is passed over once that transaction commits — the
/// statement reads the row's latest version — its key released (PostgreSQL: in the same
/// statement); the claim, which took as many keys as it wanted, takes more for the place the row
/// left, passing over the deleted row (`NOT IN (..)`: CI once saw a refill without it, when
/// every row the claim took had been settled since its snapshot); the rows after it are
/// delivered once, and no key is left. PostgreSQL and MySQL/MariaDB, whose claim counts the
/// attempts before it reads the rows again: the count's `UPDATE` waits for the row (before, the
/// read came first, without a lock, and delivered the row). SQLite holds its keys in the process.
pub(crate) async fn a_row_deleted_during_the_claim_is_passed_over_and_its_key_released<
    DB: TestDb,
>() {
    if DB::LABEL == "sqlite" {
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    // The one worker's first claim wants four rows (one for it, three ahead of it): five, so
    // that it takes as many keys as it wanted and one more for the deleted row's place.
    let payloads = ["deleted", "second", "third", "fourth", "fifth"];
    let t = rows_of(&mut ctx, &payloads).await;
    let deleting = deleting_the_first(&ctx, &t).await;
    watch(&t);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&seen);
    let queue = Queue::table(Table::new(&t))
        .advisory_lock()
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            recorded.lock().unwrap().push(d.payload().to_vec());
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    claim_waits_for_a_row(&ctx, &t).await;
    assert_eq!(
        keys::held(&ctx, &t).await,
        4,
        "the claim holds the deleted row's key, and the three after it"
    );
    deleting.commit().await.unwrap();
    ctx.wait_none(&t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    let statements = statements(&t);
    let refills: Vec<&String> = match DB::LABEL {
        "postgres" => statements.iter().filter(|s| takes_keys_apart(s)).collect(),
        // Every claim takes its keys apart there: a refill is one that passes over rows.
        _ => statements
            .iter()
            .filter(|s| s.contains("GET_LOCK(") && s.contains(" NOT IN ("))
            .collect(),
    };
    assert!(
        !refills.is_empty(),
        "the claim took more keys for the deleted row's place"
    );
    assert!(
        refills.iter().all(|s| s.contains(" NOT IN (")),
        "a refill passes over the rows whose keys the claim took: {refills:?}"
    );
    let after: Vec<Vec<u8>> = payloads[1..]
        .iter()
        .map(|p| p.as_bytes().to_vec())
        .collect();
    assert_eq!(*seen.lock().unwrap(), after);
    assert_eq!(keys::held(&ctx, &t).await, 0, "no key left");
    ctx.drop_tables().await;
}

/// Waits until a claim's statement on table `t` waits for a row another transaction holds.
pub(crate) async fn claim_waits_for_a_row<DB: TestDb>(ctx: &Ctx<DB>, t: &str) {
    let waiting = match DB::LABEL {
        "postgres" => format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE '%{t}%' AND pid <> pg_backend_pid()"
        ),
        // The claim's count, found by its text: MariaDB 10.11's INNODB_TRX did not list the
        // waiting transaction of the runner's connection.
        _ => format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE \
             info LIKE 'UPDATE `{t}` SET%'"
        ),
    };
    wait_for(
        "the claim to wait for the deleted row",
        Duration::from_secs(10),
        || async { DB::count(&ctx.pool, &waiting).await.unwrap() > 0 },
    )
    .await;
}
