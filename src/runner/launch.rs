//! Where the typestate ends: a mounted queue becomes a plain configuration, a prepared form and
//! a handler, and its task is spawned monomorphised over the handler's type (no boxed futures).

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::Pool;
use tokio::sync::{Notify, mpsc};

use super::acks::Ack;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Counters, QueueReport, claim, wake};
use crate::backend::Backend;
use crate::delivery::{Delivery, IntoOutcome, Outcome, Settle};
use crate::form::FormRuntime;
use crate::form::held::Conns;
use crate::queue::config::QueueConfig;
use crate::queue::state::{BatchHandler, Handler, HasHandler, Mode, Plain};

/// A mounted queue, ready to be checked and spawned. Sealed: only this crate implements it.
pub trait Launch<DB: Backend>: Send + 'static {
    #[doc(hidden)]
    fn config(&self) -> &QueueConfig;

    #[doc(hidden)]
    fn spawn(self: Box<Self>, runtime: QueueRuntime<DB>) -> JoinHandle<QueueReport>;
}

/// Everything a running queue's tasks share.
#[derive(Debug)]
pub struct QueueRuntime<DB: Backend> {
    pub(crate) conns: Conns<DB>,
    pub(crate) label: Arc<str>,
    pub(crate) group: Option<Arc<str>>,
    pub(crate) workers: usize,
    pub(crate) max_attempts: Option<u32>,
    /// `SELECT *` of a row by id, for row mode handlers.
    pub(crate) row_sql: Option<crate::dialect::Stmt>,
    /// What begins a transactional delivery's transaction (lease and advisory forms).
    pub(crate) tx_begin: Option<&'static str>,
    /// A transactional SQLite queue: its handlers' transactions hold the write lock, so a lease
    /// extension in flight when a handler ends is not awaited (it waits for that very lock; once
    /// the settlement committed, its token guard makes it change nothing).
    pub(crate) abandon_extension: bool,
    pub(crate) form: FormRuntime,
    pub(crate) wake: Arc<Notify>,
    /// Woken by this queue's own settlements that make a row claimable again (a retry, a FIFO
    /// group's head settled, a short `retry_after` come due): the claim loop looks at once, with
    /// no rechecks (the settlement has committed).
    pub(crate) settled: Arc<Notify>,
    /// FIFO groups: any settlement lets the next row of its group go.
    pub(crate) fifo: bool,
    /// Rows held back after a failure of their own.
    pub(crate) quarantine: super::quarantine::Quarantine,
    pub(crate) poll_interval: Duration,
    pub(crate) stop: CancellationToken,
    pub(crate) abort: CancellationToken,
    pub(crate) stats: Arc<Counters>,
    /// Deliveries of this queue cancelled at the shutdown timeout.
    pub(crate) cancelled: AtomicU64,
    /// Of those, the ones whose row was released (the lease was still theirs).
    pub(crate) cancelled_released: AtomicU64,
    /// Of those, the ones whose release could not be confirmed in time.
    pub(crate) cancelled_unreleased: AtomicU64,
    /// Advisory keys released by deliveries that ended after the runner began to stop.
    pub(crate) unlocked_after_stop: AtomicU64,
    /// Where plain lease deliveries send their acknowledgements, batched (see `acks`).
    pub(crate) acks: Option<mpsc::UnboundedSender<Ack>>,
    /// The batcher's end of that channel, until the queue's task starts it.
    acks_rx: std::sync::Mutex<Option<mpsc::UnboundedReceiver<Ack>>>,
}

impl<DB: Backend> QueueRuntime<DB> {
    #[expect(
        clippy::too_many_arguments,
        reason = "the runner's inside is rebuilt in layers next (issue 13)"
    )]
    pub(crate) fn new(
        pool: Pool<DB>,
        config: &QueueConfig,
        form: FormRuntime,
        poll_interval: Duration,
        server: super::schema::Server,
        stop: CancellationToken,
        abort: CancellationToken,
        stats: Arc<Counters>,
    ) -> Self {
        let batched = matches!(form, FormRuntime::Lease(_)) && !config.transactional;
        let (acks, acks_rx) = if batched {
            let (acks, acks_rx) = mpsc::unbounded_channel();
            (Some(acks), Some(acks_rx))
        } else {
            (None, None)
        };
        // Connections kept between uses: the claim's and the acknowledgements' in the lease
        // form, every worker's where each delivery holds one.
        let holds = config.transactional || !matches!(form, FormRuntime::Lease(_));
        let keep = if holds { config.workers + 1 } else { 2 };
        QueueRuntime {
            conns: Conns::new(pool, keep),
            label: config.label().into(),
            group: config.name.as_deref().map(Into::into),
            workers: config.workers,
            max_attempts: config.max_attempts,
            row_sql: crate::dialect::Names::of_queue(DB::DIALECT, config)
                .ok()
                .map(|names| crate::dialect::row_by_id(&names)),
            tx_begin: DB::DIALECT.begin_delivery(
                config.isolation,
                config.sqlite_mode,
                server.checks_connection,
            ),
            abandon_extension: config.transactional
                && DB::DIALECT == crate::dialect::Dialect::Sqlite,
            form,
            wake: wake::register(&config.table.name, config.name.as_deref()),
            settled: Arc::new(Notify::new()),
            fifo: config.fifo,
            quarantine: Default::default(),
            poll_interval,
            stop,
            abort,
            stats,
            cancelled: AtomicU64::new(0),
            cancelled_released: AtomicU64::new(0),
            cancelled_unreleased: AtomicU64::new(0),
            unlocked_after_stop: AtomicU64::new(0),
            acks,
            acks_rx: std::sync::Mutex::new(acks_rx),
        }
    }
}

impl<DB: Backend> QueueRuntime<DB> {
    /// Starts the queue's acknowledgement batcher, if it has one.
    pub(crate) fn start_acks(self: &Arc<Self>) {
        let rx = self
            .acks_rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(rx) = rx {
            tokio::spawn(super::acks::run(Arc::downgrade(self), rx));
        }
    }

    /// Wakes the claim loop when a settlement by `outcome` makes a row claimable again: at once
    /// for a retry (and any settlement of a FIFO queue, whose group's next row may go), when it
    /// is due for a `retry_after` shorter than the poll.
    pub(crate) fn settled(&self, outcome: Outcome) {
        match outcome.0 {
            Settle::Retry => self.settled.notify_one(),
            Settle::RetryAfter(delay) if delay.is_zero() => self.settled.notify_one(),
            Settle::RetryAfter(delay) if delay < self.poll_interval => {
                let settled = Arc::clone(&self.settled);
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    settled.notify_one();
                });
            }
            _ if self.fifo => self.settled.notify_one(),
            _ => {}
        }
    }

    /// Counts an advisory key released once the runner began to stop.
    pub(crate) fn note_unlock(&self) {
        if self.stop.is_cancelled() && matches!(self.form, FormRuntime::Advisory(_)) {
            self.unlocked_after_stop.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Calls a handler of single deliveries.
pub(crate) trait CallHandler<DB: Backend, M: Mode>: Send + Sync + 'static {
    /// Whether the handler takes the whole row (row mode): the runner reads it and passes it.
    const ROW: bool = false;

    fn call(
        &self,
        delivery: Delivery<DB, M>,
        row: Option<DB::Row>,
    ) -> impl Future<Output = Outcome> + Send + 'static;
}

impl<DB, M, F, Fut> CallHandler<DB, M> for Handler<DB, F>
where
    DB: Backend,
    M: Mode,
    F: Fn(Delivery<DB, M>) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoOutcome,
{
    fn call(
        &self,
        delivery: Delivery<DB, M>,
        _: Option<DB::Row>,
    ) -> impl Future<Output = Outcome> + Send + 'static {
        let future = (self.f)(delivery);
        async move { future.await.into_outcome() }
    }
}

#[cfg(feature = "json")]
impl<DB, M, T, F, Fut> CallHandler<DB, M> for crate::queue::state::JsonHandler<DB, T, F>
where
    DB: Backend,
    M: Mode,
    T: serde::de::DeserializeOwned + Send + 'static,
    F: Fn(T, Delivery<DB, M>) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoOutcome,
{
    fn call(
        &self,
        delivery: Delivery<DB, M>,
        _: Option<DB::Row>,
    ) -> impl Future<Output = Outcome> + Send + 'static {
        let decoded = serde_json::from_slice::<T>(delivery.payload());
        call_decoded(
            decoded,
            "the payload is not the handler's JSON type",
            |value| (self.f)(value, delivery),
        )
    }
}

#[cfg(feature = "json")]
impl<DB, M, T, F, Fut> HasHandler<DB, M> for crate::queue::state::JsonHandler<DB, T, F>
where
    DB: Backend,
    M: Mode,
    T: serde::de::DeserializeOwned + Send + 'static,
    F: Fn(T, Delivery<DB, M>) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoOutcome,
{
    fn into_launch(self, config: QueueConfig) -> Box<dyn Launch<DB>> {
        Box::new(Mounted {
            config,
            handler: self,
            types: PhantomData::<fn() -> (DB, M)>,
        })
    }
}

/// Calls a decoding handler with its decoded value; a value that did not decode never reaches
/// it: logged as `what`, the delivery is settled as undecodable (the decode policy).
fn call_decoded<T, E, Fut>(
    decoded: Result<T, E>,
    what: &'static str,
    call: impl FnOnce(T) -> Fut,
) -> impl Future<Output = Outcome> + Send + 'static
where
    E: std::fmt::Display,
    Fut: Future + Send + 'static,
    Fut::Output: IntoOutcome,
{
    let future = match decoded {
        Ok(value) => Some(call(value)),
        Err(error) => {
            tracing::error!(%error, "{what}");
            None
        }
    };
    async move {
        match future {
            Some(future) => future.await.into_outcome(),
            None => Outcome(crate::delivery::Settle::Undecodable),
        }
    }
}

impl<DB, M, T, F, Fut> CallHandler<DB, M> for crate::queue::state::RowHandler<DB, T, F>
where
    DB: Backend,
    M: Mode,
    T: for<'r> sqlx::FromRow<'r, DB::Row> + Send + 'static,
    F: Fn(T, Delivery<DB, M>) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoOutcome,
{
    const ROW: bool = true;

    fn call(
        &self,
        delivery: Delivery<DB, M>,
        row: Option<DB::Row>,
    ) -> impl Future<Output = Outcome> + Send + 'static {
        let decoded = match &row {
            Some(row) => T::from_row(row),
            None => Err(sqlx::Error::RowNotFound),
        };
        call_decoded(
            decoded,
            "the row is not the handler's FromRow type",
            |value| (self.f)(value, delivery),
        )
    }
}

impl<DB, M, T, F, Fut> HasHandler<DB, M> for crate::queue::state::RowHandler<DB, T, F>
where
    DB: Backend,
    M: Mode,
    T: for<'r> sqlx::FromRow<'r, DB::Row> + Send + 'static,
    F: Fn(T, Delivery<DB, M>) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoOutcome,
{
    fn into_launch(self, config: QueueConfig) -> Box<dyn Launch<DB>> {
        Box::new(Mounted {
            config,
            handler: self,
            types: PhantomData::<fn() -> (DB, M)>,
        })
    }
}

struct Mounted<DB, M, H> {
    config: QueueConfig,
    handler: H,
    types: PhantomData<fn() -> (DB, M)>,
}

impl<DB, M, H> Launch<DB> for Mounted<DB, M, H>
where
    DB: Backend,
    M: Mode,
    H: CallHandler<DB, M>,
{
    fn config(&self) -> &QueueConfig {
        &self.config
    }

    fn spawn(self: Box<Self>, runtime: QueueRuntime<DB>) -> JoinHandle<QueueReport> {
        let runtime = Arc::new(runtime);
        runtime.start_acks();
        tokio::spawn(claim::run::<DB, M, H>(runtime, Arc::new(self.handler)))
    }
}

impl<DB, M, F, Fut> HasHandler<DB, M> for Handler<DB, F>
where
    DB: Backend,
    M: Mode,
    F: Fn(Delivery<DB, M>) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoOutcome,
{
    fn into_launch(self, config: QueueConfig) -> Box<dyn Launch<DB>> {
        Box::new(Mounted {
            config,
            handler: self,
            types: PhantomData::<fn() -> (DB, M)>,
        })
    }
}

/// Calls a handler of batches.
pub(crate) trait CallBatch<DB: Backend>: Send + Sync + 'static {
    fn call(
        &self,
        deliveries: Vec<Delivery<DB>>,
    ) -> impl Future<Output = Vec<Outcome>> + Send + 'static;
}

impl<DB, F, Fut> CallBatch<DB> for BatchHandler<DB, F>
where
    DB: Backend,
    F: Fn(Vec<Delivery<DB>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<Outcome>> + Send + 'static,
{
    fn call(
        &self,
        deliveries: Vec<Delivery<DB>>,
    ) -> impl Future<Output = Vec<Outcome>> + Send + 'static {
        (self.f)(deliveries)
    }
}

/// A batch queue, mounted.
struct MountedBatch<DB, H> {
    config: QueueConfig,
    handler: H,
    db: PhantomData<fn() -> DB>,
}

impl<DB: Backend, H: CallBatch<DB>> Launch<DB> for MountedBatch<DB, H> {
    fn config(&self) -> &QueueConfig {
        &self.config
    }

    fn spawn(self: Box<Self>, runtime: QueueRuntime<DB>) -> JoinHandle<QueueReport> {
        let size = self.config.batch.unwrap_or(1);
        let runtime = Arc::new(runtime);
        runtime.start_acks();
        tokio::spawn(super::batch::run::<DB, H>(
            runtime,
            Arc::new(self.handler),
            size,
        ))
    }
}

impl<DB, F, Fut> HasHandler<DB, Plain> for BatchHandler<DB, F>
where
    DB: Backend,
    F: Fn(Vec<Delivery<DB>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<Outcome>> + Send + 'static,
{
    fn into_launch(self, config: QueueConfig) -> Box<dyn Launch<DB>> {
        Box::new(MountedBatch {
            config,
            handler: self,
            db: PhantomData,
        })
    }
}
