//! The time as the database sees it: apart from the driver calls, as it runs no statement (the
//! runner measures the server's clock and hands the reading here).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, NaiveDate, SubsecRound as _, TimeDelta, Utc};

/// The time as the database sees it: this host's clock corrected by its offset to the server's
/// clock, measured at start and again every minute while the runner runs (so a step of this
/// host's clock does not shorten or lengthen leases for long), so that leases and delays written
/// by runners on several hosts agree. Times are kept to the microsecond, the precision PostgreSQL
/// and MySQL store, and never beyond the year 9999, the last MySQL and SQLite text order keep.
#[derive(Debug, Clone, Default)]
pub(crate) struct Clock {
    offset_micros: Arc<AtomicI64>,
}

impl Clock {
    /// Corrects the clock by `server_now`, read by a query that started at `sent` and answered
    /// at `received` (this host's times).
    pub(crate) fn measure(
        &self,
        sent: DateTime<Utc>,
        received: DateTime<Utc>,
        server_now: DateTime<Utc>,
    ) {
        let midpoint = sent + (received - sent) / 2;
        let offset = (server_now - midpoint).num_microseconds().unwrap_or(0);
        self.offset_micros.store(offset, Ordering::Relaxed);
    }

    pub(crate) fn now(&self) -> DateTime<Utc> {
        let offset = TimeDelta::microseconds(self.offset_micros.load(Ordering::Relaxed));
        (Utc::now() + offset).trunc_subsecs(6)
    }

    /// `now` plus `delay`, to the microsecond.
    pub(crate) fn after(&self, delay: std::time::Duration) -> DateTime<Utc> {
        let last = NaiveDate::from_ymd_opt(9999, 12, 31)
            .and_then(|day| day.and_hms_opt(23, 59, 59))
            .expect("a valid date")
            .and_utc();
        TimeDelta::from_std(delay)
            .ok()
            .and_then(|delay| self.now().checked_add_signed(delay))
            .map_or(last, |at| at.min(last))
            .trunc_subsecs(6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Datelike as _;

    #[test]
    fn the_clock_follows_the_server() {
        let sent = Utc::now();
        let received = sent + TimeDelta::milliseconds(10);
        let server = sent + TimeDelta::seconds(60);
        let clock = Clock::default();
        clock.measure(sent, received, server);
        let skew = clock.now() - Utc::now();
        assert!(skew > TimeDelta::seconds(59) && skew < TimeDelta::seconds(61));
        assert_eq!(clock.now().timestamp_subsec_nanos() % 1000, 0);
    }

    #[test]
    fn far_delays_stop_at_the_year_9999() {
        let clock = Clock::default();
        assert_eq!(clock.after(std::time::Duration::MAX).year(), 9999);
        let soon = clock.after(std::time::Duration::MAX.min(std::time::Duration::from_secs(1)));
        assert!(soon > clock.now() && soon.year() < 9999);
    }
}
