//! A queue of batches: one claim takes up to `n` rows for one worker, the batch handler gets them
//! together and returns one outcome per row, and the rows settle by the same policy as single
//! deliveries (the row lock form in one transaction, all or nothing). Each row's delivery has
//! its own [`cancelled`](crate::Delivery::cancelled): a cancel request read (or notified) for
//! the row, or its lease lost, cancels that delivery alone, and a requested row is removed
//! whatever the handler returned for it, its request with it.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::FutureExt as _;
use tokio::sync::Mutex;
use tracing::Instrument as _;

use super::cancel;
use super::claim::{Pace, worker_loops};

use super::keeper::keep_batch;
use super::policy;
use super::queue::Live;
use super::requests::Entered;
use super::stats::{Counters, QueueReport};
use crate::backend::{Backend, ClaimedRow};
use crate::delivery::{Cancel, Delivery, Outcome};
use crate::form::{ClaimedBatch, Form};
use crate::handler::CallBatch;
use crate::table::Dialect;

/// Runs a queue of batches until the runner stops: each worker runs its own claim loop — claim
/// a batch of up to `size` rows, deliver it, settle it, claim again — so that no worker waits
/// for another's claim (one loop claiming for every worker made the claims of a queue take
/// turns: MariaDB's lease batches of 16 at 8 workers drained at half a baseline of independent
/// loops). A worker that found a full batch wakes an idle sibling, so a backlog spreads at once.
/// On SQLite, whose writers take turns on one lock, the workers' claims take turns in the
/// process instead (claims side by side only collide there and wait for the lock). Where the
/// form can, the settlement of a full batch claims the next with it
/// ([`Form::settle_batch_and_claim`]: on SQLite in its transaction, one commit a batch, not
/// two; the advisory form on MySQL/MariaDB and the row lock form on PostgreSQL in its round
/// trip).
pub(super) async fn run<DB, F, H>(q: Arc<Live<DB, F>>, handler: Arc<H>, size: usize) -> QueueReport
where
    DB: Backend,
    F: Form<DB>,
    H: CallBatch<DB>,
{
    let shared = Arc::new(Workers {
        busy: AtomicUsize::new(0),
        turns: (DB::DIALECT == Dialect::Sqlite).then(|| Mutex::new(())),
    });
    worker_loops(&q, "a batch worker", |_, mut pace| {
        let (q, handler, shared) = (Arc::clone(&q), Arc::clone(&handler), Arc::clone(&shared));
        async move {
            let mut carried = None;
            // A batch claimed with the last one's settlement takes its turn, stopping or not:
            // the turn releases it when the runner stops.
            while !q.stopping() || carried.is_some() {
                let turn = claim_and_deliver(&q, &*handler, size, &shared, &mut pace, &mut carried);
                match turn.await {
                    Turn::Released(back) => return back,
                    Turn::Stop if carried.is_none() => break,
                    Turn::Next | Turn::Stop => {}
                }
            }
            0
        }
    })
    .await
}

/// What a queue's worker loops share.
struct Workers {
    /// Workers with a batch in work (none: the queue is idle).
    busy: AtomicUsize,
    /// Where claims take turns (SQLite).
    turns: Option<Mutex<()>>,
}

/// A batch claimed by the settlement of the one before ([`Form::settle_batch_and_claim`]): the
/// worker's next turn delivers it without a claim of its own.
type Carried<DB, F> = Option<ClaimedBatch<DB, F>>;

/// What a worker's loop does after one turn.
enum Turn {
    /// Claim again.
    Next,
    /// The runner stopped with a batch claimed: its rows released (how many).
    Released(u64),
    /// The runner stopped.
    Stop,
}

/// One turn of a worker: claims a batch (a batch never waits to be full: it takes what is
/// claimable now), or takes the one `carried` from the last settlement, delivers and settles
/// it, then paces the next claim.
async fn claim_and_deliver<DB, F, H>(
    q: &Arc<Live<DB, F>>,
    handler: &H,
    size: usize,
    workers: &Workers,
    pace: &mut Pace,
    carried: &mut Carried<DB, F>,
) -> Turn
where
    DB: Backend,
    F: Form<DB>,
    H: CallBatch<DB>,
{
    let (rows, batch, size) = match carried.take() {
        Some((rows, batch)) => {
            Counters::add(&q.stats().claimed, rows.len() as u64);
            (rows, batch, size)
        }
        None => match claim(q, size, workers, pace).await {
            Ok(claimed) => claimed,
            Err(turn) => return turn,
        },
    };
    let got = rows.len();
    if q.stopping() || got == 0 {
        let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
        let back = q.form.release_batch(&q.conns, &ids, batch).await;
        if got > 0 {
            Counters::add(&q.stats().released, back);
            return Turn::Released(back);
        }
        let idle = workers.busy.load(Ordering::Relaxed) == 0;
        return if pace.claimed(q, false, idle).await {
            Turn::Next
        } else {
            Turn::Stop
        };
    }
    if got == size {
        // There may be more: a sibling waiting looks too.
        pace.wake_sibling();
    }
    // A full batch's settlement claims the next where the form joins the two: more
    // rows may be waiting. Not where a rate limit grants the rows, or rows are held back (the
    // claim of a settlement passes over none).
    let next = match F::CLAIMS_WITH_SETTLEMENT
        && got == size
        && q.rate.is_none()
        && q.quarantine.excluded().is_empty()
    {
        true => size,
        false => 0,
    };
    workers.busy.fetch_add(1, Ordering::Relaxed);
    q.stats().in_work.fetch_add(got as u64, Ordering::Relaxed);
    let span = tracing::info_span!("batch", queue = %q.label, rows = got);
    let turns = workers.turns.as_ref();
    *carried = deliver(q, handler, rows, batch, next, turns)
        .instrument(span)
        .await;
    q.stats().in_work.fetch_sub(got as u64, Ordering::Relaxed);
    workers.busy.fetch_sub(1, Ordering::Relaxed);
    if pace.claimed(q, got == size, false).await {
        Turn::Next
    } else {
        Turn::Stop
    }
}

/// A claim of up to `size` rows (fewer where a rate limit grants fewer): the rows, their hold,
/// and the size asked; or the worker's turn when the claim failed or the runner stopped.
async fn claim<DB, F>(
    q: &Arc<Live<DB, F>>,
    size: usize,
    workers: &Workers,
    pace: &mut Pace,
) -> Result<(Vec<ClaimedRow>, F::Batch, usize), Turn>
where
    DB: Backend,
    F: Form<DB>,
{
    let excluded = q.quarantine.excluded();
    // A rate limit grants a token per row, waiting while it grants none.
    let Some(size) = super::rate::tokens(q, size).await else {
        return Err(Turn::Stop);
    };
    let turn = match &workers.turns {
        Some(turns) => Some(turns.lock().await),
        None => None,
    };
    let claimed = q.form.claim_batch(&q.conns, size, &excluded).await;
    drop(turn);
    let (rows, batch) = match claimed {
        Ok(claimed) => claimed,
        Err(failed) => {
            super::rate::unused(q, size, 0).await;
            return Err(match pace.failed(q, failed).await {
                true => Turn::Next,
                false => Turn::Stop,
            });
        }
    };
    Counters::add(&q.stats().claimed, rows.len() as u64);
    super::rate::unused(q, size, rows.len()).await;
    Ok((rows, batch, size))
}

/// A row of a batch in work: what its settlement needs once the handler returned.
struct InBatch {
    id: i64,
    attempt: u32,
    /// The outcome the policy settled before the handler saw the row (undecodable, past its
    /// cap): the row was not handed to the handler.
    first: Option<Outcome>,
    /// The row's entry among the deliveries in work: its delivery's cancellation.
    entered: Entered,
}

impl AsRef<Cancel> for InBatch {
    fn as_ref(&self) -> &Cancel {
        &self.entered.entry.token
    }
}

/// Runs one batch to its settlement; with `next` over 0, the settlement claims up to `next`
/// rows for the worker's next turn where the form joins the two (taking the claims'
/// `turns`, SQLite's): that batch, if it claimed one.
async fn deliver<DB, F, H>(
    q: &Live<DB, F>,
    handler: &H,
    rows: Vec<ClaimedRow>,
    mut batch: F::Batch,
    next: usize,
    turns: Option<&Mutex<()>>,
) -> Carried<DB, F>
where
    DB: Backend,
    F: Form<DB>,
    H: CallBatch<DB>,
{
    let _working = q
        .observe
        .start_batch(rows.iter().map(|row| (row, policy::attempt(row))));
    let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
    // One pass: each row's attempt, its outcome when the policy settles it before a handler
    // sees it, its entry in work (its delivery's own `cancelled()`: a request, or a lease lost,
    // cancels it alone), and the delivery handed to the handler.
    let mut in_batch = Vec::with_capacity(rows.len());
    let mut deliveries = Vec::with_capacity(rows.len());
    let mut cancels = Cancel::many(rows.len());
    for row in rows {
        let attempt = policy::attempt(&row);
        let first = policy::before_handler(q, &row, attempt);
        let cancel = cancels.next().expect("a cancellation per row");
        let entered = q.requests.enter_with(row.id, cancel);
        if first.is_none() {
            deliveries.push(Delivery::new(
                row.id,
                row.payload,
                attempt,
                q.group.clone(),
                row.headers,
                None,
                entered.entry.token.clone(),
            ));
        }
        in_batch.push(InBatch {
            id: row.id,
            attempt,
            first,
            entered,
        });
    }
    let handed = deliveries.len();

    let every = q.form.extend_batch_every(&batch);
    let since = q.observe.timer();
    let result = {
        let handled =
            AssertUnwindSafe(async move { handler.call(deliveries).await }).catch_unwind();
        tokio::pin!(handled);
        keep_batch(q, &ids, &mut batch, every, handled, &in_batch).await
    };

    let Some(result) = result else {
        cancel::batch(q, &ids, batch).await;
        return None;
    };
    q.observe.handled(since);
    let mut outcomes = policy::unless_panicked(
        q,
        result,
        "batch handler panicked; its rows are retried after the queue's backoff",
        || vec![Outcome::fail(); handed],
    );
    if outcomes.len() != handed {
        tracing::error!(
            rows = handed,
            outcomes = outcomes.len(),
            "the batch handler returned one outcome per row in the wrong number: rows without \
             one are retried"
        );
        outcomes.resize(handed, Outcome::retry());
    }
    let mut outcomes = outcomes.into_iter();
    let settlements: Vec<(i64, Outcome)> = in_batch
        .iter_mut()
        .map(|row| {
            let id = row.id;
            let outcome = match row.first.take() {
                Some(outcome) => outcome,
                None => policy::outcome(
                    q,
                    id,
                    row.attempt,
                    Ok(outcomes.next().unwrap_or_else(Outcome::retry)),
                ),
            };
            if row.entered.entry.requested() {
                // Whatever the handler returned for it: the row goes, and its request.
                tracing::info!(
                    id,
                    "job of a batch cancelled while in work; its row is removed"
                );
                return (id, Outcome::drop());
            }
            (id, outcome)
        })
        .collect();
    let one_by_one = q.quarantine.one_by_one(&ids);
    // A batch settled row by row (to name a failing row) claims nothing with it.
    let next = if q.stopping() || one_by_one { 0 } else { next };
    let since = q.observe.timer();
    let turn = match turns {
        Some(turns) if next > 0 => Some(turns.lock().await),
        _ => None,
    };
    let (settled, claimed) = q
        .form
        .settle_batch_and_claim(&q.conns, &settlements, batch, one_by_one, next)
        .await;
    drop(turn);
    q.observe.settlement_took(since);
    match settled {
        Ok(results) => {
            let mut removed = Vec::new();
            for ((&(id, outcome), result), row) in settlements.iter().zip(results).zip(&in_batch) {
                if result.is_ok() && row.entered.entry.requested() {
                    removed.push(id);
                }
                policy::settled(q, id, outcome, result);
            }
            drop(in_batch);
            // A request stays while its row does: removed with it.
            for id in removed {
                q.requests.forget(&q.shared.pool, id).await;
            }
        }
        Err((row, error)) => {
            q.observe.failed(settlements.len() as u64);
            tracing::error!(%error, "the batch returns to the queue as it was");
            // The row whose statement failed is held back; the others come again at once. A
            // statement of many rows names none: the next batch with one of them settles row by
            // row, and names it.
            match row {
                Some(id) => {
                    q.quarantine
                        .hold_back(&q.label, id, "its settlement in a batch", &error);
                }
                None => q.quarantine.suspect(&ids),
            }
        }
    }
    claimed
}
