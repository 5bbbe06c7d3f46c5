//! Cron expressions (the `cron` feature): parsed by `croner`, in a time zone of `chrono-tz`.
//!
//! `croner` takes five fields or six (a seconds field first), the `L`, `W` and `#` specifiers and
//! the `@daily`-style nicknames, and says what a tick does across a change of the clocks (the
//! Open Cron Pattern Specification, as Vixie cron does): a tick at a fixed time that falls in
//! the hour skipped in spring runs at the first time after the gap, one in the hour repeated in
//! autumn runs once, at its first occurrence; ticks of a wildcard or a step (`*/15`) in a
//! skipped hour do not exist, and in a repeated hour run in both passes. Its searches move in
//! real time, so the ticks, as instants, only ever grow.

use std::fmt;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};

use super::{Missed, Schedule, Ticks};
use crate::error::{Error, Result};

/// A parsed cron expression and the time zone its fields are read in.
#[derive(Clone)]
pub(super) struct Cron {
    expression: String,
    cron: croner::Cron,
    zone: Tz,
}

impl Cron {
    pub(super) fn next_after(&self, time: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = time.with_timezone(&self.zone);
        let next = self.cron.find_next_occurrence(&local, false).ok()?;
        Some(next.with_timezone(&Utc))
    }

    pub(super) fn last_until(&self, time: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = time.with_timezone(&self.zone);
        let last = self.cron.find_previous_occurrence(&local, true).ok()?;
        Some(last.with_timezone(&Utc))
    }
}

impl fmt::Debug for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} in {}", self.expression, self.zone.name())
    }
}

impl Schedule {
    /// Ticks by a cron expression read in UTC: five fields (minute, hour, day of month, month,
    /// day of week) or six, a seconds field first — `"0 */5 * * * *"` ticks every five minutes,
    /// `"0 3 * * *"` at 03:00 — with ranges, lists, steps, `L`, `W`, `#` and the nicknames
    /// (`@hourly`, `@daily`, ..). Parsed by the `croner` crate.
    ///
    /// # Examples
    ///
    /// ```
    /// use sqlx_queue::Schedule;
    ///
    /// let every_five_minutes = Schedule::cron("0 */5 * * * *")?;
    /// let at = "2026-03-29T00:03:00Z".parse().unwrap();
    /// assert_eq!(every_five_minutes.next_after(at), "2026-03-29T00:05:00Z".parse().ok());
    /// # Ok::<(), sqlx_queue::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSchedule`] naming the expression, for one that does not parse.
    pub fn cron(expression: &str) -> Result<Schedule> {
        Schedule::parse(expression, chrono_tz::UTC)
    }

    /// Ticks by a cron expression ([`Schedule::cron`]) whose times are read in `time_zone`, an
    /// IANA name such as `"Europe/Berlin"` (the `chrono-tz` crate's database). Across a change
    /// of the clocks, a tick at a fixed time in the hour skipped in spring runs at the first
    /// time after the gap, and one in the hour repeated in autumn runs once; ticks of a wildcard
    /// or a step run in both passes of a repeated hour, and not in a skipped one.
    ///
    /// # Examples
    ///
    /// ```
    /// use sqlx_queue::Schedule;
    ///
    /// let nightly = Schedule::cron_in("30 2 * * *", "Europe/Berlin")?;
    /// // On 29 March 2026 Berlin's clocks skip from 02:00 to 03:00: the job runs at 03:00 CEST.
    /// let before = "2026-03-28T12:00:00Z".parse().unwrap();
    /// assert_eq!(nightly.next_after(before), "2026-03-29T01:00:00Z".parse().ok());
    /// # Ok::<(), sqlx_queue::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSchedule`] naming the expression, for one that does not parse or a time
    /// zone the database does not know.
    pub fn cron_in(expression: &str, time_zone: &str) -> Result<Schedule> {
        let zone: Tz = time_zone.parse().map_err(|_| {
            invalid(
                expression,
                format!(
                    "unknown time zone {time_zone:?}: name one of the IANA database, such as \
                     \"Europe/Berlin\" or \"UTC\""
                ),
            )
        })?;
        Schedule::parse(expression, zone)
    }

    fn parse(expression: &str, zone: Tz) -> Result<Schedule> {
        let parser = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build();
        let cron = parser
            .parse(expression)
            .map_err(|error| invalid(expression, error.to_string()))?;
        Ok(Schedule {
            ticks: Ticks::Cron(Box::new(Cron {
                expression: expression.to_owned(),
                cron,
                zone,
            })),
            missed: Missed::Skip,
        })
    }
}

fn invalid(expression: &str, reason: String) -> Error {
    Error::InvalidSchedule {
        expression: expression.to_owned(),
        reason,
    }
}
