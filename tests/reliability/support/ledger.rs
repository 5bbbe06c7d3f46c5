//! The handlers' own records of their deliveries, and what the invariants read from them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx_queue::Outcome;
use tokio::sync::watch;

/// Microseconds since the Unix epoch, by this host's clock (the consumer's ledger uses it too).
pub(crate) fn micros_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// Milliseconds, for reports.
pub(crate) fn ms(micros: i64) -> f64 {
    micros as f64 / 1000.0
}

/// The handlers' own record of their deliveries in this process: when each began and ended.
#[derive(Debug, Default)]
pub(crate) struct Journal {
    entries: Mutex<Vec<Delivered>>,
    /// Deliveries begun past this many wait until the receiver reads `true` before they work
    /// ([`held_from`](Self::held_from)).
    held: Option<(usize, watch::Receiver<bool>)>,
}

/// One delivery as its handler saw it, times in microseconds since the Unix epoch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Delivered {
    pub(crate) id: i64,
    pub(crate) attempt: u32,
    pub(crate) start: i64,
    pub(crate) end: Option<i64>,
}

impl Journal {
    /// A journal whose handlers, past `begun` deliveries begun, wait until `until` reads `true`
    /// before they work.
    pub(crate) fn held_from(begun: usize, until: watch::Receiver<bool>) -> Self {
        Journal {
            held: Some((begun, until)),
            ..Journal::default()
        }
    }

    /// Notes the start of a delivery; the index ends it.
    pub(crate) fn begin(&self, id: i64, attempt: u32) -> usize {
        let mut entries = self.entries.lock().unwrap();
        entries.push(Delivered {
            id,
            attempt,
            start: micros_now(),
            end: None,
        });
        entries.len() - 1
    }

    pub(crate) fn end(&self, index: usize) {
        self.entries.lock().unwrap()[index].end = Some(micros_now());
    }

    pub(crate) fn entries(&self) -> Vec<Delivered> {
        self.entries.lock().unwrap().clone()
    }

    /// Deliveries started and not ended.
    pub(crate) fn in_work(&self) -> usize {
        let entries = self.entries.lock().unwrap();
        entries.iter().filter(|d| d.end.is_none()).count()
    }

    pub(crate) fn ended(&self) -> usize {
        let entries = self.entries.lock().unwrap();
        entries.iter().filter(|d| d.end.is_some()).count()
    }

    /// A handler's delivery of row `id`: notes its start now; the future works `work` (after
    /// waiting, if the journal holds it: [`held_from`](Self::held_from)), notes its end and acks.
    pub(crate) fn work(
        self: &Arc<Self>,
        id: i64,
        attempt: u32,
        work: Duration,
    ) -> impl Future<Output = Outcome> + Send + use<> {
        let journal = Arc::clone(self);
        let entry = journal.begin(id, attempt);
        let held = self
            .held
            .as_ref()
            .filter(|(begun, _)| entry >= *begun)
            .map(|(_, until)| until.clone());
        async move {
            if let Some(mut until) = held {
                let _ = until.wait_for(|open| *open).await;
            }
            tokio::time::sleep(work).await;
            journal.end(entry);
            Outcome::ack()
        }
    }
}

/// Pairs of deliveries of the same row whose handlers ran at once (an unended delivery runs
/// until `ends_by` says, or forever).
pub(crate) fn overlaps(
    deliveries: &[Delivered],
    ends_by: impl Fn(&Delivered) -> Option<i64>,
) -> Vec<(Delivered, Delivered)> {
    let mut by_row: HashMap<i64, Vec<Delivered>> = HashMap::new();
    for d in deliveries {
        by_row.entry(d.id).or_default().push(*d);
    }
    let mut found = Vec::new();
    for (_, mut row) in by_row {
        row.sort_by_key(|d| d.start);
        for (i, earlier) in row.iter().enumerate() {
            let end = earlier.end.or_else(|| ends_by(earlier)).unwrap_or(i64::MAX);
            for later in &row[i + 1..] {
                if later.start < end {
                    found.push((*earlier, *later));
                }
            }
        }
    }
    found
}

/// Asserts that every id of `ids` was handled to its end at least once.
pub(crate) fn assert_handled(deliveries: &[Delivered], ids: &[i64]) {
    let mut done: HashMap<i64, u32> = HashMap::new();
    for d in deliveries.iter().filter(|d| d.end.is_some()) {
        *done.entry(d.id).or_default() += 1;
    }
    let missing: Vec<_> = ids.iter().filter(|id| !done.contains_key(id)).collect();
    assert!(
        missing.is_empty(),
        "rows never handled to the end: {missing:?}"
    );
}

/// min / median / max of `values` (milliseconds), for reports.
pub(crate) fn spread(values: &mut [f64]) -> String {
    if values.is_empty() {
        return "none".to_owned();
    }
    values.sort_by(f64::total_cmp);
    format!(
        "min {:.0} ms, median {:.0} ms, max {:.0} ms (n = {})",
        values[0],
        values[values.len() / 2],
        values[values.len() - 1],
        values.len()
    )
}
