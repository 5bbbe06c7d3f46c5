//! A queue's rate limit in its claim loops: tokens taken before each claim, no more rows claimed
//! than granted, the tokens of rows not found given back, and a sleep — never a poll — while the
//! bucket is empty.
//!
//! One ask at a time per queue and process: a claim loop (or worker) waits for the one asking.
//! After a grant that emptied the bucket, the next ask waits until the tokens it would want are
//! due (computed from what the grant left), at most those of [`GATHER`], at least one token, so
//! that a limited queue runs about one grant per claim, not one per token.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use super::queue::Live;
use crate::backend::Backend;
use crate::form::rate::Limiter;
use crate::form::{Form, on_conn};

/// How much time's worth of tokens an ask waits to gather once the bucket is empty.
const GATHER: Duration = Duration::from_millis(100);

/// The longest a claim loop sleeps for tokens before it asks again (a limit of one a day).
const LONGEST_WAIT: Duration = Duration::from_secs(3600);

/// A queue's limiter, shared by its claim loops.
#[derive(Debug)]
pub(super) struct Gate<DB> {
    limiter: Limiter<DB>,
    /// When the next ask may run: after a grant emptied the bucket, when the tokens are due.
    next: Mutex<Option<Instant>>,
}

impl<DB: Backend> Gate<DB> {
    pub(super) fn new(limiter: Limiter<DB>) -> Self {
        Gate {
            limiter,
            next: Mutex::new(None),
        }
    }

    /// Takes up to `want` tokens (`want` > 0), waiting while none are granted: how many it got,
    /// or `None` when the runner stops meanwhile. A failed grant is retried after a back-off (a
    /// claim never goes without tokens).
    pub(super) async fn take<F: Form<DB>>(&self, q: &Live<DB, F>, want: usize) -> Option<usize> {
        let mut next = tokio::select! {
            biased;
            () = q.shared.stop.cancelled() => return None,
            next = self.next.lock() => next,
        };
        let mut backoff = Duration::from_millis(50);
        loop {
            if let Some(at) = next.take() {
                tokio::select! {
                    biased;
                    () = q.shared.stop.cancelled() => return None,
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            q.stats().rate_statements.fetch_add(1, Ordering::Relaxed);
            let asked = on_conn(&q.conns, async |conn| self.limiter.grant(conn, want).await);
            match asked.await {
                Ok(grant) => {
                    if grant.granted < want {
                        *next = Some(Instant::now() + self.due(want, grant.left));
                    }
                    if grant.granted > 0 {
                        return Some(grant.granted.min(want));
                    }
                }
                Err(error) => {
                    tracing::warn!(queue = %q.label, %error, wait = ?backoff, "the rate limiter's grant failed; retrying");
                    *next = Some(Instant::now() + backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// How long until the tokens an ask of `want` gathers are due, with `left` in the bucket.
    fn due(&self, want: usize, left: f64) -> Duration {
        let limit = self.limiter.limit();
        let rate = limit.per_second();
        #[allow(clippy::cast_precision_loss, reason = "token counts, far below 2^52")]
        let gather = (want as f64)
            .min(f64::from(limit.burst))
            .min((rate * GATHER.as_secs_f64()).floor())
            .max(1.0);
        // A wait of more than the longest is cut short: the ask then finds how long remains.
        Duration::from_secs_f64(((gather - left) / rate).clamp(0.0, LONGEST_WAIT.as_secs_f64()))
    }

    /// Gives back the tokens of `n` rows a claim did not take.
    pub(super) async fn give_back<F: Form<DB>>(&self, q: &Live<DB, F>, n: usize) {
        if n == 0 {
            return;
        }
        // The tokens back in the bucket: the next ask need not wait for more (unless one waits
        // already, its wait computed before).
        if let Ok(mut next) = self.next.try_lock() {
            *next = None;
        }
        q.stats().rate_statements.fetch_add(1, Ordering::Relaxed);
        let given = on_conn(&q.conns, async |conn| self.limiter.give_back(conn, n).await);
        if let Err(error) = given.await {
            tracing::warn!(queue = %q.label, %error, tokens = n, "the rate limiter's unused tokens could not be given back");
        }
    }
}

/// The tokens for a claim of up to `want` rows: `want` on a queue without a rate limit; `None`
/// when the runner stops while the queue waits for them.
pub(super) async fn tokens<DB: Backend, F: Form<DB>>(
    q: &Live<DB, F>,
    want: usize,
) -> Option<usize> {
    match &q.rate {
        Some(gate) if want > 0 => gate.take(q, want).await,
        _ => Some(want),
    }
}

/// Gives back the tokens of a claim granted `granted` that took `got` rows.
pub(super) async fn unused<DB: Backend, F: Form<DB>>(q: &Live<DB, F>, granted: usize, got: usize) {
    if let Some(gate) = &q.rate {
        gate.give_back(q, granted.saturating_sub(got)).await;
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;
    use crate::config::{FormKind, QueueConfig, RateLimit};
    use crate::table::Table;

    fn gate(n: u32, per: Duration, burst: u32) -> Gate<sqlx::Sqlite> {
        let mut config =
            QueueConfig::new(Table::new("jobs").limits("job_limits"), FormKind::Advisory);
        config.rate = Some(RateLimit { n, per, burst });
        Gate::new(Limiter::new(&config).unwrap().expect("a limiter"))
    }

    #[test]
    fn an_empty_bucket_waits_for_the_tokens_of_a_claim_at_most_a_tenth_of_a_second_of_them() {
        let g = gate(200, Duration::from_secs(1), 200);
        // 8 tokens wanted, half a token left: 7.5 tokens at 200 a second.
        assert_eq!(g.due(8, 0.5), Duration::from_micros(37_500));
        // 100 wanted: the tokens of 100 ms (20), less the one left.
        assert_eq!(g.due(100, 1.0), Duration::from_millis(95));
        assert_eq!(g.due(1, 0.25), Duration::from_micros(3750));
        assert_eq!(g.due(1, 1.5), Duration::ZERO, "a token is there");
    }

    #[test]
    fn a_slow_limit_waits_for_one_token_and_at_most_an_hour() {
        let g = gate(1, Duration::from_secs(60), 1);
        assert_eq!(g.due(8, 0.5), Duration::from_secs(30));
        let g = gate(1, Duration::from_secs(86_400 * 365), 1);
        assert_eq!(g.due(1, 0.0), LONGEST_WAIT);
    }
}
