//! Where the typestate ends: a complete queue mounts on a runner as a plain configuration and a
//! handler.

use super::Queue;
use super::state::{AttemptState, BatchState, CapComplete, ClaimForm, FormOn, ModeOn};
use crate::backend::Backend;
use crate::config::{FormKind, QueueConfig};
use crate::delivery::Mode;
use crate::handler::{Handling, Mount, Serves, mount_sealed as sealed};

impl<F, A, C, M, B, H> sealed::Sealed for Queue<F, A, C, M, B, H> {}

/// A queue mounts once each of its states is complete: one claim form the database has, a cap
/// with its dead letter (or none), a handler of this database's deliveries. Each state's gate
/// names the call that completes it.
impl<DB, F, A, C, M, B, H> Mount<DB> for Queue<F, A, C, M, B, H>
where
    DB: Backend,
    F: ClaimForm + FormOn<DB>,
    A: AttemptState,
    C: CapComplete,
    M: Mode + Serves<H::Mode> + ModeOn<DB>,
    B: BatchState,
    H: Handling<DB>,
{
    type Handler = H;

    fn into_parts(self) -> (QueueConfig, H) {
        let form = self.form.into_form();
        let mut table = self.table;
        // The lease column is stated once, on the queue: the table carries it for the calls that
        // must tell a job in work (a unique job's replace, a cancellation).
        if let FormKind::Lease { column, .. } = &form {
            table.lease = Some(column.clone());
        }
        let mut config = QueueConfig::new(table, form);
        config.name = self.name;
        config.attempt = self.attempt.into_column();
        config.cap = self.cap.into_cap();
        config.transactional = M::TRANSACTIONAL;
        config.batch = self.batch.size();
        config.workers = self.workers;
        config.custom = self.custom;
        config.isolation = self.isolation;
        config.sqlite_mode = self.sqlite_mode;
        config.per_group = self.per_group;
        config.listen_notify = self.listen_notify;
        config.rate = self.rate;
        config.by_key = self.by_key;
        config.backoff = self.backoff;
        (config, self.handler)
    }
}

impl<F, A, C, M, B, H> std::fmt::Debug for Queue<F, A, C, M, B, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("table", &self.table.name)
            .field("name", &self.name)
            .field("workers", &self.workers)
            .finish_non_exhaustive()
    }
}
