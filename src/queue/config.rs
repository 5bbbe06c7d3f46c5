//! The plain configuration a queue becomes when it is mounted: the typestate erased.

use std::time::Duration;

use crate::table::{DeadLetter, Table};

/// The claim form, as the runner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Form {
    RowLock,
    Lease { column: String, duration: Duration },
    Advisory,
}

/// Everything the runner and the statements need to know about a mounted queue.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    pub(crate) table: Table,
    pub(crate) name: Option<String>,
    pub(crate) form: Form,
    pub(crate) attempt: Option<String>,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) dead_letter: Option<DeadLetter>,
    pub(crate) transactional: bool,
    pub(crate) batch: Option<usize>,
    pub(crate) workers: usize,
    pub(crate) custom: Vec<(super::Event, String)>,
    pub(crate) isolation: Option<super::Isolation>,
    pub(crate) sqlite_mode: Option<super::SqliteMode>,
    pub(crate) fifo: bool,
    pub(crate) listen_notify: bool,
}

impl QueueConfig {
    /// The queue's name in messages: its group value, else its table's name.
    pub(crate) fn label(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.table.name)
    }
}
