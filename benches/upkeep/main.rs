//! Upkeep: what a queue's long life costs it, measured on drains of a backlog; and what a unique
//! key costs an enqueue.
//!
//! - **bloat** (PostgreSQL): drains a backlog of `--rows` (default 100,000) by a `Runner` of
//!   `--workers` (default 8) workers, with and without a transaction that holds `xmin` for the
//!   whole drain (a `REPEATABLE READ` transaction that read the table, kept open on a connection
//!   of its own), for each claim form (`--form lease,row_lock`) and table `fillfactor`
//!   (`--fillfactor 100,80`); the pair with and without runs back to back, `--rounds` times
//!   (default 3). It reports jobs per second (median and best), their ratio, the lease updates
//!   that were HOT (`pg_stat_user_tables.n_tup_hot_upd` over `n_tup_upd`) and the claim index's
//!   size after the drain.
//! - **cost** (PostgreSQL, SQLite): the price of the `metrics` feature. Drains `--rows` (default
//!   20,000) by a lease queue of `--workers` workers acking at once, alternately without a recorder
//!   on a table that declares no `created_at` (**plain**) and with `metrics-exporter-prometheus`'s
//!   recorder and `created_at` declared (**recorded**: every counter, histogram and gauge
//!   recorded, the claim reading the creation time), `--rounds` times (default 5), A B then B A;
//!   the ratio is the median of each round's own ratio, and best ÷ best. `--sides
//!   plain` or `--sides recorded` runs one side only (for a build without the feature);
//!   `--sides plain,created,metered,recorded` splits the price: `created` reads the creation time
//!   without a recorder, `metered` records without reading it.
//! - **unique** (PostgreSQL, MySQL/MariaDB, SQLite): the price of a unique key column on
//!   enqueue. `--rows` jobs (default 5,000) enqueued one at a time (**single**), then ten times
//!   as many in batches of `--batch` (default 100, **bulk**), from `--workers` tasks at once,
//!   into a fresh table of the drains' schema (`drain.rs`) without a unique column (**plain**: `enqueue`,
//!   `enqueue_many`) and with a `dedupe` column, its unique index and a fresh key per job
//!   (**unique**: `enqueue_unique`, `enqueue_many_unique`), the two sides alternating (A B, then
//!   B A) for `--rounds` rounds (default 5). It reports jobs per second (median and best) and
//!   the ratio unique ÷ plain (the median of each round's ratio, and best ÷ best).
//! - **guards** (PostgreSQL, MySQL/MariaDB, SQLite): the price of FIFO groups, `per_group(4)` and
//!   a rate limit (1,000,000 a second: the limiter's own cost). Drains `--rows` (default 4,000)
//!   in `--groups` groups (default 16) by an unnamed queue of `--workers` workers acking at once,
//!   of each `--form` (lease: none, fifo, per_group4, rate; row lock, not on SQLite: none, fifo,
//!   rate), the guards alternating within each of `--rounds` rounds (default 5). It reports jobs
//!   per second (median and best) and the ratio to the same queue without a guard (the median
//!   of each round's ratio, and best ÷ best). `--guards none,fifo` runs those only.
//!
//! ```sh
//! export SQLX_QUEUE_PG_URL=postgres://postgres@127.0.0.1:5432/test
//! cargo bench --bench upkeep -- bloat
//! cargo bench --bench upkeep -- bloat --rows 20000 --rounds 1 --form lease --fillfactor 100
//! cargo bench --bench upkeep -- cost --db postgres,sqlite
//! export SQLX_QUEUE_MYSQL_URL=mysql://root@127.0.0.1:3306/test
//! cargo bench --bench upkeep -- unique --db postgres,mysql,sqlite
//! cargo bench --bench upkeep -- guards --db postgres,mysql,sqlite
//! ```
//!
//! Each drain of bloat and cost is timed from the runner's start to its last settlement, and
//! checked: every row acked once (the runner's counts), the table empty; each enqueue of unique
//! from its first statement to its tasks' last, and checked: every unique job new, as many rows
//! as jobs, as many keys as rows. Tables are named `bench_upkeep_<pid>` and dropped at the end. Progress goes to standard error, the results to standard output.

mod bloat;
mod cost;
mod drain;
mod guards;
mod unique;

use std::time::Duration;

/// The options of both benches.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) rows: usize,
    pub(crate) rounds: usize,
    pub(crate) workers: usize,
    /// Jobs per `enqueue_many` of the unique bench.
    pub(crate) batch: usize,
    /// Groups the guards bench's jobs are spread over.
    pub(crate) groups: usize,
    /// The guards bench's guards (empty: every one).
    pub(crate) guards: Vec<String>,
    pub(crate) forms: Vec<String>,
    pub(crate) fillfactors: Vec<u8>,
    pub(crate) dbs: Vec<String>,
    pub(crate) sides: Vec<String>,
    /// A drain still running after this long fails.
    pub(crate) cap: Duration,
}

impl Options {
    fn parse(bench: &str, args: &[String]) -> Self {
        let bloat = bench == "bloat";
        let unique = bench == "unique";
        let guards = bench == "guards";
        let mut options = Options {
            rows: match bench {
                "bloat" => 100_000,
                "unique" => 5_000,
                "guards" => 4_000,
                _ => 20_000,
            },
            rounds: if bloat { 3 } else { 5 },
            workers: 8,
            batch: 100,
            groups: 16,
            guards: Vec::new(),
            forms: vec!["lease".into(), "row_lock".into()],
            fillfactors: vec![100, 80],
            dbs: if unique || guards {
                vec!["postgres".into(), "mysql".into(), "sqlite".into()]
            } else {
                vec!["postgres".into(), "sqlite".into()]
            },
            sides: vec!["plain".into(), "recorded".into()],
            cap: Duration::from_secs(if guards { 120 } else { 600 }),
        };
        let list = |value: &str| -> Vec<String> { value.split(',').map(str::to_owned).collect() };
        let mut i = 0;
        while i < args.len() {
            let value = args.get(i + 1).map(String::as_str).unwrap_or("");
            match args[i].as_str() {
                "--rows" => options.rows = value.parse().expect("--rows N"),
                "--rounds" => options.rounds = value.parse().expect("--rounds N"),
                "--workers" => options.workers = value.parse().expect("--workers N"),
                "--batch" => options.batch = value.parse().expect("--batch N"),
                "--groups" => options.groups = value.parse().expect("--groups N"),
                "--guards" => options.guards = list(value),
                "--form" => options.forms = list(value),
                "--fillfactor" => {
                    options.fillfactors = list(value)
                        .iter()
                        .map(|f| f.parse().expect("--fillfactor 10..100"))
                        .collect();
                }
                "--db" => options.dbs = list(value),
                "--sides" => options.sides = list(value),
                "--cap-secs" => {
                    options.cap = Duration::from_secs(value.parse().expect("--cap-secs N"));
                }
                // cargo bench passes `--bench`.
                "--bench" => {
                    i += 1;
                    continue;
                }
                other => panic!("unknown option {other}"),
            }
            i += 2;
        }
        options
    }
}

/// The median and the best of `samples`.
pub(crate) fn median_best(samples: &[f64]) -> (f64, f64) {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    };
    (median, sorted.last().copied().unwrap_or(f64::NAN))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bench = args
        .iter()
        .find(|a| !a.starts_with("--") && a.as_str() != "upkeep")
        .cloned()
        .unwrap_or_else(|| "bloat".to_owned());
    let rest: Vec<String> = args.into_iter().filter(|a| *a != bench).collect();
    let options = Options::parse(&bench, &rest);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        match bench.as_str() {
            "bloat" => bloat::run(&options).await,
            "cost" => cost::run(&options).await,
            "unique" => unique::run(&options).await,
            "guards" => guards::run(&options).await,
            other => panic!("unknown bench {other}: bloat, cost, unique or guards"),
        }
    });
}
