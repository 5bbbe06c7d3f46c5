//! Rows held back after a failure of their own: a row whose claim statement fails (a constraint, a
//! value the statement cannot compute) or whose settlement keeps failing (a trigger, a dead letter
//! that refuses it) is passed over by this queue's claims for a growing delay — 1 s, doubling to
//! 5 min — logged once at each step, so one row never stops the queue nor spins it.
//!
//! Claims pass over at most [`MAX_EXCLUDED`] held rows, those held longest (the rows that failed
//! most); a row beyond them that a claim finds again is isolated again.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::dialect::MAX_EXCLUDED;

/// The first delay, doubled at each further failure up to [`Quarantine::MAX_DELAY`].
const FIRST_DELAY: Duration = Duration::from_secs(1);

/// How many rows one queue remembers at most (the oldest that came due are forgotten first).
const REMEMBERED: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Held {
    failures: u32,
    until: Instant,
}

/// The rows one queue holds back.
#[derive(Debug, Default)]
pub(crate) struct Quarantine {
    rows: Mutex<HashMap<i64, Held>>,
    /// Rows of a batch whose set statement failed, naming no row: the next batch that has one
    /// settles row by row, which names the row that fails.
    suspects: Mutex<HashSet<i64>>,
}

impl Quarantine {
    /// The longest delay.
    pub(crate) const MAX_DELAY: Duration = Duration::from_secs(300);

    fn rows(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Held>> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds row `id` back after a failure (`what` failed with `error`), and says so: the delay,
    /// which grows with each failure of the row's.
    pub(crate) fn hold_back(
        &self,
        queue: &str,
        id: i64,
        what: &str,
        error: &dyn std::fmt::Display,
    ) -> Duration {
        let now = Instant::now();
        let mut rows = self.rows();
        if rows.len() >= REMEMBERED {
            rows.retain(|_, held| held.until > now);
        }
        let held = rows.entry(id).or_insert(Held {
            failures: 0,
            until: now,
        });
        held.failures = held.failures.saturating_add(1);
        let doublings = held.failures.saturating_sub(1).min(16);
        let delay = (FIRST_DELAY * 2u32.pow(doublings)).min(Self::MAX_DELAY);
        held.until = now + delay;
        let failures = held.failures;
        drop(rows);
        tracing::error!(
            queue,
            id,
            failures,
            ?delay,
            %error,
            "{what} failed for a reason of the row's own: the row is passed over for {delay:?}"
        );
        delay
    }

    /// Forgets row `id` (settled at last).
    pub(crate) fn release(&self, id: i64) {
        let mut rows = self.rows();
        if !rows.is_empty() {
            rows.remove(&id);
        }
    }

    /// Marks `ids` as suspects: a set statement settling them failed.
    pub(crate) fn suspect(&self, ids: &[i64]) {
        let mut suspects = self.suspects.lock().unwrap_or_else(|e| e.into_inner());
        if suspects.len() + ids.len() > REMEMBERED {
            suspects.clear();
        }
        suspects.extend(ids);
    }

    /// Whether a batch of `ids` settles row by row: one of them is a suspect (forgotten now) or
    /// was held back before (not settled since).
    pub(crate) fn one_by_one(&self, ids: &[i64]) -> bool {
        let held = {
            let rows = self.rows();
            !rows.is_empty() && ids.iter().any(|id| rows.contains_key(id))
        };
        self.take_suspects(ids) || held
    }

    /// Whether any of `ids` is a suspect; forgets them.
    fn take_suspects(&self, ids: &[i64]) -> bool {
        let mut suspects = self.suspects.lock().unwrap_or_else(|e| e.into_inner());
        if suspects.is_empty() {
            return false;
        }
        let before = suspects.len();
        for id in ids {
            suspects.remove(id);
        }
        suspects.len() < before
    }

    /// The rows held back now, at most [`MAX_EXCLUDED`]: those held longest.
    pub(crate) fn excluded(&self) -> Vec<i64> {
        let rows = self.rows();
        if rows.is_empty() {
            return Vec::new();
        }
        let now = Instant::now();
        let mut held: Vec<(Instant, i64)> = rows
            .iter()
            .filter(|(_, held)| held.until > now)
            .map(|(id, held)| (held.until, *id))
            .collect();
        drop(rows);
        held.sort_unstable_by(|a, b| b.cmp(a));
        held.truncate(usize::from(MAX_EXCLUDED));
        held.into_iter().map(|(_, id)| id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_row_is_held_back_longer_at_each_failure_and_forgotten_once_settled() {
        let q = Quarantine::default();
        assert!(q.excluded().is_empty());
        assert_eq!(
            q.hold_back("q", 7, "the ack", &"boom"),
            Duration::from_secs(1)
        );
        assert_eq!(
            q.hold_back("q", 7, "the ack", &"boom"),
            Duration::from_secs(2)
        );
        assert_eq!(
            q.hold_back("q", 7, "the ack", &"boom"),
            Duration::from_secs(4)
        );
        assert_eq!(q.excluded(), vec![7]);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(q.excluded().is_empty(), "due again");
        assert_eq!(
            q.hold_back("q", 7, "the ack", &"boom"),
            Duration::from_secs(8)
        );
        q.release(7);
        assert_eq!(
            q.hold_back("q", 7, "the ack", &"boom"),
            Duration::from_secs(1),
            "forgotten once settled"
        );
        for _ in 0..20 {
            q.hold_back("q", 8, "the ack", &"boom");
        }
        assert!(q.hold_back("q", 8, "the ack", &"boom") <= Quarantine::MAX_DELAY);
    }

    #[tokio::test(start_paused = true)]
    async fn claims_pass_over_the_rows_held_longest_and_at_most_sixteen() {
        let q = Quarantine::default();
        for id in 0..20 {
            q.hold_back("q", id, "the claim", &"boom");
        }
        q.hold_back("q", 0, "the claim", &"boom");
        let excluded = q.excluded();
        assert_eq!(excluded.len(), 16);
        assert!(excluded.contains(&0), "row 0 comes due last: {excluded:?}");
    }
}
