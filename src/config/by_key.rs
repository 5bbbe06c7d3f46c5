//! Per-key order inside one process (`Queue::workers_by_key`): what a mounted queue says of it,
//! and what it refuses at start.

use super::QueueConfig;
use crate::error::{Error, Result};

/// The most rows a by-key queue keeps in hand per worker — in work, or waiting for the worker of
/// their key — on the forms whose one claim serves every worker (lease, plain advisory).
pub(crate) const BY_KEY_IN_HAND_PER_WORKER: usize = 16;

/// The most rows one claim of a by-key queue takes per worker (those forms).
pub(crate) const BY_KEY_CLAIM_PER_WORKER: usize = 4;

/// Per-key order inside one process ([`Queue::workers_by_key`](crate::Queue::workers_by_key)):
/// each row goes to the worker its key hashes to. `column`: the key's column, where it is not
/// the table's group column.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ByKey {
    pub(crate) column: Option<String>,
}

impl QueueConfig {
    /// The column a by-key queue's key is read from: its own, else the table's group.
    pub(crate) fn key_column(&self) -> Option<&str> {
        let by_key = self.by_key.as_ref()?;
        by_key.column.as_deref().or(self.table.group.as_deref())
    }

    /// `workers_by_key` routes single deliveries by a key of their own: it needs a key that
    /// differs between rows, and nothing that already orders or bundles the rows.
    pub(super) fn check_by_key(&self, queue: &str) -> Result<()> {
        let Some(by_key) = &self.by_key else {
            return Ok(());
        };
        let refused = |reason: &str| Err(Error::declaration(queue, reason));
        if self.batch.is_some() {
            return refused(
                "`.workers_by_key(..)` orders single deliveries: a batch hands rows of many keys \
                 to one handler together; drop `.batch(..)` or `.workers_by_key(..)`",
            );
        }
        if self.rate.is_some() {
            return refused(
                "`.workers_by_key(..)` keeps rows claimed for a key's worker waiting in this \
                 process, and a rate limit's token is a start: they would start later, in a \
                 burst; drop `.rate_limit(..)` or `.workers_by_key(..)`",
            );
        }
        if self.per_group.is_some() {
            return refused(
                "`.workers_by_key(..)` orders a key's rows in this process, `.fifo()` and \
                 `.per_group(..)` limit a group's rows across every runner: pick one (FIFO \
                 already keeps a group in order)",
            );
        }
        match (&by_key.column, &self.table.group, &self.name) {
            (None, None, _) => refused(
                "`.workers_by_key(..)` routes by the table's group column: declare it with \
                 `Table::group(..)`, or name the key's column with `.key_column(..)`",
            ),
            (None, Some(_), Some(_)) => refused(
                "`.workers_by_key(..)` routes by the group, and a named queue serves one group: \
                 every row would have the same key; leave the queue unnamed to serve every \
                 group, or name the key's column with `.key_column(..)`",
            ),
            _ => Ok(()),
        }
    }
}
