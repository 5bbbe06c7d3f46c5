//! The runner: the small executor that claims rows, runs handlers and settles deliveries.

mod acks;
mod batch;
mod claim;
mod dead_table;
mod deliver;
mod launch;
#[cfg(feature = "postgres")]
pub(crate) mod notify;
mod quarantine;
pub(crate) mod schema;
pub(crate) mod wake;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::Pool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::error::Result;
use crate::form::Clock;
use crate::queue::Queue;
use crate::queue::config::Form;
use crate::queue::state::{
    AttemptState, BatchState, CapComplete, ClaimForm, FormOn, HasHandler, Mode,
};
pub(crate) use launch::Launch;
pub(crate) use launch::QueueRuntime;

/// How often an idle queue looks for rows when nothing wakes it (default).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// How often a running runner measures its offset to the server's clock again.
const CLOCK_INTERVAL: Duration = Duration::from_secs(60);

/// How long [`Running::shutdown`] waits for handlers in work before cancelling them (default).
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

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
    queues: Vec<Box<dyn Launch<DB>>>,
    poll_interval: Duration,
    shutdown_timeout: Duration,
}

impl<DB: Backend> Runner<DB> {
    /// A runner on `pool`, with no queue yet.
    pub fn new(pool: Pool<DB>) -> Self {
        Runner {
            pool,
            queues: Vec::new(),
            poll_interval: DEFAULT_POLL_INTERVAL,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
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

    /// Mounts a queue. The queue must have one claim form the database has, a handler taking
    /// this database's deliveries, and a dead letter if it has `max_attempts`; anything else
    /// does not compile.
    pub fn mount<F, A, C, M, B, H>(mut self, queue: Queue<F, A, C, M, B, H>) -> Self
    where
        F: ClaimForm + FormOn<DB>,
        A: AttemptState,
        C: CapComplete,
        M: Mode,
        B: BatchState,
        H: HasHandler<DB, M>,
    {
        let (config, handler) = queue.into_parts();
        self.queues.push(handler.into_launch(config));
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
    /// [`Error::Schema`], [`Error::Declaration`] (a declaration this version cannot run),
    /// [`Error::Identifier`] (a name that cannot be quoted), [`Error::ServerTooOld`], or
    /// [`Error::Database`] when the database cannot be reached.
    ///
    /// [`Error::Schema`]: crate::Error::Schema
    /// [`Error::Declaration`]: crate::Error::Declaration
    /// [`Error::Identifier`]: crate::Error::Identifier
    /// [`Error::ServerTooOld`]: crate::Error::ServerTooOld
    /// [`Error::Database`]: crate::Error::Database
    pub async fn start(self) -> Result<Running> {
        let configs: Vec<_> = self.queues.iter().map(|launch| launch.config()).collect();
        schema::check_together(&self.pool, &configs)?;
        let clock = Clock::default();
        let server = schema::measure_clock(&self.pool, &clock).await?;
        let stop = CancellationToken::new();
        let abort = CancellationToken::new();
        let stats = Arc::new(Counters::default());
        let mut prepared = Vec::with_capacity(self.queues.len());
        let mut identities = Vec::with_capacity(self.queues.len());
        for launch in self.queues {
            let (form, identity) =
                schema::prepare(&self.pool, launch.config(), clock.clone(), server).await?;
            prepared.push((launch, form));
            identities.push(identity);
        }
        let advisory: Vec<(&str, &schema::Identity)> = prepared
            .iter()
            .zip(&identities)
            .filter(|((launch, _), _)| matches!(launch.config().form, Form::Advisory))
            .map(|((launch, _), identity)| (launch.config().label(), identity))
            .collect();
        if DB::DIALECT == crate::dialect::Dialect::Postgres {
            schema::check_classes(&advisory)?;
        }
        let mut channels: Vec<(String, String)> = prepared
            .iter()
            .zip(&identities)
            .filter(|((launch, _), _)| launch.config().listen_notify)
            .filter_map(|((launch, _), identity)| {
                let channel = identity.channel.clone()?;
                Some((channel, launch.config().table.name.clone()))
            })
            .collect();
        channels.sort();
        channels.dedup();
        let listener = if channels.is_empty() {
            None
        } else {
            DB::listen(&self.pool, channels, stop.clone()).await?
        };
        let tasks: Vec<_> = prepared
            .into_iter()
            .map(|(launch, form)| {
                let runtime = QueueRuntime::new(
                    self.pool.clone(),
                    launch.config(),
                    form,
                    self.poll_interval,
                    server,
                    stop.clone(),
                    abort.clone(),
                    Arc::clone(&stats),
                );
                launch.spawn(runtime)
            })
            .collect();
        let clock_task = server.own_clock.then(|| {
            let (pool, stop) = (self.pool.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = tokio::time::sleep(CLOCK_INTERVAL) => {}
                        () = stop.cancelled() => return,
                    }
                    if let Err(error) = schema::measure_clock(&pool, &clock).await {
                        tracing::debug!(%error, "could not measure the server's clock");
                    }
                }
            })
        });
        Ok(Running {
            background: clock_task.into_iter().chain(listener).collect(),
            stop,
            abort,
            tasks,
            stats,
            shutdown_timeout: self.shutdown_timeout,
        })
    }
}

impl<DB: Backend> fmt::Debug for Runner<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("queues", &self.queues.len())
            .field("poll_interval", &self.poll_interval)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .finish_non_exhaustive()
    }
}

/// Started queues. [`shutdown`](Running::shutdown) stops them and waits; dropping this without
/// it stops claiming, and lets deliveries in work finish in the background.
#[must_use = "dropping `Running` stops its queues; call `shutdown().await` to wait for them"]
pub struct Running {
    /// The clock's measurements and the notification listener.
    background: Vec<JoinHandle<()>>,
    stop: CancellationToken,
    abort: CancellationToken,
    tasks: Vec<JoinHandle<QueueReport>>,
    stats: Arc<Counters>,
    shutdown_timeout: Duration,
}

impl Running {
    /// Counts of what the runner has done so far, over all its queues.
    pub fn stats(&self) -> Stats {
        self.stats.snapshot()
    }

    /// Stops claiming, lets the deliveries in work finish and settle (cancelling those still
    /// running after the runner's `shutdown_timeout`, whose rows are released unsettled), and
    /// releases rows claimed but not started. No lease or lock is left behind.
    ///
    /// It returns at most `shutdown_timeout` plus two seconds after it is called, whatever the
    /// handlers are blocked on: a cancelled delivery's connection is closed rather than rolled
    /// back on (a statement of its handler's may still run there), and each statement that
    /// returns its row (a lease extension in flight, the release, ending its server session)
    /// gets one second. A row whose release could not be confirmed is counted in
    /// [`ShutdownReport::unreleased`].
    ///
    /// # Errors
    ///
    /// None today; the `Result` leaves room for failures to report.
    pub async fn shutdown(mut self) -> Result<ShutdownReport> {
        let mut report = ShutdownReport {
            in_work: self.stats.in_work.load(Ordering::Relaxed),
            ..ShutdownReport::default()
        };
        self.stop.cancel();
        let tasks = std::mem::take(&mut self.tasks);
        let abort = self.abort.clone();
        let timeout = self.shutdown_timeout;
        let deadline = tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            abort.cancel();
        });
        for task in tasks {
            let queue = match task.await {
                Ok(queue) => queue,
                Err(error) => {
                    // A queue task that panicked has nothing left to release.
                    tracing::error!(%error, "a queue's task failed");
                    continue;
                }
            };
            report.cancelled += queue.cancelled;
            report.released += queue.released;
            report.unreleased += queue.unreleased;
            report.keys_released += queue.keys_released;
        }
        deadline.abort();
        Ok(report)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
        for task in &self.background {
            task.abort();
        }
    }
}

impl fmt::Debug for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running")
            .field("queues", &self.tasks.len())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// What [`Running::shutdown`] found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Deliveries in work when `shutdown` was called (finished and settled, unless cancelled).
    pub in_work: u64,
    /// Handlers cancelled at the shutdown timeout.
    pub cancelled: u64,
    /// Rows released unsettled: claimed but not started, or cancelled.
    pub released: u64,
    /// Rows of cancelled handlers whose release could not be confirmed within the grace after
    /// the timeout (a release blocked by another session's lock, a database that stopped
    /// answering): each returns when its lease expires, or when the server ends its connection.
    pub unreleased: u64,
    /// Advisory keys released by the deliveries in work when shutdown began (settled or
    /// cancelled): every key the runner held.
    pub keys_released: u64,
}

/// What one queue's task reports when it ends.
#[derive(Debug, Default)]
pub struct QueueReport {
    pub(crate) cancelled: u64,
    pub(crate) released: u64,
    pub(crate) unreleased: u64,
    pub(crate) keys_released: u64,
}

/// Counts of what a runner has done, from [`Running::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Rows claimed.
    pub claimed: u64,
    /// Deliveries settled by ack.
    pub acked: u64,
    /// Deliveries settled by drop.
    pub dropped: u64,
    /// Deliveries returned to the queue (retry and retry_after).
    pub retried: u64,
    /// Rows moved to their dead letter.
    pub dead_lettered: u64,
    /// Settlements that found their lease taken by a later claim.
    pub lease_lost: u64,
    /// Settlements that failed for another reason (the row is delivered again later).
    pub failed: u64,
    /// Handlers that panicked (their deliveries are retried).
    pub panicked: u64,
    /// Rows released unsettled (shutdown, cancellation).
    pub released: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Deliveries in work now (a gauge).
    pub(crate) in_work: AtomicU64,
    pub(crate) claimed: AtomicU64,
    pub(crate) acked: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) lease_lost: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) panicked: AtomicU64,
    pub(crate) released: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            claimed: get(&self.claimed),
            acked: get(&self.acked),
            dropped: get(&self.dropped),
            retried: get(&self.retried),
            dead_lettered: get(&self.dead_lettered),
            lease_lost: get(&self.lease_lost),
            failed: get(&self.failed),
            panicked: get(&self.panicked),
            released: get(&self.released),
        }
    }
}
