//! `Runner::start`'s errors name the statement that creates what is missing (a table, a column,
//! a unique index), and running it lets the runner start; the guide's queue-table blocks
//! (`docs/guide/table.md`) create tables a runner starts on, with the columns the generator gives
//! the same declaration.

use std::time::Duration;

use sqlx_queue::{
    Backoff, DeadLetter, Delivery, Enqueued, Error, Job, Outcome, Queue, Runner, Schedule, Table,
};

use sqlx::Pool;

use crate::support::{Ctx, TestDb};
use crate::{create, drop_all, name};

/// The guide's page on the queue table, whose DDL blocks the tests below create.
const TABLE_PAGE: &str = include_str!("../../docs/guide/table.md");

/// Starts the runner `runner` makes until it starts, running the fix each `Error::Schema` names
/// (which its message says); the fixes run, in order. Each start is on a pool of its own, as an
/// application restarted after the fix would have: on SQLite a connection whose statement failed
/// to prepare for want of the unique index may fail so again after the index was created.
async fn start_fixing<DB: TestDb>(
    ctx: &Ctx<DB>,
    runner: impl Fn(Pool<DB>) -> Runner<DB>,
) -> Vec<String> {
    let mut fixes = Vec::new();
    for _ in 0..6 {
        match runner(ctx.pool(4).await).start().await {
            Ok(running) => {
                running.shutdown().await.unwrap();
                return fixes;
            }
            Err(Error::Schema(e)) => {
                let message = e.to_string();
                let fix = e
                    .fix
                    .clone()
                    .unwrap_or_else(|| panic!("no fix named: {message}"));
                assert!(
                    message.contains(&format!("create it with: {fix}")),
                    "{message}"
                );
                run(ctx, &fix).await;
                fixes.push(fix);
            }
            Err(e) => panic!("{e}"),
        }
    }
    panic!("the runner still does not start after {fixes:#?}");
}

/// Runs the statements of `sql`, each ending in `;` at the end of a line.
async fn run<DB: TestDb>(ctx: &Ctx<DB>, sql: &str) {
    for statement in sql.split(";\n") {
        let statement = statement.trim().trim_end_matches(';');
        if !statement.is_empty() {
            ctx.exec(statement).await;
        }
    }
}

fn ack<DB: TestDb>()
-> impl Fn(Delivery<DB>) -> std::future::Ready<Outcome> + Clone + Send + Sync + 'static {
    |_| std::future::ready(Outcome::ack())
}

/// A queue table that does not exist: the error names its `CREATE TABLE` (and claim index).
pub(crate) async fn a_missing_table_is_named_with_its_create_statement<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = name();
    let queue = Queue::table(Table::new(&t).group("queue").processed_at("processed_at"))
        .named("q")
        .lease("locked_until")
        .attempt("attempt");
    let fixes = start_fixing(&ctx, |pool| {
        Runner::new(pool).mount(queue.clone().handler(ack::<DB>()))
    })
    .await;
    assert_eq!(fixes.len(), 1, "{fixes:#?}");
    assert!(
        fixes[0].starts_with("CREATE TABLE IF NOT EXISTS"),
        "{}",
        fixes[0]
    );
    assert!(fixes[0].contains("_claim"), "{}", fixes[0]);
    queue.enqueue(&ctx.pool, Job::new("x")).await.unwrap();
    drop_all(ctx, &[&t]).await;
}

/// A queue table lacking the columns of roles declared since, and a dead-letter table that does
/// not exist: an `ALTER TABLE .. ADD COLUMN` for each column, then the dead table's `CREATE`.
pub(crate) async fn a_missing_column_is_named_with_its_alter_statement<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, dead) = (name(), name());
    let before = Queue::table(Table::new(&t)).lease("locked_until");
    create(&ctx, &before.schema::<DB>().unwrap()).await;
    let queue = Queue::table(Table::new(&t).retry_after("retry_after"))
        .lease("locked_until")
        .attempt("attempt")
        .max_attempts(3)
        .dead_letter(DeadLetter::table(&dead))
        .backoff(Backoff::none());
    let fixes = start_fixing(&ctx, |pool| {
        Runner::new(pool).mount(queue.clone().handler(ack::<DB>()))
    })
    .await;
    assert_eq!(fixes.len(), 3, "{fixes:#?}");
    assert!(
        fixes[0].starts_with("ALTER TABLE") && fixes[0].contains("retry_after"),
        "{fixes:#?}"
    );
    assert!(
        fixes[1].starts_with("ALTER TABLE") && fixes[1].contains("attempt"),
        "{fixes:#?}"
    );
    assert!(
        fixes[2].starts_with("CREATE TABLE IF NOT EXISTS") && fixes[2].contains(&dead),
        "{fixes:#?}"
    );
    drop_all(ctx, &[&t, &dead]).await;
}

/// A schedule's job table with its key column but no unique index, and no schedules
/// table: the start names the schedules table's `CREATE`, and the index's (SQLite at start,
/// PostgreSQL at the first unique enqueue; MySQL/MariaDB cannot tell a missing index).
pub(crate) async fn a_missing_unique_index_is_named_with_its_create_statement<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, schedules) = (name(), name());
    create(
        &ctx,
        &Queue::table(Table::new(&t))
            .lease("l")
            .schema::<DB>()
            .unwrap(),
    )
    .await;
    ctx.exec(&format!("ALTER TABLE {t} ADD COLUMN dedupe {}", DB::TEXT))
        .await;
    let runner = |pool| {
        Runner::new(pool).schedules_table(&schedules).schedule(
            "fix",
            Schedule::every(Duration::from_secs(3600)),
            Table::new(&t).unique_key("dedupe"),
            |_| Job::new("tick"),
        )
    };
    let fixes = start_fixing(&ctx, runner).await;
    // SQLite matches the insert's conflict target to an index when it prepares it, at start.
    let at_start = DB::LABEL == "sqlite";
    assert_eq!(fixes.len(), 1 + usize::from(at_start), "{fixes:#?}");
    assert!(
        fixes[0].starts_with("CREATE TABLE IF NOT EXISTS") && fixes[0].contains(&schedules),
        "{fixes:#?}"
    );
    if at_start {
        assert!(
            fixes[1].starts_with("CREATE UNIQUE INDEX IF NOT EXISTS"),
            "{fixes:#?}"
        );
    }
    // PostgreSQL matches it when the insert runs: the first unique enqueue names the index's
    // fix. MySQL/MariaDB cannot tell.
    let queue = Queue::table(Table::new(&t).unique_key("dedupe")).lease("l");
    let job = Job::new("x").unique("k");
    if DB::LABEL == "postgres" {
        let Err(Error::Schema(e)) = queue.enqueue_unique(&ctx.pool, job.clone()).await else {
            panic!("a unique enqueue without the index");
        };
        let fix = e.fix.clone().unwrap_or_else(|| panic!("no fix named: {e}"));
        assert!(
            fix.starts_with("CREATE UNIQUE INDEX IF NOT EXISTS"),
            "{fix}"
        );
        assert!(
            e.to_string().contains(&format!("create it with: {fix}")),
            "{e}"
        );
        run(&ctx, &fix).await;
    }
    let first = queue.enqueue_unique(&ctx.pool, job.clone()).await.unwrap();
    assert!(matches!(first, Enqueued::New(_)), "{first:?}");
    drop_all(ctx, &[&t, &schedules]).await;
}

/// The guide's block for this database under "The DDL per database" (`docs/guide/table.md`),
/// its statements.
fn guide_block(database: &str) -> Vec<String> {
    let section = &TABLE_PAGE[TABLE_PAGE
        .find("## The DDL per database")
        .expect("the section")..];
    let marker = format!("```sql\n-- {database}");
    let start = section.find(&marker).expect("the database's block") + "```sql\n".len();
    let end = start + section[start..].find("```").expect("the block's end");
    section[start..end]
        .split(';')
        .map(|s| {
            s.lines()
                .filter(|line| !line.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .filter(|s| !s.trim().is_empty())
        .collect()
}

/// The guide's queue table, created from its block for this database: a runner of the
/// guide's declaration starts on it and marks the jobs it acks; the generator gives the same
/// declaration every column the block has.
pub(crate) async fn the_guide_queue_table_blocks_start_a_runner<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let database = match DB::LABEL {
        "postgres" => "PostgreSQL",
        "mysql" => "MySQL",
        _ => "SQLite",
    };
    let t = name();
    let block = guide_block(database);
    assert!(block[0].contains("CREATE TABLE"), "{block:?}");
    for statement in &block {
        ctx.exec(&statement.replace("signup_jobs", &t)).await;
    }
    let table = Table::new(&t)
        .group("queue")
        .retry_after("retry_after")
        .processed_at("processed_at")
        .created_at("created_at");
    let queue = Queue::table(table)
        .named("signups")
        .lease("locked_until")
        .attempt("attempt");
    let generated = queue.schema::<DB>().unwrap();
    for line in block[0].lines().skip(1) {
        let column = line.split_whitespace().next().unwrap_or_default();
        if !column.is_empty() && column != ")" && column != "INDEX" {
            let quoted = match DB::LABEL {
                "postgres" => format!("\"{column}\" "),
                _ => format!("`{column}` "),
            };
            assert!(
                generated.statements()[0].contains(&quoted),
                "{column}: {generated}"
            );
        }
    }
    for n in 0..3 {
        queue
            .enqueue(&ctx.pool, Job::from_vec(vec![n]))
            .await
            .unwrap();
    }
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue.clone().handler(ack::<DB>()))
        .start()
        .await
        .unwrap_or_else(|e| panic!("the guide's {database} table: {e}"));
    ctx.wait_count(&t, "processed_at IS NOT NULL", 3, 20).await;
    running.shutdown().await.unwrap();
    drop_all(ctx, &[&t]).await;
}
