//! A unique job and what its enqueue did: the types apart from the statements that enqueue it
//! (`unique`).

use std::borrow::Cow;
use std::time::Duration;

use super::Job;
#[cfg(doc)]
use crate::table::Table;

/// What an enqueue of a unique job does when an unfinished job already holds its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum OnDuplicate {
    /// Insert nothing and report the existing job ([`Enqueued::Duplicate`]).
    Skip,
    /// Give the existing job this job's payload, headers, priority and due time, unless it is in work
    /// ([`Enqueued::Replaced`], or [`Enqueued::InWork`] and nothing changed).
    Replace,
    /// Push the existing job's due time to now + `wait`, but never past `max` after it was
    /// created ([`Table::created_at`]), unless it is in work. A new job is due after `wait`.
    Debounce {
        /// How long after the latest enqueue the job runs.
        wait: Duration,
        /// How long after its creation the job runs at the latest, however often it is pushed.
        max: Duration,
    },
}

/// A job with a unique key: [`Job::unique`]. Enqueue it with [`Queue::enqueue_unique`](crate::Queue::enqueue_unique) or
/// [`Queue::enqueue_many_unique`](crate::Queue::enqueue_many_unique).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sqlx_queue::Job;
///
/// let job = Job::new("refresh").unique("refresh:account:42").debounce(
///     Duration::from_secs(5),
///     Duration::from_secs(60),
/// );
/// assert_eq!(job.key(), "refresh:account:42");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a job does nothing until it is enqueued"]
pub struct UniqueJob<'a> {
    pub(super) job: Job<'a>,
    pub(super) key: Cow<'a, str>,
    pub(super) on_duplicate: OnDuplicate,
}

impl<'a> UniqueJob<'a> {
    /// This job in queue `name`'s group, on `table` (see `Job::in_group`).
    pub(crate) fn in_group(mut self, table: &str, name: &str) -> crate::error::Result<Self> {
        self.job = self.job.in_group(table, name)?;
        Ok(self)
    }
}

impl<'a> Job<'a> {
    /// This job with a unique key: while an unfinished job of the table holds `key`, enqueueing
    /// it inserts nothing (and says [`Enqueued::Duplicate`]; see [`UniqueJob::replace`] and
    /// [`UniqueJob::debounce`]). The table needs a [unique key column](Table::unique_key).
    pub fn unique(self, key: impl Into<Cow<'a, str>>) -> UniqueJob<'a> {
        UniqueJob {
            job: self,
            key: key.into(),
            on_duplicate: OnDuplicate::Skip,
        }
    }
}

impl<'a> UniqueJob<'a> {
    /// A taken key gets this job's payload, headers, priority and due time, unless its job is in work.
    pub fn replace(mut self) -> Self {
        self.on_duplicate = OnDuplicate::Replace;
        self
    }

    /// The job runs `wait` after the latest enqueue of its key, and at the latest `max` after
    /// the first (needs [`retry_after`](Table::retry_after) and [`created_at`](Table::created_at)
    /// columns). The job's own delay is not used.
    pub fn debounce(mut self, wait: Duration, max: Duration) -> Self {
        self.on_duplicate = OnDuplicate::Debounce { wait, max };
        self
    }

    /// The job's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The job itself.
    pub fn job(&self) -> &Job<'a> {
        &self.job
    }
}

/// What an enqueue of a unique job did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "a duplicate key is not an error: read what happened"]
pub enum Enqueued {
    /// The key was free: a new job, with this id.
    New(i64),
    /// The key was taken (and the job neither replaces nor debounces): nothing changed; the existing job's id.
    Duplicate(i64),
    /// The existing job (not in work) took this job's payload, headers, priority and due time.
    Replaced(i64),
    /// The existing job (not in work) was pushed later.
    Debounced(i64),
    /// The existing job is in work (a replace or debounce): nothing changed. A job the table
    /// cannot tell in work from held for a moment by another enqueue's replace (a row locked
    /// on a queue of another form than the lease form) is reported in work too.
    InWork(i64),
}

impl Enqueued {
    /// The id of the job the key belongs to.
    pub fn id(self) -> i64 {
        match self {
            Enqueued::New(id)
            | Enqueued::Duplicate(id)
            | Enqueued::Replaced(id)
            | Enqueued::Debounced(id)
            | Enqueued::InWork(id) => id,
        }
    }
}
