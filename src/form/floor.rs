//! A queue's claim floor: where its claims in id order start reading.
//!
//! A claim reads the claim index from the queue's first entry, and every row settled since the
//! server last cleaned up is an entry it walks before the first claimable row. On PostgreSQL
//! those entries stay until no snapshot can see them: while a transaction holds `xmin` (an idle
//! `REPEATABLE READ` session, a long report, an abandoned replication slot), every row drained
//! leaves one, and each claim walks them all — a drain of 100,000 rows slowed to a twentieth.
//! MySQL/MariaDB's delete-marked records wait for purge the same way, and a table that keeps its
//! finished rows (`processed_at`) without a partial index keeps them in the index for good.
//!
//! So while the queue has a backlog, a claim starts at the smallest id the previous claim took
//! (`id >= floor`): below it, at that claim, every row was settled, in work or not due. A row
//! below the floor can become claimable again (a retry, a lease that expired, a row given back,
//! a row committed late with a smaller id); the floor is dropped — the next claim reads from the
//! start — after a claim that took fewer rows than it asked for (the queue is not a backlog),
//! and at least every [`RESCAN`] otherwise, so such a row waits at most that much longer.
//!
//! Only claims in id order use a floor: with a priority, or a FIFO or per-group condition (a
//! row below the floor becomes claimable as the rows before it settle), and for a by-key queue
//! (a row given back below the floor must come before the later rows of its key), claims read
//! from the start ([`Names::floored`](crate::dialect::Names::floored)).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// How long claims may start at the floor before one reads from the start again.
pub(crate) const RESCAN: Duration = Duration::from_secs(1);

/// The floor of one mounted queue's claims, shared by its claims (a hint: a stale value costs a
/// longer read or a later pickup, never a wrong claim).
#[derive(Debug)]
pub(crate) struct Floor {
    /// Whether the queue's claims have a floor to bind (claims in id order).
    enabled: bool,
    /// The smallest id the last claim took.
    id: AtomicI64,
    /// Whether the last claim took all it asked for, and [`id`](Self::id) holds its floor.
    full: AtomicBool,
    /// When the last claim from the start ran, in milliseconds since `epoch`.
    rescanned: AtomicU64,
    epoch: Instant,
}

impl Floor {
    pub(crate) fn new(enabled: bool) -> Self {
        Floor {
            enabled,
            id: AtomicI64::new(i64::MIN),
            full: AtomicBool::new(false),
            rescanned: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether the queue's claims bind a floor (claims in id order).
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// The id the next claim starts at: `None` (from the start) unless the last claim took all
    /// it asked for and a claim read from the start less than [`RESCAN`] ago.
    pub(crate) fn start(&self) -> Option<i64> {
        let rescan = u64::try_from(RESCAN.as_millis()).unwrap_or(u64::MAX);
        let fresh = self.now()
            < self
                .rescanned
                .load(Ordering::Relaxed)
                .saturating_add(rescan);
        (self.enabled && fresh && self.full.load(Ordering::Relaxed))
            .then(|| self.id.load(Ordering::Relaxed))
    }

    /// Records a claim that started at `start`, asked for `asked` rows and took `ids`.
    pub(crate) fn claimed(&self, start: Option<i64>, asked: usize, ids: impl Iterator<Item = i64>) {
        if !self.enabled {
            return;
        }
        if start.is_none() {
            self.rescanned.store(self.now(), Ordering::Relaxed);
        }
        let (count, smallest) = ids.fold((0, i64::MAX), |(n, min), id| (n + 1, min.min(id)));
        let full = count >= asked && count > 0;
        if full {
            self.id.store(smallest, Ordering::Relaxed);
        }
        self.full.store(full, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_starts_at_the_floor_only_after_a_full_claim_and_a_recent_rescan() {
        let floor = Floor::new(true);
        assert_eq!(floor.start(), None, "the first claim reads from the start");
        floor.claimed(None, 4, [12, 10, 11, 13].into_iter());
        assert_eq!(
            floor.start(),
            Some(10),
            "after a full claim: its smallest id"
        );
        floor.claimed(Some(10), 4, [14, 15, 16, 17].into_iter());
        assert_eq!(floor.start(), Some(14));
        floor.claimed(Some(14), 4, [18].into_iter());
        assert_eq!(
            floor.start(),
            None,
            "a short claim: the queue is no backlog"
        );
        floor.claimed(None, 4, [].into_iter());
        assert_eq!(floor.start(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_reads_from_the_start_at_least_every_rescan() {
        let floor = Floor::new(true);
        floor.claimed(None, 2, [1, 2].into_iter());
        tokio::time::advance(RESCAN / 2).await;
        floor.claimed(Some(1), 2, [3, 4].into_iter());
        assert_eq!(floor.start(), Some(3));
        tokio::time::advance(RESCAN / 2).await;
        assert_eq!(
            floor.start(),
            None,
            "{RESCAN:?} after the last read from the start"
        );
        floor.claimed(None, 2, [1, 5].into_iter());
        assert_eq!(floor.start(), Some(1), "a row below the floor found again");
    }

    #[test]
    fn claims_out_of_id_order_have_no_floor() {
        let floor = Floor::new(false);
        floor.claimed(None, 1, [7].into_iter());
        assert_eq!(floor.start(), None);
    }
}
