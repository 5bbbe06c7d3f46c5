//! The runner: the small executor that claims rows, runs handlers and settles deliveries.
//!
//! One delivery reads top to bottom: [`claim`] (a claim loop takes rows through its queue's
//! [`Form`](crate::form::Form)) → [`deliver`] (lend, call the handler while [`keeper`] keeps its
//! hold, take back) → [`policy`] (the outcome) → the form's settlement. Batches go [`batch`] →
//! [`policy`] → the form's batch settlement.

mod acks;
mod ahead;
mod batch;
mod by_key;
mod cancel;
mod claim;
mod deliver;
mod keeper;
mod launch;
mod notify;
mod observe;
mod policy;
mod quarantine;
mod queue;
mod rate;
mod requests;
mod running;
mod schedule;
mod schema;
mod server;
mod stats;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::Pool;
use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Clock};
use crate::config::{FormKind, QueueConfig};
use crate::error::{Error, Result};
use crate::form::{self, Identity};
use crate::handler::Mount;
use crate::table::Pooler;
use launch::Launch;
use queue::Shared;
pub use running::Running;
use schedule::DEFAULT_SCHEDULES_TABLE;
pub use schedule::{Missed, Schedule};
use schedule::{Scheduled, Started};
use stats::Counters;
pub use stats::{ShutdownReport, Stats};

/// How often an idle queue looks for rows when nothing wakes it (default).
pub(crate) const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// How often a running runner measures its offset to the server's clock again.
const CLOCK_INTERVAL: Duration = Duration::from_secs(60);

/// How long [`Running::shutdown`] waits for handlers in work before cancelling them (default).
pub(crate) const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs mounted queues on a pool: claims rows, runs their handlers, settles each delivery.
///
/// # Examples
///
/// ```no_run
/// # async fn run(pool: sqlx::SqlitePool) -> sqlx_queue::Result<()> {
/// use sqlx::Sqlite;
/// use sqlx_queue::{Delivery, Outcome, Queue, Runner, Table};
///
/// async fn send(d: Delivery<Sqlite>) -> Outcome {
///     println!("sending {:?}", d.payload());
///     Outcome::ack()
/// }
///
/// let queue = Queue::table(Table::new("email_jobs")).lease("locked_until").handler(send);
/// let running = Runner::new(pool).mount(queue).start().await?;
/// // ...
/// running.shutdown().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a runner does nothing until it is started"]
pub struct Runner<DB: Backend> {
    pool: Pool<DB>,
    queues: Vec<(QueueConfig, Box<dyn Launch<DB>>)>,
    /// The first declaration that cannot work, found when its queue was mounted.
    refused: Option<Error>,
    poll_interval: Duration,
    shutdown_timeout: Duration,
    pooler: Pooler,
    schedules: Vec<Scheduled>,
    schedules_table: String,
    /// How often each queue's depth and oldest ready job's age are read into gauges.
    #[cfg(feature = "metrics")]
    gauges: Option<Duration>,
}

impl<DB: Backend> Runner<DB> {
    /// A runner on `pool`, with no queue yet.
    pub fn new(pool: Pool<DB>) -> Self {
        Runner {
            pool,
            queues: Vec::new(),
            refused: None,
            poll_interval: DEFAULT_POLL_INTERVAL,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            pooler: Pooler::None,
            schedules: Vec::new(),
            schedules_table: DEFAULT_SCHEDULES_TABLE.to_owned(),
            #[cfg(feature = "metrics")]
            gauges: None,
        }
    }

    /// How often an idle queue looks for rows (default 1 s). An enqueue through this crate in
    /// the same process wakes its queue at once; polling finds rows inserted elsewhere.
    ///
    /// # Panics
    ///
    /// `interval` is zero.
    #[track_caller]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        assert!(!interval.is_zero(), "poll_interval must be more than zero");
        self.poll_interval = interval;
        self
    }

    /// How long [`Running::shutdown`] lets handlers in work finish (default 30 s). Handlers
    /// still running then are cancelled: their deliveries are released unsettled, as a crash
    /// would leave them, but without waiting for a lease to expire.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Mounts a queue: a [`Queue`](crate::Queue) with one claim form the database has, a
    /// handler taking this database's deliveries, and a dead letter if it has `max_attempts`;
    /// anything else does not compile. A declaration that cannot work on this database (say
    /// `.listen_notify()` off PostgreSQL, or a custom statement that is two) is found here and
    /// refused by [`start`](Runner::start).
    pub fn mount(mut self, queue: impl Mount<DB>) -> Self {
        let (config, handler) = queue.into_parts();
        if self.refused.is_none() {
            let checked = config.check(DB::DIALECT);
            self.refused = checked
                .and_then(|()| form::custom_statements(DB::DIALECT, &config))
                .err();
        }
        let launch = launch::launch(&config.form, handler);
        self.queues.push((config, launch));
        self
    }

    /// Checks every mounted queue against the database, then starts them.
    ///
    /// The check renders and prepares every statement once and reads the table's columns: a
    /// missing table or column, or a column of the wrong type, is an [`Error::Schema`] naming
    /// it. Nothing is claimed unless every queue passes.
    ///
    /// # Errors
    ///
    /// [`Error::Schema`], [`Error::Declaration`] (a declaration that cannot work),
    /// [`Error::Unsupported`] (a declaration this database does not support),
    /// [`Error::PoolTooSmall`], [`Error::Identifier`] (a name that cannot be quoted),
    /// [`Error::ServerTooOld`], or [`Error::Database`] when the database cannot be reached.
    /// [`Error::Unsupported`] also names a form the server's engine cannot hold a row with
    /// (TiDB: the row lock and lease forms; CockroachDB and YugabyteDB: the advisory lock
    /// form), and what needs one server session behind [`Pooler::Transaction`].
    pub async fn start(mut self) -> Result<Running> {
        if let Some(error) = self.refused {
            return Err(error);
        }
        check_pool(&self.pool, &self.queues)?;
        // Apart from their launches, which hold the handlers (`Send`, not `Sync`): the future
        // of `start` holds no reference to a launch across an await, so that it is `Send`.
        let (configs, launches): (Vec<QueueConfig>, Vec<Box<dyn Launch<DB>>>) =
            std::mem::take(&mut self.queues).into_iter().unzip();
        let schedules = self.schedules.iter().map(|s| (s.label(), s.table()));
        self.pooler = server::one_pooler(&configs, schedules)?;
        server::one_form_per_table(&configs)?;
        for config in &configs {
            server::check_pooler(DB::DIALECT, config)?;
        }
        let clock = Clock::default();
        let server = form::measure_server(&self.pool, &clock).await?;
        for config in &configs {
            server::check_engine(server.engine, config)?;
            requests::check(&self.pool, config).await?;
            if !config.backoff.is_none() && config.table.retry_after.is_none() {
                tracing::warn!(
                    queue = config.label(),
                    "table `{}` has no retry_after column: failed deliveries return at once, \
                     without the queue's backoff (declare `Table::retry_after(..)`)",
                    config.table.name
                );
            }
        }
        let ticks = self.check_schedules().await?;
        let mut ready = Vec::with_capacity(configs.len());
        for (config, launch) in configs.into_iter().zip(launches) {
            let (identity, spawn) = launch
                .prepare(&self.pool, &config, clock.clone(), server)
                .await?;
            ready.push((config, identity, spawn));
        }
        let advisory: Vec<(&str, &Identity)> = ready
            .iter()
            .filter(|(config, _, _)| config.form == FormKind::Advisory)
            .map(|(config, identity, _)| (config.label(), identity))
            .collect();
        if DB::DIALECT == crate::table::Dialect::Postgres {
            check_classes(&advisory)?;
        }

        let shared = Shared {
            pool: self.pool.clone(),
            poll_interval: self.poll_interval,
            stop: CancellationToken::new(),
            abort: CancellationToken::new(),
            stats: Arc::new(Counters::default()),
            clock: clock.clone(),
            #[cfg(feature = "metrics")]
            gauges: self.gauges,
        };
        let schedules = boxed(Started::start(self.schedules, ticks, &shared, &clock)).await?;
        let mut background = Vec::new();
        let mut channels: Vec<(String, String)> = ready
            .iter()
            // Cancel requests are notified on the table's channel too (none behind a pooler in
            // transaction mode: the runner reads them at its poll interval).
            .filter(|(config, _, _)| {
                config.listen_notify
                    || (config.table.cancel_requests.is_some()
                        && config.table.pooler != Pooler::Transaction)
            })
            .filter_map(|(config, identity, _)| {
                Some((identity.channel.clone()?, config.table.name.clone()))
            })
            .collect();
        channels.sort();
        channels.dedup();
        if !channels.is_empty() {
            let names = channels
                .iter()
                .map(|(channel, _)| channel.clone())
                .collect();
            if let Some(listener) = DB::listen(&self.pool, names).await? {
                let stop = shared.stop.clone();
                background.push(tokio::spawn(notify::relay(listener, channels, stop)));
            }
        }
        let tasks = ready
            .into_iter()
            .map(|(config, _, spawn)| spawn.spawn(&config, shared.clone()))
            .collect();
        if server.own_clock {
            let (pool, stop) = (self.pool.clone(), shared.stop.clone());
            background.push(tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = tokio::time::sleep(CLOCK_INTERVAL) => {}
                        () = stop.cancelled() => return,
                    }
                    if let Err(error) = form::measure_server(&pool, &clock).await {
                        tracing::debug!(%error, "could not measure the server's clock");
                    }
                }
            }));
        }
        Ok(Running {
            background,
            stop: shared.stop,
            abort: shared.abort,
            stats: shared.stats,
            tasks,
            schedules,
            shutdown_timeout: self.shutdown_timeout,
        })
    }
}

/// `future`, boxed: the schedules' start, awaited in [`Runner::start`], so that its future is
/// `Send` for every lifetime of what it borrows (unboxed, it is not seen `Send` in general:
/// rust-lang/rust#100013; `tests/send.rs` fails without it).
fn boxed<'a, T>(future: impl Future<Output = T> + Send + 'a) -> BoxFuture<'a, T> {
    Box::pin(future)
}

/// Refuses a pool too small for the mounted queues: the forms that hold a pooled connection per
/// delivery in work, and transactional queues, need one per worker, and the runner one more for
/// claims and settlements.
fn check_pool<DB: Backend, L>(pool: &Pool<DB>, queues: &[(QueueConfig, L)]) -> Result<()> {
    let holding: Vec<&QueueConfig> = queues
        .iter()
        .map(|(config, _)| config)
        .filter(|config| config.holds_connections())
        .collect();
    let held: usize = holding.iter().map(|config| config.workers).sum();
    let max = pool.options().get_max_connections();
    let held = u32::try_from(held).unwrap_or(u32::MAX);
    if held > 0 && held.saturating_add(1) > max {
        let queues: Vec<&str> = holding.iter().map(|config| config.label()).collect();
        return Err(Error::PoolTooSmall {
            queues: queues.join(", "),
            held,
            needed: held + 1,
            max,
        });
    }
    Ok(())
}

/// Refuses advisory queues on two tables whose PostgreSQL key classes collide (`queues`: each
/// advisory queue's label and table identity).
fn check_classes(queues: &[(&str, &Identity)]) -> Result<()> {
    let mut classes: Vec<(u32, &str, &str)> = queues
        .iter()
        .map(|(label, identity)| {
            let class = form::advisory::fnv1a_32(&identity.key);
            (class, identity.key.as_str(), *label)
        })
        .collect();
    classes.sort_unstable();
    classes.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    match classes.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        Some(pair) => Err(Error::declaration(
            pair[1].2,
            format!(
                "the advisory keys of tables `{}` and `{}` share a class; rename one",
                pair[0].1, pair[1].1
            ),
        )),
        None => Ok(()),
    }
}

impl<DB: Backend> fmt::Debug for Runner<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("queues", &self.queues.len())
            .field("poll_interval", &self.poll_interval)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("pooler", &self.pooler)
            .finish_non_exhaustive()
    }
}
