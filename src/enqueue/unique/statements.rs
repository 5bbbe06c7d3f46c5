//! The statements of one round of a unique enqueue, each with its error paths: the insert of the
//! jobs whose keys are free, the read of the rows that hold the others, and the update that
//! meets a holder by its job's policy.

use std::collections::HashMap;

use chrono::{DateTime, TimeDelta, Utc};
use sqlx::{AssertSqlSafe, SqlSafeStr as _};

use super::super::bound;
use super::super::unique_job::{Enqueued, OnDuplicate, UniqueJob};
use crate::backend::{self, Backend, Clock, InsertFailed};
use crate::dialect::{self, Args, Change, Names, unique_sql};
use crate::error::{Error, Result, SchemaError};
use crate::table::{Dialect, Table, Value};

/// A key's unfinished row: its id and creation time.
pub(super) struct Holder {
    id: i64,
    created: Option<DateTime<Utc>>,
}

impl Table {
    /// Inserts the jobs `open` whose keys are free, returning their ids by key.
    pub(super) async fn insert_free<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        names: &Names,
        key_column: &str,
        jobs: &[UniqueJob<'_>],
        open: &[usize],
        clock: &Clock,
    ) -> Result<HashMap<String, i64>> {
        // In the order of their keys, as every enqueue inserts them: two inserts of the same
        // keys never wait for each other's index entries in turn (a deadlock).
        let mut open = open.to_vec();
        open.sort_by(|&a, &b| jobs[a].key().cmp(jobs[b].key()));
        if DB::DIALECT == Dialect::MySql && open.len() > 1 {
            // One taken key fails MySQL's whole insert: insert the keys found free.
            let keys: Vec<&str> = open.iter().map(|&i| jobs[i].key()).collect();
            let held = self.holders::<DB>(conn, names, key_column, &keys).await?;
            open.retain(|&i| !held.contains_key(jobs[i].key()));
            if open.is_empty() {
                return Ok(HashMap::new());
            }
        }
        let headers: Vec<Option<String>> =
            open.iter().map(|&i| jobs[i].job.headers_text()).collect();
        let mut values = Vec::with_capacity(open.len() * (self.values_per_job() + 1) + 2);
        for (&i, headers) in open.iter().zip(&headers) {
            let job = &jobs[i];
            values.push(Value::Bytes(&job.job.payload));
            if names.group.is_some() {
                values.push(Value::Text(job.job.group.as_deref()));
            }
            if names.retry_after.is_some() {
                values.push(Value::Time(first_due(job, clock)));
            }
            if names.priority.is_some() {
                values.push(Value::I64(job.job.priority));
            }
            if names.headers.is_some() {
                values.push(Value::Text(headers.as_deref()));
            }
            values.push(Value::Text(Some(job.key())));
        }
        if names.notify && DB::DIALECT == Dialect::Postgres {
            values.push(Value::Text(Some(&names.table)));
            values.push(Value::Text(Some("")));
        }
        let text = unique_sql::insert(names, key_column, open.len())
            .text()
            .to_owned();
        let bytes = text.len() + values.iter().map(Value::size).sum::<usize>();
        self.refuse_too_large::<DB>(bytes)?;
        let query = || {
            let sql = AssertSqlSafe(text.clone()).into_sql_str();
            backend::query::<DB>(sql, values.iter().cloned()).persistent(!names.unprepared)
        };
        let q = query();
        if DB::DIALECT != Dialect::MySql {
            let again = (DB::DIALECT == Dialect::Sqlite).then(query);
            let rows = match (DB::fetch_all(conn, q).await, again) {
                // A SQLite connection prepares with the schema it last read: one that has not
                // read it since the unique index was created finds no index for the conflict
                // target. A statement that runs renews it: a write that changes nothing, so
                // that in the caller's transaction the snapshot it begins holds the write lock
                // (a read would begin one that the insert could not upgrade once another
                // connection wrote: "database is locked").
                (Err(error), Some(again)) if no_unique_index(&error) => {
                    let renew = format!(
                        "UPDATE {} SET {id} = {id} WHERE 0",
                        names.table,
                        id = names.id
                    );
                    let renew = AssertSqlSafe(renew).into_sql_str();
                    DB::execute(conn, backend::query::<DB>(renew, [])).await?;
                    DB::fetch_all(conn, again).await
                }
                (rows, _) => rows,
            }
            .map_err(|error| self.explain_unique::<DB>(error, &text, bytes))?;
            return rows
                .iter()
                .map(|row| Ok((DB::get_text(row, 1)?, DB::get_i64(row, 0)?)))
                .collect::<Result<_, sqlx::Error>>()
                .map_err(Error::Database);
        }
        let inserted = if open.len() == 1 {
            DB::insert_id_on(conn, q).await
        } else {
            DB::execute(conn, q)
                .await
                .map(|_| 0)
                .map_err(InsertFailed::from)
        };
        match inserted {
            Ok(id) if open.len() == 1 => Ok(HashMap::from([(jobs[open[0]].key().to_owned(), id)])),
            Ok(_) => {
                let keys: Vec<&str> = open.iter().map(|&i| jobs[i].key()).collect();
                let held = self.holders::<DB>(conn, names, key_column, &keys).await?;
                Ok(held.into_iter().map(|(k, h)| (k, h.id)).collect())
            }
            // Taken meanwhile: nothing was inserted; the keys are read next.
            Err(InsertFailed::Driver(sqlx::Error::Database(e))) if e.is_unique_violation() => {
                Ok(HashMap::new())
            }
            Err(InsertFailed::Driver(error)) => Err(self.explain_unique::<DB>(error, &text, bytes)),
            Err(failed) => Err(self.insert_failed::<DB>(failed, &text, bytes)),
        }
    }

    /// The unfinished rows that hold `keys`, by key.
    pub(super) async fn holders<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        names: &Names,
        key_column: &str,
        keys: &[&str],
    ) -> Result<HashMap<String, Holder>> {
        let text = unique_sql::holders(names, key_column, keys.len());
        let sql = AssertSqlSafe(text).into_sql_str();
        let values = keys.iter().map(|k| Value::Text(Some(*k)));
        let q = backend::query::<DB>(sql, values).persistent(!names.unprepared);
        let rows = DB::fetch_all(conn, q).await?;
        let with_created = names.created_at.is_some();
        let mut held = HashMap::with_capacity(rows.len());
        for row in &rows {
            let created = if with_created {
                Some(DB::get_time(row, 2)?)
            } else {
                None
            };
            held.insert(
                DB::get_text(row, 1)?,
                Holder {
                    id: DB::get_i64(row, 0)?,
                    created,
                },
            );
        }
        Ok(held)
    }

    /// Applies `job`'s policy to the row that holds its key.
    pub(super) async fn meet<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        names: &Names,
        job: &UniqueJob<'_>,
        holder: &Holder,
        clock: &Clock,
    ) -> Result<Enqueued> {
        let (change, at, done): (_, _, fn(i64) -> Enqueued) = match job.on_duplicate {
            OnDuplicate::Skip => return Ok(Enqueued::Duplicate(holder.id)),
            OnDuplicate::Replace => (
                Change::Replace,
                job.job.delay.map(|delay| clock.after(delay)),
                Enqueued::Replaced,
            ),
            OnDuplicate::Debounce { wait, max } => {
                let latest = holder
                    .created
                    .and_then(|created| Some(created + TimeDelta::from_std(max).ok()?));
                let due = clock.after(wait);
                (
                    Change::Debounce,
                    Some(latest.map_or(due, |latest| due.min(latest))),
                    Enqueued::Debounced,
                )
            }
        };
        let update = dialect::unique_sql::update(names, change);
        let headers = job.job.headers_text();
        let args = Args {
            id: holder.id,
            payload: &job.job.payload,
            headers: headers.as_deref(),
            priority: job.job.priority,
            at,
            now: Some(clock.now()),
            ..Args::default()
        };
        let lock = unique_sql::lock(names);
        let changed = match &lock {
            None => DB::execute(conn, bound::<DB>(&update, &args)).await?,
            Some(lock) => {
                // MySQL/MariaDB: the row's lock first, passed over when a claim holds it.
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                let locked = backend::fetch_i64::<DB>(&mut *tx, bound::<DB>(lock, &args)).await?;
                let changed = match locked {
                    Some(_) => DB::execute(&mut *tx, bound::<DB>(&update, &args)).await?,
                    None => 0,
                };
                tx.commit().await?;
                changed
            }
        };
        Ok(if changed > 0 {
            done(holder.id)
        } else {
            Enqueued::InWork(holder.id)
        })
    }

    /// The insert's error, where a unique index that does not match says so.
    fn explain_unique<DB: Backend>(
        &self,
        error: sqlx::Error,
        statement: &str,
        bytes: usize,
    ) -> Error {
        if !no_unique_index(&error) {
            return self.explain::<DB>(error, statement, bytes);
        }
        Error::Schema(Box::new(SchemaError {
            queue: self.name.clone(),
            table: self.name.clone(),
            column: self.unique_key.clone(),
            statement: Some(statement.to_owned()),
            reason: "the unique key column has no unique index the insert can use: create one \
                     on the column alone (partial on unfinished rows where the table keeps \
                     them: `WHERE processed_at IS NULL`)"
                .to_owned(),
            fix: dialect::schema::unique_index(DB::DIALECT, self),
            source: Some(error),
        }))
    }
}

/// Whether `error` says the conflict target has no unique index (PostgreSQL, SQLite).
pub(in crate::enqueue) fn no_unique_index(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(e) => {
            e.code().as_deref() == Some("42P10")
                || e.message()
                    .contains("does not match any PRIMARY KEY or UNIQUE constraint")
        }
        _ => false,
    }
}

/// When a new unique job is due: after its delay, or a debounce's wait.
fn first_due(job: &UniqueJob<'_>, clock: &Clock) -> Option<DateTime<Utc>> {
    match job.on_duplicate {
        OnDuplicate::Debounce { wait, .. } => Some(clock.after(wait)),
        _ => job.job.delay.map(|delay| clock.after(delay)),
    }
}
