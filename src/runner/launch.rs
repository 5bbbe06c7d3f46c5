//! Where a mounted queue becomes a running one: its handler's kind (single deliveries or
//! batches) and its claim form pick, once, the loop that serves it, monomorphised over both (no
//! boxed future per delivery); the queue is checked and prepared before any queue starts.

use std::marker::PhantomData;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::task::JoinHandle;

use super::queue::{Live, Shared};
use super::rate::Gate;
use super::stats::QueueReport;
use super::{acks, batch, claim};
use crate::backend::{self, Backend, Clock};
use crate::config::{FormKind, QueueConfig};
use crate::delivery::Mode;
use crate::error::{Error, Result};
use crate::form::advisory::AdvisoryForm;
use crate::form::advisory::grouped::GroupedForm;
use crate::form::lease::LeaseForm;
use crate::form::rate::Limiter;
use crate::form::row_lock::RowLockForm;
use crate::form::{Form, Identity, Server, check};
use crate::handler::sealed::Visit;
use crate::handler::{CallBatch, CallOne, Handling};
use crate::table::Pooler;

/// A checked queue's identity, and what spawns it.
type Prepared<DB> = (Identity, Box<dyn Spawn<DB>>);

/// A mounted queue, waiting for the runner to start.
pub(super) trait Launch<DB: Backend>: Send {
    /// Checks the queue against the database and prepares its statements.
    fn prepare<'a>(
        self: Box<Self>,
        pool: &'a sqlx::Pool<DB>,
        config: &'a QueueConfig,
        clock: Clock,
        server: Server,
    ) -> BoxFuture<'a, Result<Prepared<DB>>>;
}

/// A checked queue, ready to run.
pub(super) trait Spawn<DB: Backend>: Send {
    fn spawn(self: Box<Self>, config: &QueueConfig, shared: Shared<DB>) -> JoinHandle<QueueReport>;
}

/// The launch of `handler` on a queue of `form`.
pub(super) fn launch<DB: Backend, H: Handling<DB>>(
    form: &FormKind,
    handler: H,
) -> Box<dyn Launch<DB>> {
    handler.accept(Pick { form: form.clone() })
}

/// Picks the loop and the form for a handler of each kind.
struct Pick {
    form: FormKind,
}

impl<DB: Backend> Visit<DB> for Pick {
    type Output = Box<dyn Launch<DB>>;

    fn one<H: CallOne<DB>>(self, handler: H) -> Self::Output {
        // Plain deliveries of the advisory form share the sessions that hold their keys; a
        // transactional delivery's transaction needs a session of its own.
        if self.form == FormKind::Advisory && !<H::Mode as Mode>::TRANSACTIONAL {
            return Box::new(Waiting::<GroupedForm, _>::new(Single(handler)));
        }
        waiting(&self.form, Single(handler))
    }

    fn batch<H: CallBatch<DB>>(self, handler: H) -> Self::Output {
        waiting(&self.form, Batches(handler))
    }
}

/// A queue of `kind` waiting for its form, picked here.
fn waiting<DB: Backend, K>(form: &FormKind, kind: K) -> Box<dyn Launch<DB>>
where
    K: Serve<DB, LeaseForm> + Serve<DB, RowLockForm> + Serve<DB, AdvisoryForm>,
{
    match form {
        FormKind::Lease { .. } => Box::new(Waiting::<LeaseForm, K>::new(kind)),
        FormKind::RowLock => Box::new(Waiting::<RowLockForm, K>::new(kind)),
        FormKind::Advisory => Box::new(Waiting::<AdvisoryForm, K>::new(kind)),
    }
}

/// A handler of single deliveries.
struct Single<H>(H);

/// A handler of batches.
struct Batches<H>(H);

/// How a handler of each kind serves a queue of form `F`: the loop it runs.
trait Serve<DB: Backend, F: Form<DB>>: Send + 'static {
    fn serve(
        self,
        queue: Arc<Live<DB, F>>,
        config: &QueueConfig,
    ) -> BoxFuture<'static, QueueReport>;
}

impl<DB: Backend, F: Form<DB>, H: CallOne<DB>> Serve<DB, F> for Single<H> {
    fn serve(self, queue: Arc<Live<DB, F>>, _: &QueueConfig) -> BoxFuture<'static, QueueReport> {
        Box::pin(claim::run(queue, Arc::new(self.0)))
    }
}

impl<DB: Backend, F: Form<DB>, H: CallBatch<DB>> Serve<DB, F> for Batches<H> {
    fn serve(
        self,
        queue: Arc<Live<DB, F>>,
        config: &QueueConfig,
    ) -> BoxFuture<'static, QueueReport> {
        let size = config.batch.unwrap_or(1);
        Box::pin(batch::run(queue, Arc::new(self.0), size))
    }
}

/// A queue whose form `F` is not prepared yet.
struct Waiting<F, K> {
    kind: K,
    form: PhantomData<fn() -> F>,
}

impl<F, K> Waiting<F, K> {
    fn new(kind: K) -> Self {
        Waiting {
            kind,
            form: PhantomData,
        }
    }
}

/// A queue whose form is prepared.
struct Ready<DB: Backend, F, K> {
    kind: K,
    form: F,
    /// What reads its depth into gauges (`Runner::queue_gauges`).
    #[cfg(feature = "metrics")]
    readiness: crate::form::Readiness<DB>,
    #[cfg(not(feature = "metrics"))]
    readiness: PhantomData<fn() -> DB>,
    /// Its rate limiter, checked.
    limiter: Option<Limiter<DB>>,
}

impl<DB: Backend, F: Form<DB>, K: Serve<DB, F>> Launch<DB> for Waiting<F, K> {
    fn prepare<'a>(
        self: Box<Self>,
        pool: &'a sqlx::Pool<DB>,
        config: &'a QueueConfig,
        clock: Clock,
        server: Server,
    ) -> BoxFuture<'a, Result<Prepared<DB>>> {
        Box::pin(async move {
            let mut conn = pool.acquire().await?;
            // Behind a transaction pooler the checks run in one transaction, on one server
            // session, and leave no statement prepared there.
            let pinned = config.table.pooler == Pooler::Transaction;
            if pinned {
                backend::pin_checks::<DB>(&mut conn).await?;
            }
            let prepared = async {
                let checked = check::<DB>(&mut conn, config, clock, server).await?;
                let identity = checked.identity.clone();
                #[cfg(feature = "metrics")]
                let readiness = crate::form::Readiness::new(pool, &checked);
                #[cfg(not(feature = "metrics"))]
                let readiness = PhantomData;
                let form = F::prepare(&mut conn, config, checked).await?;
                let limiter = Limiter::new(config)?;
                if let Some(limiter) = &limiter {
                    limiter.check(&mut *conn, config.label()).await?;
                }
                Ok::<_, Error>((identity, form, readiness, limiter))
            }
            .await;
            if pinned {
                backend::unpin_checks::<DB>(conn, prepared.is_ok()).await?;
            }
            let (identity, form, readiness, limiter) = prepared?;
            let ready: Box<dyn Spawn<DB>> = Box::new(Ready {
                kind: self.kind,
                form,
                readiness,
                limiter,
            });
            Ok((identity, ready))
        })
    }
}

impl<DB: Backend, F: Form<DB>, K: Serve<DB, F>> Spawn<DB> for Ready<DB, F, K> {
    fn spawn(self: Box<Self>, config: &QueueConfig, shared: Shared<DB>) -> JoinHandle<QueueReport> {
        #[cfg(feature = "metrics")]
        if let Some(every) = shared.gauges {
            let label = config.label().into();
            let stop = shared.stop.clone();
            tokio::spawn(super::observe::gauges(label, self.readiness, every, stop));
        }
        let (mut live, acks) = Live::new(config, self.form, shared);
        live.rate = self.limiter.map(Gate::new);
        let live = Arc::new(live);
        if live.requests.read() {
            let shared = &live.shared;
            tokio::spawn(super::requests::watch(
                Arc::clone(&live.requests),
                shared.pool.clone(),
                shared.poll_interval,
                shared.stop.clone(),
            ));
        }
        if let Some(acks) = acks {
            tokio::spawn(acks::run(Arc::downgrade(&live), acks));
        }
        tokio::spawn(self.kind.serve(live, config))
    }
}
