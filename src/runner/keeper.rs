//! While a handler works: its rows' holds are extended where they expire (the lease form, every
//! half lease), and the shutdown timeout cancels it.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use super::queue::Live;
use super::stats::Counters;
use crate::backend::Backend;
use crate::delivery::Cancel;
use crate::form::{Form, GRACE};

/// What keeping a handler gave: its result, or `None` when cancelled at the shutdown timeout,
/// with the hold an extension in flight then may have written (its outcome unknown).
pub(super) struct Kept<T, H> {
    pub(super) result: Option<T>,
    pub(super) extending: Option<H>,
}

/// Before a delivery starts: renews the hold of row `id` if it is due already (a row claimed
/// ahead that waited past half its lease for a worker), or confirms a hold that does not
/// expire where it can go unseen ([`Form::still_held`]). `false`: the hold was lost meanwhile
/// (the lease expired, and another claim took the row; the session holding the key ended), and
/// the row is not delivered. A renewal that fails is tried again while the handler runs, as any
/// other.
pub(super) async fn confirm<DB: Backend, F: Form<DB>>(
    q: &Live<DB, F>,
    id: i64,
    hold: &mut F::Hold,
) -> bool {
    let Some((every, since)) = q.form.extend_every(hold) else {
        return q.form.still_held(id, hold).await;
    };
    if since.elapsed() < every {
        return true;
    }
    let Some(to) = q.form.extension(hold) else {
        return true;
    };
    match q.form.extend(&q.conns, id, hold, &to).await {
        Ok(true) => {
            *hold = to;
            true
        }
        Ok(false) => {
            Counters::add(&q.stats().lease_lost, 1);
            tracing::warn!("lease lost while the row waited for a worker: not delivered");
            false
        }
        Err(error) => {
            tracing::warn!(%error, "lease renewal before the handler failed; trying again");
            true
        }
    }
}

/// Awaits the handler of row `id` while extending `hold` when it must be (the handler is polled
/// during an extension too, so a slow statement never stalls it). `cancel` is the delivery's
/// [`cancelled`](crate::Delivery::cancelled): fired when an extension finds the lease lost (the
/// job cancelled, or its lease expired and taken), and at the shutdown timeout, before the
/// handler's future is dropped.
pub(super) async fn keep<DB: Backend, F: Form<DB>, T>(
    q: &Live<DB, F>,
    id: i64,
    hold: &mut F::Hold,
    mut handled: Pin<&mut impl Future<Output = T>>,
    cancel: &Cancel,
) -> Kept<T, F::Hold> {
    let abort = &q.shared.abort;
    let Some((every, since)) = q.form.extend_every(hold) else {
        let result = watch(q, id, hold, handled, cancel).await;
        if result.is_none() {
            cancel.cancel();
        }
        return Kept {
            result,
            extending: None,
        };
    };
    let mut next = since + every;
    let mut lost = false;
    loop {
        tokio::select! {
            biased;
            result = &mut handled => return Kept { result: Some(result), extending: None },
            () = abort.cancelled() => {
                cancel.cancel();
                return Kept { result: None, extending: None };
            }
            () = tokio::time::sleep_until(next), if !lost => {}
        }
        let Some(to) = q.form.extension(hold) else {
            lost = true;
            cancel.cancel();
            continue;
        };
        let mut extension = Box::pin(q.form.extend(&q.conns, id, hold, &to));
        let mut finished = None;
        let extended = loop {
            tokio::select! {
                extended = &mut extension => break extended,
                result = &mut handled, if finished.is_none() => {
                    if q.abandon_extension {
                        return Kept { result: Some(result), extending: None };
                    }
                    finished = Some(result);
                }
                () = abort.cancelled(), if finished.is_none() => {
                    cancel.cancel();
                    // The extension may commit the new hold after all: learn which the row
                    // carries, or fence both.
                    let extended = tokio::time::timeout(GRACE, &mut extension).await;
                    drop(extension);
                    return match extended {
                        Ok(Ok(true)) => {
                            *hold = to;
                            Kept { result: None, extending: None }
                        }
                        Ok(Ok(false)) => Kept { result: None, extending: None },
                        Ok(Err(_)) | Err(_) => Kept { result: None, extending: Some(to) },
                    };
                }
            }
        };
        drop(extension);
        match extended {
            Ok(true) => {
                *hold = to;
                next = Instant::now() + every;
            }
            Ok(false) => {
                lost = true;
                cancel.cancel();
                tracing::warn!(
                    "lease lost while the handler was running (its job cancelled, or its lease \
                     expired and taken): its settlement will fail"
                );
            }
            Err(error) => {
                let retry_in = (every / 4).max(Duration::from_millis(5));
                tracing::warn!(%error, ?retry_in, "lease extension failed; trying again");
                next = Instant::now() + retry_in;
            }
        }
        if let Some(result) = finished {
            return Kept {
                result: Some(result),
                extending: None,
            };
        }
    }
}

/// Awaits the handler of row `id` on a hold that does not expire, asking every poll interval
/// whether the session holding the row is gone ([`Form::session_lost`]: the server ended it, or
/// restarted): the row may then be claimed again while the handler runs, which nothing stops —
/// the delivery's `cancel` is fired, so that a handler that looks at it can stop. `None` when
/// cancelled at the shutdown timeout.
async fn watch<DB: Backend, F: Form<DB>, T>(
    q: &Live<DB, F>,
    id: i64,
    hold: &mut F::Hold,
    mut handled: Pin<&mut impl Future<Output = T>>,
    cancel: &Cancel,
) -> Option<T> {
    let abort = &q.shared.abort;
    let every = q.shared.poll_interval;
    let mut told = false;
    loop {
        tokio::select! {
            biased;
            result = &mut handled => return Some(result),
            () = abort.cancelled() => return None,
            () = tokio::time::sleep(every), if !told => {}
        }
        // The handler is polled during the check too. A check that takes longer than `GRACE`
        // (a server that does not answer) says nothing; the ping it cut off is waited for by
        // the next statement on that connection.
        let check = tokio::time::timeout(GRACE, q.form.session_lost(id, hold));
        tokio::pin!(check);
        let mut finished = None;
        let lost = loop {
            tokio::select! {
                lost = &mut check => break lost.unwrap_or(false),
                result = &mut handled, if finished.is_none() => finished = Some(result),
            }
        };
        if lost {
            told = true;
            cancel.cancel();
        }
        if let Some(result) = finished {
            return Some(result);
        }
    }
}

/// Awaits a batch's handler while extending the holds of its rows `ids` when they must be
/// (the handler waits meanwhile). `None` when cancelled at the shutdown timeout, which an
/// extension in flight then gets [`GRACE`] more to finish (the holds it renewed by then are
/// the batch's; a row whose renewal is cut off returns when its lease expires). `cancel`, each
/// row's delivery's [`cancelled`](crate::Delivery::cancelled) (in the order of `ids`): a row's
/// fires when an extension finds its lease lost, and all at the shutdown timeout.
pub(super) async fn keep_batch<DB: Backend, F: Form<DB>, T>(
    q: &Live<DB, F>,
    ids: &[i64],
    batch: &mut F::Batch,
    every: Option<(Duration, Instant)>,
    mut handled: Pin<&mut impl Future<Output = T>>,
    cancel: &[impl AsRef<Cancel>],
) -> Option<T> {
    let abort = &q.shared.abort;
    let cancel_all = || cancel.iter().for_each(|token| token.as_ref().cancel());
    let mut next = every.map(|(every, since)| since + every);
    loop {
        tokio::select! {
            biased;
            result = &mut handled => return Some(result),
            () = abort.cancelled() => {
                cancel_all();
                return None;
            }
            () = sleep_until(next) => {}
        }
        let extension = q.form.extend_batch(&q.conns, ids, batch);
        tokio::pin!(extension);
        let lost = tokio::select! {
            biased;
            lost = &mut extension => lost,
            () = abort.cancelled() => {
                cancel_all();
                let _ = tokio::time::timeout(GRACE, extension).await;
                return None;
            }
        };
        let lost = ids.iter().zip(cancel).filter(|(id, _)| lost.contains(id));
        for (&id, token) in lost.filter(|(_, token)| !token.as_ref().is_cancelled()) {
            tracing::warn!(
                id,
                "lease lost while the batch was running (its job cancelled, or its lease expired \
                 and taken): its delivery is cancelled"
            );
            token.as_ref().cancel();
        }
        next = every.map(|(every, _)| Instant::now() + every.max(Duration::from_millis(5)));
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
