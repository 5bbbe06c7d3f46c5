//! A delivery's cancellation ([`Delivery::cancelled`](crate::Delivery::cancelled)), shared by
//! the runner that cancels it and the handler that waits for it.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// One delivery's cancellation. Every delivery has one, so it is made cheap: a clone or a drop
/// is a count, and the deliveries of a batch share one allocation (tokio-util's
/// `CancellationToken` keeps a tree of tokens, allocates one each and takes a lock to clone or
/// drop one: in batches of 16 at one worker on SQLite, about a tenth of the runner's own
/// instructions per job).
#[derive(Debug, Clone)]
pub(crate) struct Cancel {
    shared: Arc<Shared>,
    /// Which of the shared flags is this delivery's.
    index: usize,
}

/// The cancellations of deliveries made together: one flag each, one wake-up for all (a
/// waiter woken by another delivery's cancellation looks at its own flag and waits again).
#[derive(Debug)]
struct Shared {
    first: AtomicBool,
    rest: Box<[AtomicBool]>,
    notify: Notify,
}

impl Default for Cancel {
    fn default() -> Self {
        Cancel::many(1).next().expect("one cancellation")
    }
}

impl Cancel {
    /// The cancellations of `n` deliveries made together (a batch's), in one allocation (two
    /// past one delivery).
    pub(crate) fn many(n: usize) -> impl Iterator<Item = Cancel> {
        let shared = Arc::new(Shared {
            first: AtomicBool::new(false),
            rest: (1..n).map(|_| AtomicBool::new(false)).collect(),
            notify: Notify::new(),
        });
        (0..n).map(move |index| Cancel {
            shared: Arc::clone(&shared),
            index,
        })
    }

    fn flag(&self) -> &AtomicBool {
        match self.index {
            0 => &self.shared.first,
            index => &self.shared.rest[index - 1],
        }
    }

    /// Cancels the delivery: every wait for it ends, and every later one at once.
    pub(crate) fn cancel(&self) {
        if !self.flag().swap(true, Ordering::AcqRel) {
            self.shared.notify.notify_waiters();
        }
    }

    /// Whether the delivery is cancelled.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.flag().load(Ordering::Acquire)
    }

    /// Completes once the delivery is cancelled.
    pub(crate) fn cancelled(&self) -> impl Future<Output = ()> + Send + 'static {
        let this = self.clone();
        async move {
            loop {
                // Registered before the flag is read: a cancellation after the read wakes it.
                let notified = this.shared.notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if this.is_cancelled() {
                    return;
                }
                notified.await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Cancel;

    #[tokio::test]
    async fn a_wait_ends_when_cancelled_before_or_during_it() {
        let cancel = Cancel::default();
        let waiting = tokio::spawn(cancel.cancelled());
        let other = cancel.clone();
        assert!(!other.is_cancelled());
        tokio::task::yield_now().await;
        other.cancel();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("a wait begun before the cancellation did not end within 5 s")
            .unwrap();
        assert!(cancel.is_cancelled());
        tokio::time::timeout(Duration::from_secs(5), cancel.cancelled())
            .await
            .expect("a wait begun after the cancellation did not end at once");
    }

    #[tokio::test]
    async fn a_batch_s_cancellation_cancels_its_delivery_alone() {
        let cancels: Vec<Cancel> = Cancel::many(3).collect();
        let first = tokio::spawn(cancels[0].cancelled());
        let third = tokio::spawn(cancels[2].cancelled());
        tokio::task::yield_now().await;
        cancels[1].cancel();
        assert!(cancels[1].is_cancelled());
        assert!(!cancels[0].is_cancelled() && !cancels[2].is_cancelled());
        tokio::time::timeout(Duration::from_secs(5), cancels[1].cancelled())
            .await
            .expect("the cancelled delivery's wait did not end at once");
        // Woken by the second's cancellation, the others wait again.
        tokio::task::yield_now().await;
        assert!(!first.is_finished() && !third.is_finished());
        cancels[2].cancel();
        tokio::time::timeout(Duration::from_secs(5), third)
            .await
            .expect("the third delivery's wait did not end within 5 s")
            .unwrap();
        assert!(
            !first.is_finished(),
            "the first delivery's wait ended uncancelled"
        );
        cancels[0].cancel();
        tokio::time::timeout(Duration::from_secs(5), first)
            .await
            .expect("the first delivery's wait did not end within 5 s")
            .unwrap();
    }

    #[tokio::test]
    async fn a_wait_does_not_end_uncancelled() {
        let cancel = Cancel::default();
        let waited = tokio::time::timeout(Duration::from_millis(50), cancel.cancelled()).await;
        assert!(waited.is_err(), "an uncancelled delivery's wait ended");
    }
}
