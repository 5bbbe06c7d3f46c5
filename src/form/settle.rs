//! What every form's settlement shares: a queue's dead letter and own statements as rendered for
//! it, the values a settlement binds, and the log lines of a settlement the table cannot make.

use std::sync::Arc;
use std::time::Duration;

use super::Checked;
use super::exec::execute;
use crate::backend::{Backend, HeldConn};
use crate::config::Event;
use crate::delivery::{Outcome, Settle};
use crate::dialect::{Args, DeadSql, Stmt};

/// A queue's dead letter, rendered for its form.
#[derive(Debug)]
pub(crate) struct Dead {
    pub(crate) sql: DeadSql,
    /// The dead-letter group, for a group dead letter.
    pub(crate) group: Option<Arc<str>>,
}

impl Dead {
    /// Moves the row `args` names on `conn`: whether it was moved (a lease form's move finds no
    /// row when the lease was lost). A copy-then-delete runs in the transaction `conn` is in, or
    /// in one of its own, committed only when the delete removed the row.
    pub(crate) async fn run<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        args: &Args<'_>,
    ) -> Result<bool, sqlx::Error> {
        let args = Args {
            dead_group: self.group.as_deref(),
            ..*args
        };
        match &self.sql {
            DeadSql::One(stmt) => Ok(execute::<DB>(conn, stmt, &args).await? > 0),
            DeadSql::CopyDelete { copy, delete } => {
                let own = conn.depth() == 0;
                if own {
                    conn.begin(None).await?;
                }
                execute::<DB>(conn, copy, &args).await?;
                let moved = execute::<DB>(conn, delete, &args).await? > 0;
                if own {
                    if moved {
                        conn.commit().await?;
                    } else {
                        conn.rollback().await?;
                    }
                }
                Ok(moved)
            }
        }
    }
}

/// A queue's own settlement statements ([`Queue::custom`](crate::Queue::custom)).
#[derive(Debug, Default)]
pub(crate) struct Custom(Vec<(Event, Stmt)>);

impl Custom {
    pub(crate) fn new(statements: Vec<(Event, Stmt)>) -> Self {
        Custom(statements)
    }

    /// The statement that replaces the crate's for `settle`, if the queue has one.
    pub(crate) fn get(&self, settle: Settle) -> Option<&Stmt> {
        let event = match settle {
            Settle::Ack => Event::Ack,
            Settle::Drop | Settle::Undecodable => Event::Drop,
            Settle::Retry | Settle::Fail => Event::Retry,
            Settle::RetryAfter(_) => Event::RetryAfter,
            Settle::DeadLetter => Event::DeadLetter,
        };
        self.0
            .iter()
            .find_map(|(e, stmt)| (*e == event).then_some(stmt))
    }

    pub(crate) fn statements(&self) -> impl Iterator<Item = &Stmt> {
        self.0.iter().map(|(_, stmt)| stmt)
    }
}

/// The values of a settlement of row `id` by `outcome`: the time, the delay, the groups.
pub(crate) fn settlement_args<'a>(checked: &'a Checked, id: i64, outcome: Outcome) -> Args<'a> {
    let at = match outcome.0 {
        Settle::RetryAfter(delay) => Some(checked.clock.after(delay)),
        _ => None,
    };
    Args {
        id,
        now: Some(checked.clock.now()),
        at,
        group: checked.group.as_deref(),
        dead_group: checked.dead.as_ref().and_then(|dead| dead.group.as_deref()),
        ..Args::default()
    }
}

/// Logs that a row asked to be dead-lettered on a queue without a dead letter: it is dropped.
pub(crate) fn no_dead_letter(table: &str, id: i64) {
    tracing::error!(
        "row {id} of `{table}` was settled with dead_letter() but its queue has no dead letter: \
         dropped"
    );
}

/// Warns that `retry_after(delay)` is taken as a retry on a table without the column.
pub(crate) fn no_retry_after(table: &str, delay: Duration) {
    tracing::warn!("table `{table}` has no retry_after column: retry_after({delay:?}) is a retry");
}
