//! The advisory lock form: a session lock on the row's key holds the row while its handler runs.
//!
//! Keys are made of the table's identity as the catalog resolves it (`schema::Identity`), never
//! of its spelling: on PostgreSQL a `bigint`, the table's class (FNV-1a, 32 bits, of its resolved
//! name: `table` in `public`, else `schema.table`) in its high half and the id's low 32 bits in
//! its low half; on MySQL/MariaDB the lock name `<database>.<table>:<id>` (`sqlxq:` and its MD5
//! when longer than 64 characters); on SQLite a key held in this process (one process per
//! database file), of the file and the table's name. A collision between two rows' keys
//! only makes one wait for the other; it never lets a row be delivered twice.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use super::held::{Conns, HeldConn, Key, held_in_process, held_in_process_count, take_in_process};
use super::row_lock::no_retry_after;
use super::{ClaimFailed, Clock, Custom, Dead, no_dead_letter};
use crate::backend::{Backend, ClaimedRow, query};
use crate::delivery::{Outcome, Settle};
use crate::dialect::{AdvisorySql, Args};
use crate::error::Result;

/// How a table's keys are made.
#[derive(Debug, Clone)]
pub(crate) enum Keys {
    Postgres { class: i64 },
    MySql { prefix: String },
    InProcess { table: u64 },
}

impl Keys {
    /// `resolved`: the table's resolved name.
    pub(crate) fn postgres(resolved: &str) -> Self {
        Keys::Postgres {
            class: i64::from(fnv1a_32(resolved)),
        }
    }

    /// `table`: `database.table` as the catalog spells them.
    pub(crate) fn mysql(table: &str) -> Self {
        Keys::MySql {
            prefix: format!("{table}:"),
        }
    }

    /// `identity`: the database file and the table's name.
    pub(crate) fn in_process(identity: &str) -> Self {
        Keys::InProcess {
            table: fnv1a_64(identity),
        }
    }

    /// The PostgreSQL key of row `id`.
    fn key(&self, id: i64) -> i64 {
        match self {
            Keys::Postgres { class } => (class << 32) | (id & 0xffff_ffff),
            _ => 0,
        }
    }

    fn args(&self, id: i64) -> Args<'_> {
        match self {
            Keys::Postgres { class } => Args {
                id,
                key: self.key(id),
                key_class: *class,
                ..Args::default()
            },
            Keys::MySql { prefix } => Args {
                id,
                key_prefix: Some(prefix),
                ..Args::default()
            },
            Keys::InProcess { .. } => Args {
                id,
                ..Args::default()
            },
        }
    }
}

/// The 32-bit FNV-1a hash: stable across processes, versions and platforms.
pub(crate) fn fnv1a_32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |hash: u32, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

fn fnv1a_64(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash: u64, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The advisory lock form of one mounted queue.
#[derive(Debug)]
pub(crate) struct AdvisoryForm {
    pub(crate) sql: AdvisorySql,
    pub(crate) keys: Keys,
    pub(crate) group: Option<Arc<str>>,
    pub(crate) with_attempt: bool,
    pub(crate) clock: Clock,
    pub(crate) table: Arc<str>,
    pub(crate) dead: Option<Dead>,
    pub(crate) custom: Custom,
}

impl AdvisoryForm {
    /// Ids of claimable rows whose keys no session holds, in claim order (twice what is wanted,
    /// as some may be taken meanwhile).
    async fn candidates<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        want: usize,
        now: DateTime<Utc>,
        excluded: &[i64],
    ) -> Result<VecDeque<i64>, sqlx::Error> {
        // SQLite's keys are held in this process, not skipped by the query: list past them.
        let held = match self.keys {
            Keys::InProcess { table } => held_in_process_count(table),
            _ => 0,
        };
        let args = Args {
            now: Some(now),
            group: self.group.as_deref(),
            limit: i64::try_from(want * 2 + 2 + held).unwrap_or(i64::MAX),
            excluded,
            ..self.keys.args(0)
        };
        let candidates = match excluded {
            [] => &self.sql.candidates,
            _ => &self.sql.candidates_excluding,
        };
        let ids = DB::fetch_i64s(conn, query(candidates, &args)).await?;
        Ok(match self.keys {
            Keys::InProcess { table } => ids
                .into_iter()
                .filter(|id| !held_in_process(table, *id))
                .collect(),
            _ => ids.into(),
        })
    }

    /// Takes up to `limit` rows on one connection, which holds all their keys: an advisory
    /// batch, whose rows settle one by one.
    pub(crate) async fn claim_batch<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        limit: usize,
        excluded: &[i64],
    ) -> Result<(Vec<ClaimedRow>, HeldConn<DB>), ClaimFailed> {
        let now = self.clock.now();
        let mut conn = HeldConn::new(conns.get().await?);
        let candidates = self
            .candidates::<DB>(&mut conn, limit, now, excluded)
            .await?;
        let candidates = Mutex::new(candidates);
        let mut rows = Vec::with_capacity(limit);
        while rows.len() < limit {
            match self.take_on(&mut conn, &candidates, now).await? {
                Some(row) => rows.push(row),
                None => break,
            }
        }
        Ok((rows, conn))
    }

    /// Takes one row, on a connection that then holds its key: the claim of worker `index` of
    /// `workers`. One query lists candidates whose keys no session holds; the worker then locks
    /// the next candidate without waiting, and checks the row is still claimable now that it
    /// holds the key (another session may have settled it meanwhile). The workers list the same candidates (as many as there are workers, twice
    /// over); each starts at its own place in the list, so they seldom race for one key.
    pub(crate) async fn claim_one<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        index: usize,
        workers: usize,
        excluded: &[i64],
    ) -> Result<Option<(ClaimedRow, HeldConn<DB>)>, ClaimFailed> {
        let now = self.clock.now();
        let mut conn = HeldConn::new(conns.get().await?);
        let mut candidates = self
            .candidates::<DB>(&mut conn, workers, now, excluded)
            .await?;
        if !candidates.is_empty() {
            let start = index % candidates.len();
            candidates.rotate_left(start);
        }
        let candidates = Mutex::new(candidates);
        match self.take_on(&mut conn, &candidates, now).await? {
            Some(row) => Ok(Some((row, conn))),
            None => {
                conns.put_held(conn);
                Ok(None)
            }
        }
    }

    /// Takes the next candidate whose key `conn` gets, and holds it there. A take that fails for
    /// a reason of the row's own releases its key and names the row.
    async fn take_on<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        candidates: &Mutex<VecDeque<i64>>,
        now: DateTime<Utc>,
    ) -> Result<Option<ClaimedRow>, ClaimFailed> {
        loop {
            let Some(id) = candidates
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front()
            else {
                return Ok(None);
            };
            if !self.lock(conn, id).await? {
                continue;
            }
            let args = Args {
                now: Some(now),
                group: self.group.as_deref(),
                ..self.keys.args(id)
            };
            let taken = async {
                let row =
                    DB::fetch_claimed(&mut *conn, query(&self.sql.take, &args), self.with_attempt)
                        .await?
                        .pop();
                if let (Some(_), Some(count)) = (&row, &self.sql.count) {
                    DB::execute(&mut *conn, query(count, &args)).await?;
                }
                Ok::<_, sqlx::Error>(row)
            };
            match taken.await {
                Ok(Some(row)) => return Ok(Some(row)),
                // Settled by another session since the candidates were listed.
                Ok(None) => self.unlock(conn, id).await?,
                Err(error) => {
                    if crate::backend::is_row_error(&error) {
                        self.unlock(conn, id).await?;
                    }
                    return Err(ClaimFailed {
                        row: Some(id),
                        error,
                    });
                }
            }
        }
    }

    /// What the connection records for row `id`'s key.
    fn key_of(&self, id: i64) -> Key {
        match self.keys {
            Keys::InProcess { table } => Key::InProcess(table, id),
            _ => Key::Session(id),
        }
    }

    /// Takes row `id`'s key on `conn` without waiting.
    async fn lock<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        id: i64,
    ) -> Result<bool, sqlx::Error> {
        match (&self.keys, &self.sql.lock) {
            (Keys::InProcess { table }, _) => {
                let taken = take_in_process(*table, id);
                if taken {
                    conn.hold_key(Key::InProcess(*table, id));
                }
                Ok(taken)
            }
            (keys, Some(lock)) => {
                // Marked first: if the answer is lost, the connection is closed, not reused.
                conn.hold_key(Key::Session(id));
                let taken = DB::fetch_i64(conn, query(lock, &keys.args(id))).await? == Some(1);
                if !taken {
                    conn.release_key(Key::Session(id));
                }
                Ok(taken)
            }
            (_, None) => unreachable!("server keys have a lock statement"),
        }
    }

    /// Releases row `id`'s key. An unlock the server does not confirm is an error: the
    /// connection, whose lock state is then unknown, is closed when it is dropped.
    pub(crate) async fn unlock<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        id: i64,
    ) -> Result<(), sqlx::Error> {
        if let Some(unlock) = &self.sql.unlock {
            let released = DB::fetch_i64(conn, query(unlock, &self.keys.args(id))).await?;
            if released != Some(1) {
                return Err(sqlx::Error::Protocol(format!(
                    "the advisory key of row {id} of `{}` was not held at unlock",
                    self.table
                )));
            }
        }
        conn.release_key(self.key_of(id));
        Ok(())
    }

    /// Settles row `id` on the session holding its key (each statement commits on its own, or
    /// with the delivery's transaction when `conn` is in one), then releases the key. A statement
    /// that fails still releases the key, and the row returns as it was.
    pub(crate) async fn settle<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        id: i64,
        outcome: Outcome,
    ) -> Result<()> {
        let mut args = Args {
            id,
            now: Some(self.clock.now()),
            group: self.group.as_deref(),
            dead_group: self.dead.as_ref().and_then(|dead| dead.group.as_deref()),
            ..Args::default()
        };
        if let Settle::RetryAfter(delay) = outcome.0 {
            args.at = Some(self.clock.after(delay));
        }
        let mut settled = match (self.custom.get(outcome.0), &self.dead, outcome.0) {
            (Some(custom), _, _) => DB::execute(conn, query(custom, &args)).await.map(drop),
            (None, Some(dead), Settle::DeadLetter) => dead.run(conn, &args).await.map(drop),
            (None, _, settle) => match self.statement(settle, id) {
                Some(stmt) => DB::execute(conn, query(stmt, &args)).await.map(drop),
                None => Ok(()),
            },
        };
        // A transactional ack settles in the delivery's transaction: it ends before the unlock.
        if conn.depth() > 0 {
            settled = match settled {
                Ok(()) => conn.commit().await,
                Err(error) => conn.rollback().await.and(Err(error)),
            };
        }
        let unlocked = self.unlock(conn, id).await;
        settled?;
        unlocked?;
        Ok(())
    }

    /// The crate's own statement for `settle` (a move to a dead letter runs apart).
    fn statement(&self, settle: Settle, id: i64) -> Option<&crate::dialect::Stmt> {
        match settle {
            Settle::DeadLetter => {
                no_dead_letter(&self.table, id);
                Some(&self.sql.finish)
            }
            Settle::Ack | Settle::Drop | Settle::Undecodable => Some(&self.sql.finish),
            Settle::Retry => None,
            Settle::RetryAfter(delay) => {
                if self.sql.retry_after.is_none() {
                    no_retry_after(&self.table, delay);
                }
                self.sql.retry_after.as_ref()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_separate_tables() {
        // FNV-1a test vectors.
        assert_eq!(fnv1a_32(""), 0x811c_9dc5);
        assert_eq!(fnv1a_32("a"), 0xe40c_292c);
        let jobs = Keys::postgres("jobs");
        let mail = Keys::postgres("mail_jobs");
        assert_ne!(jobs.key(7), mail.key(7));
        assert_ne!(jobs.key(7), jobs.key(8));
        assert_eq!(jobs.key(7) & 0xffff_ffff, 7);
        assert_eq!(jobs.key(7) >> 32, Keys::postgres("jobs").key(1) >> 32);
    }

    #[test]
    fn mysql_lock_names_carry_the_database() {
        let Keys::MySql { prefix } = Keys::mysql("shop.jobs") else {
            panic!()
        };
        assert_eq!(prefix, "shop.jobs:");
    }
}
