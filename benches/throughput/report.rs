//! The output: one Markdown row per cell, a summary, and the baseline's statements.

use std::time::Duration;

use crate::grid::{Cell, Form, Row, Sample, Side, paired_median};
use crate::sql::{mysql, postgres, sqlite};

pub(crate) fn db_label(db: &str) -> &'static str {
    match db {
        "postgres" => "PostgreSQL",
        "mysql" => "MariaDB/MySQL",
        _ => "SQLite",
    }
}

/// A drain's line on standard error.
pub(crate) fn log(db: &str, cell: Cell, round: &str, side: &str, result: &Result<Sample, String>) {
    let Ok(s) = result else { return };
    let scans = s
        .idx_scans_per_job
        .map(|n| format!(", {n:.2} index scans/job"))
        .unwrap_or_default();
    let trips = s
        .round_trips()
        .zip(s.statements())
        .map(|((job, batch), statements)| {
            format!(
                ", {job:.2} round trips/delivery, {batch:.2}/batch, {statements:.2} statements \
                 logged/delivery"
            )
        })
        .unwrap_or_default();
    let retries = match s.retries {
        0 => String::new(),
        n => format!(", {n} transaction(s) run again after a deadlock"),
    };
    eprintln!(
        "  {db} {} w{} b{} {round} {side}: {:.0} jobs/s{}, {:.0} ms CPU/1000 jobs{scans}{trips}\
         {retries}",
        cell.form.label(),
        cell.workers,
        cell.batch,
        s.jobs_per_s,
        if s.capped { " (capped)" } else { "" },
        s.cpu_ms_per_kjob,
    );
}

pub(crate) const HEADER: &str = "| database | form | workers | batch | crate jobs/s median (best) \
     | baseline jobs/s median (best) | crate ÷ baseline median (best) | round trips/delivery crate \
     / baseline | round trips/batch crate / baseline | CPU ms/1000 jobs crate / baseline \
     | crate ÷ baseline, rounds paired: median |\n\
     |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

/// `median (best)` jobs per second of a side.
fn rates(side: Option<&Side>, missing: &str) -> String {
    let Some(side) = side else {
        return missing.to_owned();
    };
    let failed = if side.failure.is_some() {
        " FAILED"
    } else {
        ""
    };
    match side.median().zip(side.best()) {
        Some((median, best)) => format!("{median:.0}{m} ({best:.0}{m}){failed}", m = side.mark()),
        None => format!("—{failed}"),
    }
}

fn pair(crate_side: Option<f64>, baseline: Option<f64>, digits: usize) -> String {
    let show = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:.digits$}"));
    format!("{} / {}", show(crate_side), show(baseline))
}

pub(crate) fn markdown_row(row: &Row) -> String {
    let c = row.cell;
    let (k, b) = (row.krate.as_ref(), row.baseline.as_ref());
    let ratio =
        |f: fn(&Side) -> Option<f64>| times(k.and_then(f).zip(b.and_then(f)).map(|(k, b)| k / b));
    let trips = |side: Option<&Side>| side.and_then(|s| s.counted).and_then(|s| s.round_trips());
    let cpu = |side: Option<&Side>| side.and_then(|s| s.median_of(|s| Some(s.cpu_ms_per_kjob)));
    format!(
        "| {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} | {} |",
        db_label(row.db),
        c.form.label(),
        c.workers,
        c.batch,
        rates(k, "not run"),
        rates(b, "not run"),
        ratio(Side::median),
        ratio(Side::best),
        pair(trips(k).map(|t| t.0), trips(b).map(|t| t.0), 2),
        pair(trips(k).map(|t| t.1), trips(b).map(|t| t.1), 2),
        pair(cpu(k), cpu(b), 0),
        times(k.zip(b).and_then(|(k, b)| paired_median(k, b))),
    )
}

/// A ratio as `1.23x`, or `—`.
fn times(ratio: Option<f64>) -> String {
    ratio.map_or("—".to_owned(), |r| format!("{r:.2}x"))
}

/// Scaling over workers and batches, from the medians.
pub(crate) fn summary(rows: &[Row], cap: Duration) {
    println!();
    let capped = |side: &Option<Side>| side.as_ref().is_some_and(|s| !s.mark().is_empty());
    if rows.iter().any(|r| capped(&r.krate) || capped(&r.baseline)) {
        println!(
            "`*`: a drain was stopped at the cap ({}s after its first job) before the table was \
             empty; its rate is over the jobs it settled.",
            cap.as_secs()
        );
    }
    let find = |db: &str, form: Form, workers: usize, batch: usize| {
        rows.iter().find(|r| {
            r.db == db && r.cell.form == form && r.cell.workers == workers && r.cell.batch == batch
        })
    };
    let median = |side: &Option<Side>| side.as_ref().and_then(Side::median);
    let gain = |a: Option<f64>, b: Option<f64>| {
        a.zip(b)
            .map_or("—".to_owned(), |(a, b)| format!("{:.2}x", b / a))
    };
    // From one cell to another, where both ran.
    let scaling = |what: String, from: Option<&Row>, to: Option<&Row>| {
        if let (Some(from), Some(to)) = (from, to) {
            println!(
                "- {what}: {} / {}",
                gain(median(&from.krate), median(&to.krate)),
                gain(median(&from.baseline), median(&to.baseline)),
            );
        }
    };
    // The worker counts and batch sizes run, fewest first.
    let run = |of: fn(&Cell) -> usize| {
        let mut run: Vec<usize> = rows.iter().map(|r| of(&r.cell)).collect();
        run.sort_unstable();
        run.dedup();
        run
    };
    let (workers, batches) = (run(|c| c.workers), run(|c| c.batch));
    println!("Scaling (medians, crate / baseline):");
    for db in ["postgres", "mysql", "sqlite"] {
        for form in [Form::RowLock, Form::Lease, Form::Advisory] {
            let label = format!("{} {}", db_label(db), form.label());
            for &batch in &batches {
                for &n in workers.iter().skip(1) {
                    scaling(
                        format!("{label}, batch {batch}, {} → {n} workers", workers[0]),
                        find(db, form, workers[0], batch),
                        find(db, form, n, batch),
                    );
                }
            }
            for &n in &workers {
                for &batch in batches.iter().skip(1) {
                    scaling(
                        format!("{label}, {n} worker(s), batch {} → {batch}", batches[0]),
                        find(db, form, n, batches[0]),
                        find(db, form, n, batch),
                    );
                }
            }
        }
    }
}

/// The baseline's statements per batch, in order, for a table `jobs` (id lists shown for two
/// ids).
fn baseline_statements(db: &str, form: Form) -> Vec<String> {
    const HANDLER: &str = "-- the handler";
    let t = "jobs";
    let s = |texts: &[&str]| texts.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    match (db, form) {
        ("postgres", Form::RowLock) => s(&[
            "BEGIN",
            &postgres::row_lock_claim(t),
            HANDLER,
            &postgres::delete(t),
            "COMMIT",
        ]),
        ("postgres", Form::Lease) => s(&[
            &postgres::lease_claim(t),
            HANDLER,
            &postgres::lease_delete(t),
        ]),
        ("postgres", Form::Advisory) => s(&[
            &postgres::advisory_lock(t),
            &postgres::advisory_take(t),
            HANDLER,
            &postgres::delete(t),
            &postgres::advisory_unlock(),
        ]),
        ("mysql", Form::RowLock) => s(&[
            "BEGIN",
            &mysql::row_lock_claim(t),
            HANDLER,
            &mysql::delete(t, 2),
            "COMMIT",
        ]),
        ("mysql", Form::Lease) => s(&[
            "BEGIN",
            &mysql::lease_claim(t),
            &mysql::lease_update(t, 2),
            "COMMIT",
            HANDLER,
            &mysql::lease_delete(t, 2),
        ]),
        ("mysql", Form::Advisory) => s(&[
            &mysql::advisory_lock(t),
            &mysql::advisory_count(t, 2),
            &mysql::advisory_take(t, 2),
            HANDLER,
            &mysql::delete(t, 2),
            &mysql::advisory_unlock(2),
        ]),
        ("sqlite", Form::Lease) => s(&[
            &sqlite::lease_claim(t),
            HANDLER,
            &sqlite::lease_delete(t, 2),
        ]),
        ("sqlite", Form::Advisory) => s(&[
            &sqlite::advisory_candidates(t),
            "-- keys locked in the process",
            &sqlite::advisory_take(t, 2),
            HANDLER,
            &sqlite::delete(t, 2),
            "-- keys released in the process",
        ]),
        _ => Vec::new(),
    }
}

/// Prints the baseline's statements of the forms run.
pub(crate) fn statements(run: &[(&'static str, Form)]) {
    println!("\nThe baseline's statements per batch (a table `jobs`; id lists shown for 2 ids):");
    for &(db, form) in run {
        println!("\n{} {}:\n\n```sql", db_label(db), form.label());
        if db == "mysql" && form != Form::Advisory {
            println!("-- once per connection: {}", mysql::SESSION);
        }
        for statement in baseline_statements(db, form) {
            println!("{statement}");
        }
        println!("```");
    }
}
