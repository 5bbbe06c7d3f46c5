//! The claim forms: how a row is claimed, held and settled, on a connection of the pool.

pub(crate) mod lease;

/// The claim form of a started queue, with its rendered statements.
#[derive(Debug)]
pub(crate) enum FormRuntime {
    Lease(lease::LeaseForm),
}

use chrono::{DateTime, SubsecRound, Utc};

/// The time as the database sees it: this host's clock corrected by the offset to the server's
/// clock measured at start, so that leases and delays written by runners on several hosts agree.
/// Times are kept to the microsecond, the precision PostgreSQL and MySQL store.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Clock {
    offset: chrono::TimeDelta,
}

impl Clock {
    /// A clock corrected by `server_now`, read by a query that started at `sent` and answered at
    /// `received` (this host's times).
    pub(crate) fn measured(
        sent: DateTime<Utc>,
        received: DateTime<Utc>,
        server_now: DateTime<Utc>,
    ) -> Self {
        let midpoint = sent + (received - sent) / 2;
        Clock {
            offset: server_now - midpoint,
        }
    }

    pub(crate) fn now(&self) -> DateTime<Utc> {
        (Utc::now() + self.offset).trunc_subsecs(6)
    }

    /// `now` plus `delay`, to the microsecond.
    pub(crate) fn after(&self, delay: std::time::Duration) -> DateTime<Utc> {
        let delay = chrono::TimeDelta::from_std(delay).unwrap_or(chrono::TimeDelta::MAX);
        self.now()
            .checked_add_signed(delay)
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
            .trunc_subsecs(6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    #[test]
    fn the_clock_follows_the_server() {
        let sent = Utc::now();
        let received = sent + TimeDelta::milliseconds(10);
        let server = sent + TimeDelta::seconds(60);
        let clock = Clock::measured(sent, received, server);
        let skew = clock.now() - Utc::now();
        assert!(skew > TimeDelta::seconds(59) && skew < TimeDelta::seconds(61));
        assert_eq!(clock.now().timestamp_subsec_nanos() % 1000, 0);
    }
}
