//! The grid: its options, its cells, and what a drain measured.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::count::Counts;
use crate::db::TEST_BEFORE_ACQUIRE;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    RowLock,
    Lease,
    Advisory,
}

impl Form {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Form::RowLock => "row lock",
            Form::Lease => "lease",
            Form::Advisory => "advisory",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) quick: bool,
    pub(crate) rows: usize,
    pub(crate) rounds: usize,
    /// Rows of the drain per side and cell whose statements are counted (0: none).
    pub(crate) count_rows: usize,
    pub(crate) dbs: Vec<String>,
    pub(crate) forms: Option<Vec<Form>>,
    pub(crate) workers: Vec<usize>,
    pub(crate) batches: Vec<usize>,
    /// The runner's poll interval (`--poll-ms`; default: the crate's default).
    pub(crate) poll: Option<Duration>,
    /// Which sides run: the crate, the baseline (`--side crate|baseline`; default both).
    pub(crate) sides: (bool, bool),
}

impl Options {
    pub(crate) fn parse() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let quick = args.iter().any(|a| a == "--quick");
        let mut options = Options {
            quick,
            rows: if quick { 2_000 } else { 20_000 },
            rounds: if quick { 1 } else { 3 },
            count_rows: if quick { 2_000 } else { 4_000 },
            dbs: vec!["postgres".into(), "mysql".into(), "sqlite".into()],
            forms: None,
            workers: if quick { vec![1, 8] } else { vec![1, 4, 8] },
            batches: vec![1, 16],
            poll: None,
            sides: (true, true),
        };
        let list = |value: &str| -> Vec<String> { value.split(',').map(str::to_owned).collect() };
        let numbers = |value: &str| -> Vec<usize> {
            value
                .split(',')
                .map(|n| n.parse().expect("a list of numbers"))
                .collect()
        };
        let mut i = 0;
        while i < args.len() {
            let value = args.get(i + 1).map(String::as_str).unwrap_or("");
            match args[i].as_str() {
                "--rows" => options.rows = value.parse().expect("--rows N"),
                "--rounds" => options.rounds = value.parse().expect("--rounds N"),
                "--count-rows" => options.count_rows = value.parse().expect("--count-rows N"),
                "--db" => options.dbs = list(value),
                "--workers" => options.workers = numbers(value),
                "--batch" => options.batches = numbers(value),
                "--side" => {
                    options.sides = match value {
                        "crate" => (true, false),
                        "baseline" | "raw" => (false, true),
                        _ => (true, true),
                    }
                }
                "--no-test-before-acquire" => {
                    TEST_BEFORE_ACQUIRE.store(false, Ordering::Relaxed);
                    i += 1;
                    continue;
                }
                "--poll-ms" => {
                    options.poll = Some(Duration::from_millis(value.parse().expect("--poll-ms N")));
                }
                "--form" => {
                    options.forms = Some(
                        list(value)
                            .iter()
                            .map(|f| match f.as_str() {
                                "row_lock" | "rowlock" => Form::RowLock,
                                "lease" => Form::Lease,
                                "advisory" => Form::Advisory,
                                other => panic!("unknown form {other}"),
                            })
                            .collect(),
                    );
                }
                _ => {
                    i += 1;
                    continue;
                }
            }
            i += 2;
        }
        options
    }

    /// The forms run on a database that has `all`: every one, or in `--quick` one per database.
    pub(crate) fn forms_for(&self, db: &str, all: &[Form]) -> Vec<Form> {
        match (&self.forms, self.quick) {
            (Some(forms), _) => all.iter().copied().filter(|f| forms.contains(f)).collect(),
            (None, true) => vec![match db {
                "postgres" => Form::RowLock,
                "mysql" => Form::Advisory,
                _ => Form::Lease,
            }],
            (None, false) => all.to_vec(),
        }
    }
}

/// One cell of the grid.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cell {
    pub(crate) form: Form,
    pub(crate) workers: usize,
    pub(crate) batch: usize,
    pub(crate) rows: usize,
}

/// One drain.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub(crate) jobs_per_s: f64,
    /// Stopped at the cap before the table was drained: the rate is over what it settled.
    pub(crate) capped: bool,
    /// This process's CPU time per 1,000 jobs, in ms (from /proc/self/stat; 10 ms ticks).
    pub(crate) cpu_ms_per_kjob: f64,
    /// PostgreSQL only: index scans on the table per job.
    pub(crate) idx_scans_per_job: Option<f64>,
    /// What was sent from the start of the drain to its last settlement (a counted drain).
    pub(crate) counts: Option<Counts>,
    /// Rows settled.
    pub(crate) settled: u64,
    /// Handler calls (the crate) or claims that took rows (the baseline).
    pub(crate) batches: u64,
    /// Transactions the baseline ran again after a deadlock.
    pub(crate) retries: u64,
}

impl Sample {
    /// Round trips per delivery and per batch.
    pub(crate) fn round_trips(&self) -> Option<(f64, f64)> {
        let n = self.counts?.round_trips as f64;
        Some((
            n / self.settled.max(1) as f64,
            n / self.batches.max(1) as f64,
        ))
    }

    /// Statements logged per delivery.
    pub(crate) fn statements(&self) -> Option<f64> {
        Some(self.counts?.statements as f64 / self.settled.max(1) as f64)
    }
}

/// The drains of one side of a cell.
#[derive(Debug, Default, Clone)]
pub(crate) struct Side {
    pub(crate) samples: Vec<Sample>,
    /// The drain whose statements were counted (not timed: statement logging costs CPU).
    pub(crate) counted: Option<Sample>,
    pub(crate) failure: Option<String>,
}

impl Side {
    pub(crate) fn record(&mut self, result: Result<Sample, String>) {
        match result {
            Ok(sample) if sample.counts.is_some() => self.counted = Some(sample),
            Ok(sample) => self.samples.push(sample),
            Err(error) => {
                eprintln!("    FAILED: {error}");
                self.failure.get_or_insert(error);
            }
        }
    }

    fn rates(&self) -> Vec<f64> {
        let mut rates: Vec<f64> = self.samples.iter().map(|s| s.jobs_per_s).collect();
        rates.sort_by(f64::total_cmp);
        rates
    }

    /// `*` when a drain was stopped at the cap.
    pub(crate) fn mark(&self) -> &'static str {
        if self.samples.iter().any(|s| s.capped) {
            "*"
        } else {
            ""
        }
    }

    pub(crate) fn best(&self) -> Option<f64> {
        self.rates().last().copied()
    }

    pub(crate) fn median(&self) -> Option<f64> {
        self.median_of(|s| Some(s.jobs_per_s))
    }

    pub(crate) fn median_of(&self, f: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
        median(self.samples.iter().filter_map(f).collect())
    }
}

/// The median of the crate's rate over the baseline's in the same round: the interleaved rounds
/// paired, so a round the machine ran slow for both sides counts once. `None` when a side
/// failed a round (its samples no longer line up by round).
pub(crate) fn paired_median(krate: &Side, baseline: &Side) -> Option<f64> {
    if krate.failure.is_some()
        || baseline.failure.is_some()
        || krate.samples.len() != baseline.samples.len()
    {
        return None;
    }
    median(
        krate
            .samples
            .iter()
            .zip(&baseline.samples)
            .map(|(k, b)| k.jobs_per_s / b.jobs_per_s)
            .collect(),
    )
}

fn median(mut sorted: Vec<f64>) -> Option<f64> {
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[n / 2]),
        n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// A finished cell.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) db: &'static str,
    pub(crate) cell: Cell,
    pub(crate) krate: Option<Side>,
    pub(crate) baseline: Option<Side>,
}
