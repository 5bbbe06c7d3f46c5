//! Exponential backoff with jitter: the delay before a failed delivery's row returns
//! (`Queue::backoff`, [`Outcome::fail`](crate::Outcome::fail)), and a helper for handlers that
//! pick their own delays (`Outcome::retry_after(Backoff::default().delay(attempt))`).

use std::hash::BuildHasher as _;
use std::time::Duration;

/// Exponential backoff with jitter: the delay after attempt `n` is `base × 2^(n−1)`, at most
/// `max`, then a random point in its upper half ("equal jitter"), so retries of rows that failed
/// together spread out instead of returning together.
///
/// The default — 2 s, doubling, up to 1 hour — is every queue's for its failed deliveries
/// ([`Queue::backoff`](crate::Queue::backoff)): a failure's first retry comes after 1–2 s, the
/// fifth after 16–32 s, and five deliveries take at least 15 s, so a short outage of what a
/// handler calls does not use up `max_attempts(5)`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sqlx_queue::Backoff;
///
/// let backoff = Backoff::default();
/// let first = backoff.delay(1);
/// assert!(first >= Duration::from_secs(1) && first <= Duration::from_secs(2));
/// assert_eq!(Backoff::none().delay(3), Duration::ZERO);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    max: Duration,
}

impl Default for Backoff {
    /// From 2 seconds, up to 1 hour.
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(2),
            max: Duration::from_secs(3600),
        }
    }
}

impl Backoff {
    /// Backoff from `base`, doubling, up to `max`.
    ///
    /// # Panics
    ///
    /// `base` is zero, or `max` is shorter than `base`.
    #[track_caller]
    pub fn new(base: Duration, max: Duration) -> Self {
        assert!(!base.is_zero(), "a backoff's base must be more than zero");
        assert!(max >= base, "a backoff's max must be at least its base");
        Backoff { base, max }
    }

    /// No backoff: a failed delivery's row returns at once, as with
    /// [`Outcome::retry`](crate::Outcome::retry).
    pub fn none() -> Self {
        Backoff {
            base: Duration::ZERO,
            max: Duration::ZERO,
        }
    }

    /// Whether this is [`Backoff::none`].
    pub fn is_none(&self) -> bool {
        self.max.is_zero()
    }

    /// The delay after the `attempt`-th delivery (1 on the first).
    pub fn delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(63);
        let full = self
            .base
            .checked_mul(1u32.checked_shl(doublings).unwrap_or(u32::MAX))
            .unwrap_or(self.max)
            .min(self.max);
        let half = full / 2;
        // Randomness without a dependency: std's hasher keys are random per process and state.
        let random = std::collections::hash_map::RandomState::new().hash_one(attempt);
        let jitter = half.mul_f64((random >> 11) as f64 / (1u64 << 53) as f64);
        half + jitter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_max_within_their_upper_half() {
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        for (attempt, full) in [
            (1, 1),
            (2, 2),
            (3, 4),
            (6, 32),
            (7, 60),
            (40, 60),
            (u32::MAX, 60),
        ] {
            for _ in 0..50 {
                let delay = backoff.delay(attempt);
                let full = Duration::from_secs(full);
                assert!(
                    delay >= full / 2 && delay <= full,
                    "attempt {attempt}: {delay:?}"
                );
            }
        }
        let spread: std::collections::HashSet<_> = (0..20).map(|_| backoff.delay(5)).collect();
        assert!(spread.len() > 1, "jittered");
        assert!(Backoff::default().delay(1) <= Duration::from_secs(2));
    }

    #[test]
    fn the_default_waits_out_a_ten_second_outage_within_five_attempts() {
        let backoff = Backoff::default();
        for (attempt, full) in [
            (1, 2),
            (2, 4),
            (3, 8),
            (4, 16),
            (5, 32),
            (11, 2048),
            (12, 3600),
        ] {
            for _ in 0..50 {
                let delay = backoff.delay(attempt);
                let full = Duration::from_secs(full);
                assert!(
                    delay >= full / 2 && delay <= full,
                    "attempt {attempt}: {delay:?}"
                );
            }
        }
        // The shortest four delays before a fifth delivery: 1 + 2 + 4 + 8 s.
        let soonest: Duration = (1..=4).map(|a| Duration::from_secs(1 << a) / 2).sum();
        assert_eq!(soonest, Duration::from_secs(15));
        assert_eq!(Backoff::none().delay(1), Duration::ZERO);
        assert!(Backoff::none().is_none() && !backoff.is_none());
    }
}
