//! A settlement and a cancellation that cross (the row lock and advisory forms, on a table with a
//! cancel requests' table): a cancellation of a job in work answers `Requested`, which promises
//! that nothing the delivery's handler wrote commits and that its row is removed. The runner
//! learns of a request only when it reads or is notified of it, which may be after the handler
//! returned; so a settlement that would commit anything but the row's removal — a
//! transactional ack's writes, a retry, a delay, a move to the dead letter — first inserts the
//! row's request itself, in the transaction it commits in (its reservation, removed again
//! before that commit). The requests' primary key orders the two: a request there already (or
//! inserted by a cancellation not yet committed, which the insert waits for) changes no row, and
//! the settlement removes the row instead; a cancellation that comes later waits for the
//! settlement's commit, and finds the row settled (or free again, and removes it).

use crate::backend::{Backend, HeldConn};
use crate::config::{FormKind, QueueConfig};
use crate::dialect::{self, Args, Names, Stmt};

use super::execute;

/// The statements of a queue's reservations of its rows' requests.
#[derive(Debug)]
pub(crate) struct Requests {
    reserve: Stmt,
    forget: Stmt,
}

impl Requests {
    /// A queue of `config`'s, named `names`: the row lock and advisory forms on a table that
    /// records cancel requests (a lease delivery is fenced by its lease).
    pub(crate) fn of(config: &QueueConfig, names: &Names) -> Option<Self> {
        if matches!(config.form, FormKind::Lease { .. }) {
            return None;
        }
        let sql = dialect::cancel_requests(names)?;
        Some(Requests {
            reserve: sql.reserve,
            forget: sql.forget,
        })
    }

    /// Reserves row `id`'s request in `conn`'s transaction: `true` when a request was there
    /// already — the job was cancelled in work — and nothing was reserved.
    pub(crate) async fn cancelled<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        id: i64,
    ) -> Result<bool, sqlx::Error> {
        let args = Args {
            id,
            ..Args::default()
        };
        Ok(execute::<DB>(conn, &self.reserve, &args).await? == 0)
    }

    /// Removes the reservation of row `id`, before the settlement's commit.
    pub(crate) async fn release<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        id: i64,
    ) -> Result<(), sqlx::Error> {
        let args = Args {
            id,
            ..Args::default()
        };
        execute::<DB>(conn, &self.forget, &args).await.map(drop)
    }
}
