//! PostgreSQL bloat: drains with and without a transaction holding `xmin`, per claim form and
//! table fillfactor.

use std::time::Duration;

use sqlx::{AssertSqlSafe, Connection as _, PgConnection, PgPool, Postgres};
use sqlx_queue::{Delivery, Outcome, Queue, Runner, Table};

use crate::drain::{BenchDb, QUEUE, drain, fill, table_name, url};
use crate::{Options, median_best};

/// What one drain measured.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    jobs_per_s: f64,
    updates: i64,
    hot: i64,
    /// The claim index's size after the drain, in pages of 8 KiB.
    index_pages: i64,
}

/// A form, a fillfactor and whether `xmin` is held, and what its drains measured.
type Cell = ((String, u8, bool), Vec<Sample>);

pub(crate) async fn run(options: &Options) {
    let Some(url) = url::<Postgres>() else { return };
    let admin = Postgres::connect(&url, 2).await.expect("a pool");
    let name = table_name();
    let mut cells: Vec<Cell> = Vec::new();
    for form in &options.forms {
        for &fillfactor in &options.fillfactors {
            for xmin in [false, true] {
                cells.push(((form.clone(), fillfactor, xmin), Vec::new()));
            }
        }
    }
    for round in 1..=options.rounds {
        for ((form, fillfactor, xmin), samples) in &mut cells {
            let what = format!(
                "bloat round {round}: {form}, fillfactor {fillfactor}, {}",
                if *xmin { "xmin held" } else { "no xmin held" }
            );
            match one(options, &url, &admin, &name, form, *fillfactor, *xmin).await {
                Ok(sample) => {
                    eprintln!(
                        "{what}: {:.0} jobs/s, {} of {} updates HOT, claim index {} pages",
                        sample.jobs_per_s, sample.hot, sample.updates, sample.index_pages
                    );
                    samples.push(sample);
                }
                Err(e) => eprintln!("{what}: FAILED {e}"),
            }
        }
    }
    report(options, &cells);
    let _ = Postgres::exec(&admin, format!("DROP TABLE IF EXISTS {name}")).await;
}

/// One drain of a fresh table.
async fn one(
    options: &Options,
    url: &str,
    admin: &PgPool,
    name: &str,
    form: &str,
    fillfactor: u8,
    xmin: bool,
) -> Result<Sample, String> {
    fill::<Postgres>(admin, name, fillfactor, options.rows).await?;
    Postgres::exec(admin, format!("VACUUM ANALYZE {name}"))
        .await
        .map_err(|e| format!("vacuum: {e}"))?;
    // A transaction that read the table and stays open: its snapshot holds `xmin` back, so no
    // row version deleted or updated from now on can be removed, by VACUUM or by pruning.
    let mut holder = match xmin {
        false => None,
        true => {
            let mut conn = PgConnection::connect(url)
                .await
                .map_err(|e| e.to_string())?;
            let read =
                format!("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT COUNT(*) FROM {name}");
            sqlx::raw_sql(AssertSqlSafe(read))
                .execute(&mut conn)
                .await
                .map_err(|e| format!("hold xmin: {e}"))?;
            Some(conn)
        }
    };
    let size = u32::try_from(options.workers + 2).expect("a pool size");
    let pool = Postgres::connect(url, size)
        .await
        .map_err(|e| e.to_string())?;
    let table = Table::new(name).group("queue");
    let queue = Queue::table(table).named(QUEUE).attempt("attempt");
    let ack = |_: Delivery<Postgres>| std::future::ready(Outcome::ack());
    let runner = Runner::new(pool.clone());
    let runner = match form {
        "lease" => runner.mount(
            queue
                .lease("locked_until")
                .workers(options.workers)
                .handler(ack),
        ),
        "row_lock" => runner.mount(queue.row_lock().workers(options.workers).handler(ack)),
        other => return Err(format!("unknown form {other}")),
    };
    let drained = drain(&pool, name, runner, options.rows, options.cap, None).await;
    // Closed connections have sent their statistics.
    pool.close().await;
    if let Some(mut conn) = holder.take() {
        let _ = sqlx::raw_sql("ROLLBACK").execute(&mut conn).await;
        let _ = conn.close().await;
    }
    let jobs_per_s = drained?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stat = |column: &str| {
        format!("SELECT {column} FROM pg_stat_user_tables WHERE relid = '{name}'::regclass")
    };
    let read = async |sql: String| {
        Postgres::scalar(admin, sql)
            .await
            .map_err(|e| format!("statistics: {e}"))
    };
    Ok(Sample {
        jobs_per_s,
        updates: read(stat("n_tup_upd")).await?,
        hot: read(stat("n_tup_hot_upd")).await?,
        index_pages: read(format!("SELECT pg_relation_size('{name}_claim') / 8192")).await?,
    })
}

fn report(options: &Options, cells: &[Cell]) {
    println!(
        "PostgreSQL, {} rows, {} workers, {} round(s): jobs/s median (best), and with xmin held \
         ÷ without",
        options.rows, options.workers, options.rounds
    );
    println!(
        "| form | fillfactor | no xmin held | xmin held | ratio | HOT updates (no xmin / xmin) \
         | claim index after, pages (no xmin / xmin) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for pair in cells.chunks(2) {
        let [((form, fillfactor, _), free), (_, held)] = pair else {
            continue;
        };
        let rates = |s: &[Sample]| median_best(&s.iter().map(|s| s.jobs_per_s).collect::<Vec<_>>());
        let (fm, fb) = rates(free);
        let (hm, hb) = rates(held);
        let hot = |s: &[Sample]| {
            let (hot, updates) = s
                .iter()
                .fold((0, 0), |(h, u), s| (h + s.hot, u + s.updates));
            match updates {
                0 => "—".to_owned(),
                _ => format!("{:.0} %", hot as f64 * 100.0 / updates as f64),
            }
        };
        let pages = |s: &[Sample]| s.last().map_or(0, |s| s.index_pages);
        println!(
            "| {form} | {fillfactor} | {fm:.0} ({fb:.0}) | {hm:.0} ({hb:.0}) | {:.2}x ({:.2}x) \
             | {} / {} | {} / {} |",
            hm / fm,
            hb / fb,
            hot(free),
            hot(held),
            pages(free),
            pages(held)
        );
    }
}
