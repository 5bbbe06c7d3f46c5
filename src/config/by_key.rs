//! Per-key order inside one process (`Queue::by_key`): what a mounted queue says of it,
//! and what it refuses at start.

use super::QueueConfig;
use crate::error::{Error, Result};

/// The most rows a by-key queue keeps in hand per worker — in work, or waiting for the worker of
/// their key — on the forms whose one claim serves every worker (lease, plain advisory).
pub(crate) const BY_KEY_IN_HAND_PER_WORKER: usize = 16;

/// The most rows one claim of a by-key queue takes per worker (those forms).
pub(crate) const BY_KEY_CLAIM_PER_WORKER: usize = 4;

/// Which column keys a queue's rows for per-key order inside one process
/// ([`Queue::by_key`](crate::Queue::by_key)): each row goes to the worker its key hashes to.
///
/// # Examples
///
/// ```
/// use sqlx_queue::ByKey;
///
/// let by_account = ByKey::column("account_id");
/// let by_group = ByKey::group();
/// assert_ne!(by_account, by_group);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ByKey {
    /// The key's column, where it is not the table's group column.
    pub(crate) column: Option<String>,
}

impl ByKey {
    /// Rows keyed by the table's [group](crate::Table::group) column: the queue then stays
    /// unnamed and serves every group.
    pub fn group() -> Self {
        ByKey { column: None }
    }

    /// Rows keyed by `column`: any type the database casts to text; rows whose key is NULL
    /// share one key.
    pub fn column(column: impl Into<String>) -> Self {
        ByKey {
            column: Some(column.into()),
        }
    }
}

impl QueueConfig {
    /// The column a by-key queue's key is read from: its own, else the table's group.
    pub(crate) fn key_column(&self) -> Option<&str> {
        let by_key = self.by_key.as_ref()?;
        by_key.column.as_deref().or(self.table.group.as_deref())
    }

    /// `by_key` routes single deliveries by a key of their own: it needs a key that
    /// differs between rows, and nothing that already orders or bundles the rows.
    pub(super) fn check_by_key(&self, queue: &str) -> Result<()> {
        let Some(by_key) = &self.by_key else {
            return Ok(());
        };
        let refused = |reason: &str| Err(Error::declaration(queue, reason));
        if self.batch.is_some() {
            return refused(
                "`.by_key(..)` orders single deliveries: a batch hands rows of many keys \
                 to one handler together; drop `.batch(..)` or `.by_key(..)`",
            );
        }
        if self.rate.is_some() {
            return refused(
                "`.by_key(..)` keeps rows claimed for a key's worker waiting in this \
                 process, and a rate limit's token is a start: they would start later, in a \
                 burst; drop `.rate_limit(..)` or `.by_key(..)`",
            );
        }
        if self.per_group.is_some() {
            return refused(
                "`.by_key(..)` orders a key's rows in this process, `.fifo()` and \
                 `.per_group(..)` limit a group's rows across every runner: pick one (FIFO \
                 already keeps a group in order)",
            );
        }
        match (&by_key.column, &self.table.group, &self.name) {
            (None, None, _) => refused(
                "`.by_key(..)` routes by the table's group column: declare it with \
                 `Table::group(..)`, or key the rows by a column of their own with `ByKey::column(..)`",
            ),
            (None, Some(_), Some(_)) => refused(
                "`.by_key(..)` routes by the group, and a named queue serves one group: \
                 every row would have the same key; leave the queue unnamed to serve every \
                 group, or key the rows by a column of their own with `ByKey::column(..)`",
            ),
            _ => Ok(()),
        }
    }
}
