//! Where the typestate ends: a complete queue mounts on a runner as a plain configuration and a
//! handler.

use super::Queue;
use super::state::{AttemptState, BatchState, CapComplete, ClaimForm, FormOn};
use crate::backend::Backend;
use crate::config::QueueConfig;
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
    M: Mode + Serves<H::Mode>,
    B: BatchState,
    H: Handling<DB>,
{
    type Handler = H;

    fn into_parts(self) -> (QueueConfig, H) {
        let mut config = QueueConfig::new(self.table, self.form.into_form());
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
