//! One drain: what its handlers saw, when it ended, and its figures.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::count;
use crate::grid::Sample;

/// A drain that makes no progress for this long fails.
const STALL: Duration = Duration::from_secs(60);

/// What the handlers saw: when the first job was handled, how many were, each row's flag.
#[derive(Debug)]
pub(crate) struct Progress {
    base: Instant,
    /// Nanoseconds from `base` to the first handled job (`u64::MAX`: none yet).
    first: AtomicU64,
    handled: AtomicU64,
    /// Handler calls (the crate) or claims that took rows (the baseline).
    batches: AtomicU64,
    /// Settlements the baseline completed (the crate's are read from its `Stats`).
    pub(crate) settled: AtomicU64,
    /// Transactions the baseline ran again after the server rolled them back (a deadlock).
    pub(crate) retries: AtomicU64,
    duplicates: AtomicU64,
    /// Tells the baseline's workers to stop (a drain at its cap).
    pub(crate) stop: AtomicBool,
    min_id: i64,
    seen: Vec<AtomicBool>,
}

impl Progress {
    pub(crate) fn new(min_id: i64, rows: usize) -> Self {
        Progress {
            base: Instant::now(),
            first: AtomicU64::new(u64::MAX),
            handled: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            min_id,
            seen: (0..rows).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// A batch handed to a handler (a single delivery is a batch of one).
    pub(crate) fn batch(&self) {
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    /// A job handled: the no-op handler of the crate's side.
    pub(crate) fn handle(&self, id: i64) {
        if self.handled.fetch_add(1, Ordering::Relaxed) == 0 {
            self.started(Instant::now());
        }
        self.see(id);
    }

    /// Jobs the baseline's handler took at `at`, counted once their settlement committed: a
    /// transaction the server rolled back and the baseline ran again handled its rows twice,
    /// and they count once.
    pub(crate) fn handled(&self, ids: &[i64], at: Instant) {
        if !ids.is_empty() {
            self.handled.fetch_add(ids.len() as u64, Ordering::Relaxed);
            self.started(at);
        }
        for &id in ids {
            self.see(id);
        }
    }

    /// The first job handled is the earliest handled at or before `at`.
    fn started(&self, at: Instant) {
        let nanos = u64::try_from(at.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX - 1);
        self.first.fetch_min(nanos, Ordering::Relaxed);
    }

    /// Flags row `id` handled; a second time, or an unknown id, is a duplicate.
    fn see(&self, id: i64) {
        let seen = usize::try_from(id - self.min_id)
            .ok()
            .and_then(|i| self.seen.get(i));
        match seen {
            Some(flag) if !flag.swap(true, Ordering::Relaxed) => {}
            _ => {
                self.duplicates.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn first(&self) -> Option<Instant> {
        match self.first.load(Ordering::Relaxed) {
            u64::MAX => None,
            n => Some(self.base + Duration::from_nanos(n)),
        }
    }

    /// Checks no row was handled twice, and, when the drain was not capped, that every row
    /// was handled.
    pub(crate) fn verify(&self, end: End) -> Result<(), String> {
        let rows = self.seen.len();
        let handled = self.handled.load(Ordering::Relaxed);
        let duplicates = self.duplicates.load(Ordering::Relaxed);
        if end.settled < rows as u64 {
            if duplicates != 0 || handled < end.settled {
                return Err(format!(
                    "capped drain: {handled} handled, {} settled, {duplicates} twice or unknown",
                    end.settled
                ));
            }
            return Ok(());
        }
        let missing = self
            .seen
            .iter()
            .filter(|f| !f.load(Ordering::Relaxed))
            .count();
        if handled != rows as u64 || duplicates != 0 || missing != 0 {
            return Err(format!(
                "handled {handled} of {rows} rows, {duplicates} twice or unknown, {missing} never"
            ));
        }
        Ok(())
    }

    /// The drain's figures: its rate from the first handled job to the last settlement.
    pub(crate) fn sample(
        &self,
        end: End,
        cpu: Option<u64>,
        idx_scans_per_job: Option<f64>,
    ) -> Result<Sample, String> {
        let first = self.first().ok_or("no job handled")?;
        let secs = (end.at - first).as_secs_f64().max(1e-6);
        let jobs = end.settled.max(2) as f64;
        Ok(Sample {
            // From the first handled job to the last settled: `jobs - 1` intervals.
            jobs_per_s: (jobs - 1.0) / secs,
            capped: end.settled < self.seen.len() as u64,
            cpu_ms_per_kjob: cpu.map_or(f64::NAN, |ticks| ticks as f64 * 10.0 / jobs * 1000.0),
            idx_scans_per_job,
            counts: end.counts,
            settled: end.settled,
            batches: self.batches.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
        })
    }
}

/// How a drain ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct End {
    at: Instant,
    /// Settlements by then: the table's rows, or fewer when the drain hit the cap.
    pub(crate) settled: u64,
    /// What was sent since `count::Window::open` (a counted drain).
    counts: Option<count::Counts>,
}

/// Waits until `settled()` reaches the table's rows, polling every millisecond, or until `cap`
/// has passed since the first job was handled; closes the statement count `window`.
pub(crate) async fn wait_settled(
    cap: Duration,
    progress: &Progress,
    window: Option<count::Window>,
    settled: impl Fn() -> u64,
    gave_up: impl Fn() -> Option<String>,
) -> Result<End, String> {
    let rows = progress.seen.len() as u64;
    let mut last = (0, Instant::now());
    loop {
        let n = settled();
        let now = Instant::now();
        if n >= rows || progress.first().is_some_and(|first| now - first > cap) {
            return Ok(End {
                at: now,
                settled: n,
                counts: window.map(count::Window::close),
            });
        }
        if let Some(why) = gave_up() {
            return Err(format!("stopped after {n} of {rows} settlements: {why}"));
        }
        if n != last.0 {
            last = (n, now);
        } else if now - last.1 > STALL {
            return Err(format!("no progress for {STALL:?} after {n} of {rows}"));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// This process's CPU time so far, in clock ticks (user + system), where /proc has it.
pub(crate) fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}
