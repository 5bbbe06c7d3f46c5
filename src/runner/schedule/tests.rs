//! The ticks' times: fixed periods on the epoch's multiples, and cron expressions in a time zone
//! across both changes of the clocks.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Schedule;

fn at(text: &str) -> DateTime<Utc> {
    text.parse().expect("an RFC 3339 time")
}

/// The first `n` ticks after `from`, in RFC 3339 (UTC).
fn ticks(schedule: &Schedule, from: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut time = at(from);
    for _ in 0..n {
        time = schedule.next_after(time).expect("a next tick");
        out.push(time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true));
    }
    out
}

#[test]
fn every_ticks_on_the_multiples_of_its_period_since_the_epoch() {
    let s = Schedule::every(Duration::from_millis(250));
    assert_eq!(
        ticks(&s, "2026-01-01T00:00:00.100Z", 3),
        [
            "2026-01-01T00:00:00.250Z",
            "2026-01-01T00:00:00.500Z",
            "2026-01-01T00:00:00.750Z"
        ]
    );
    // A tick is not after itself, and is the last tick until itself.
    let tick = at("2026-01-01T00:00:00.500Z");
    assert_eq!(s.next_after(tick), Some(at("2026-01-01T00:00:00.750Z")));
    assert_eq!(s.last_until(tick), Some(tick));
    assert_eq!(
        s.last_until(at("2026-01-01T00:00:00.499Z")),
        Some(at("2026-01-01T00:00:00.250Z"))
    );
    let hourly = Schedule::every(Duration::from_secs(3600));
    assert_eq!(
        ticks(&hourly, "2026-01-01T10:59:59Z", 2),
        ["2026-01-01T11:00:00Z", "2026-01-01T12:00:00Z"]
    );
    // Before the epoch too.
    assert_eq!(
        hourly.last_until(at("1969-12-31T23:30:00Z")),
        Some(at("1969-12-31T23:00:00Z"))
    );
}

#[test]
fn ticks_between_two_times_are_counted_without_either() {
    let s = Schedule::every(Duration::from_secs(1));
    let (a, b) = (at("2026-01-01T00:00:00Z"), at("2026-01-01T00:00:06Z"));
    assert_eq!(s.between(a, b, 100), 5);
    assert_eq!(s.between(a, b, 3), 3);
    assert_eq!(s.between(b, a, 100), 0);
    assert_eq!(s.between(a, at("2026-01-01T00:00:00.5Z"), 100), 0);
}

#[test]
#[should_panic(expected = "at least a millisecond")]
fn every_refuses_a_period_under_a_millisecond() {
    let _ = Schedule::every(Duration::from_micros(999));
}

#[cfg(feature = "cron")]
mod cron {
    use super::*;
    use crate::Error;

    #[test]
    fn the_seconds_field_is_optional() {
        let five = Schedule::cron("*/5 * * * *").unwrap();
        let six = Schedule::cron("0 */5 * * * *").unwrap();
        let from = "2026-01-01T00:03:07Z";
        assert_eq!(ticks(&five, from, 2), ticks(&six, from, 2));
        assert_eq!(
            ticks(&five, from, 2),
            ["2026-01-01T00:05:00Z", "2026-01-01T00:10:00Z"]
        );
        let seconds = Schedule::cron("*/20 * * * * *").unwrap();
        assert_eq!(
            ticks(&seconds, "2026-01-01T00:00:00.5Z", 3),
            [
                "2026-01-01T00:00:20Z",
                "2026-01-01T00:00:40Z",
                "2026-01-01T00:01:00Z"
            ]
        );
        assert_eq!(
            seconds.last_until(at("2026-01-01T00:00:20.5Z")),
            Some(at("2026-01-01T00:00:20Z"))
        );
    }

    #[test]
    fn an_invalid_expression_or_time_zone_is_an_error_naming_it() {
        for bad in ["61 * * * *", "* * *", "0 0 0 0 0 0 0 0", ""] {
            match Schedule::cron(bad) {
                Err(Error::InvalidSchedule { expression, .. }) => assert_eq!(expression, bad),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let err = Schedule::cron("61 * * * *").unwrap_err().to_string();
        assert!(err.contains("\"61 * * * *\""), "{err}");
        let err = Schedule::cron_in("0 3 * * *", "Europe/Berlinn")
            .unwrap_err()
            .to_string();
        assert!(err.contains("Europe/Berlinn"), "{err}");
        assert!(err.contains("\"0 3 * * *\""), "{err}");
    }

    /// Berlin skips from 02:00 to 03:00 CET→CEST on 29 March 2026 (01:00 UTC), and goes back
    /// from 03:00 to 02:00 CEST→CET on 25 October 2026 (01:00 UTC).
    #[test]
    fn a_fixed_time_runs_once_across_both_changes_of_the_clocks() {
        let nightly = Schedule::cron_in("0 30 2 * * *", "Europe/Berlin").unwrap();
        // Spring: 02:30 does not exist on the 29th; it runs at 03:00 CEST, the first time after
        // the gap, and at 02:30 CEST (00:30 UTC) the day after.
        assert_eq!(
            ticks(&nightly, "2026-03-27T12:00:00Z", 3),
            [
                "2026-03-28T01:30:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-30T00:30:00Z"
            ]
        );
        // Autumn: 02:30 happens twice on the 25th; it runs once, at the first (CEST, 00:30 UTC).
        assert_eq!(
            ticks(&nightly, "2026-10-23T12:00:00Z", 3),
            [
                "2026-10-24T00:30:00Z",
                "2026-10-25T00:30:00Z",
                "2026-10-26T01:30:00Z"
            ]
        );
        // The last tick until a time agrees with the next after it, across the change.
        assert_eq!(
            nightly.last_until(at("2026-10-25T01:45:00Z")),
            Some(at("2026-10-25T00:30:00Z"))
        );
        assert_eq!(
            nightly.last_until(at("2026-03-29T12:00:00Z")),
            Some(at("2026-03-29T01:00:00Z"))
        );
    }

    #[test]
    fn a_step_skips_the_missing_hour_and_runs_in_both_passes_of_the_repeated_one() {
        let two_hourly = Schedule::cron_in("0 0 */2 * * *", "Europe/Berlin").unwrap();
        // Spring: 00:00 CET, then 02:00 does not exist, then 04:00 CEST: three hours apart.
        assert_eq!(
            ticks(&two_hourly, "2026-03-28T22:30:00Z", 3),
            [
                "2026-03-28T23:00:00Z",
                "2026-03-29T02:00:00Z",
                "2026-03-29T04:00:00Z"
            ]
        );
        // Autumn: 00:00 CEST, 02:00 CEST, 02:00 CET (an hour later in real time), 04:00 CET:
        // each tick a distinct instant (and a distinct job key).
        assert_eq!(
            ticks(&two_hourly, "2026-10-24T21:30:00Z", 4),
            [
                "2026-10-24T22:00:00Z",
                "2026-10-25T00:00:00Z",
                "2026-10-25T01:00:00Z",
                "2026-10-25T03:00:00Z"
            ]
        );
    }

    #[test]
    fn missed_ticks_of_a_cron_expression_are_counted_one_by_one() {
        let quarter = Schedule::cron("*/15 * * * *").unwrap();
        let (a, b) = (at("2026-01-01T00:00:00Z"), at("2026-01-01T01:00:00Z"));
        assert_eq!(quarter.between(a, b, 100), 3);
        assert_eq!(quarter.between(a, b, 2), 2);
        assert_eq!(quarter.last_until(b), Some(b));
    }

    #[test]
    fn utc_has_no_change_of_the_clocks() {
        let nightly = Schedule::cron("30 2 * * *").unwrap();
        assert_eq!(
            ticks(&nightly, "2026-03-28T12:00:00Z", 2),
            ["2026-03-29T02:30:00Z", "2026-03-30T02:30:00Z"]
        );
    }
}
