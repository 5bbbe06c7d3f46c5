//! Unique jobs: one unfinished job per key, kept by the table's unique index, and what an enqueue
//! of a key already taken does — skip, replace or debounce.
//!
//! One enqueue, top to bottom: the insert of every job whose key is free (a taken key inserts
//! nothing: `ON CONFLICT DO NOTHING`, or MySQL/MariaDB's duplicate-key error, after which the
//! keys are read and only the free ones inserted); then the rows that hold the other keys are
//! read, and each job's policy is applied to its key's row — an update that changes nothing of a
//! job in work. A key freed meanwhile (its row finished between the insert and the read) goes
//! round again. The index decides every race; no statement is a check that an insert trusts.

use std::collections::HashMap;

use chrono::{DateTime, TimeDelta, Utc};
use futures::future::BoxFuture;
use sqlx::{Acquire, AssertSqlSafe, SqlSafeStr as _};

use super::unique_job::{Enqueued, OnDuplicate, UniqueJob};
use super::wake;
use crate::backend::{self, Backend, Clock, InsertFailed};
use crate::dialect::{self, Args, Change, Names, unique_sql};
use crate::error::{Error, Result, SchemaError};
use crate::table::{Dialect, Table, Value};

/// How often a key is looked for again when it was freed between the insert and the read.
const ROUNDS: usize = 8;

/// A key's unfinished row: its id and creation time.
struct Holder {
    id: i64,
    created: Option<DateTime<Utc>>,
}

impl Table {
    /// Inserts a unique job unless an unfinished job of the table holds its key, and says what
    /// happened. Pass the caller's transaction (`&mut *tx`) to make the job commit with the data
    /// it serves (a rollback leaves the key free), or a pool.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(pool: sqlx::SqlitePool) -> sqlx_queue::Result<()> {
    /// use sqlx_queue::{Enqueued, Job, Table};
    ///
    /// // CREATE TABLE jobs (.., dedupe TEXT UNIQUE)
    /// let jobs = Table::new("jobs").unique_key("dedupe");
    /// match jobs.enqueue_unique(&pool, Job::new("hi").unique("welcome:42")).await? {
    ///     Enqueued::New(id) => println!("queued {id}"),
    ///     other => println!("already queued: {}", other.id()),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Table::enqueue); [`Error::InvalidJob`] on a table without a unique key
    /// column, or a debounce without `retry_after` and `created_at` columns;
    /// [`Error::UniqueKeyHidden`] when the key's row stays out of the caller's transaction's
    /// sight.
    pub fn enqueue_unique<'e, 'c: 'e, DB, A>(
        &'e self,
        conn: A,
        job: UniqueJob<'e>,
    ) -> BoxFuture<'e, Result<Enqueued>>
    where
        DB: Backend,
        A: Acquire<'c, Database = DB> + Send + 'e,
    {
        // Boxed, as sqlx's own executor methods are: an opaque future generic over the
        // connection's lifetimes would keep a handler that enqueues through `&mut *d.tx()` from
        // being `Send` (rust-lang/rust#100013).
        Box::pin(async move {
            let done = self.many_unique(conn, std::slice::from_ref(&job)).await?;
            Ok(done[0])
        })
    }

    /// Enqueues many unique jobs, each by its own policy, in order (a key given twice meets the
    /// job the first made), returning what happened to each. Jobs whose keys are free take one
    /// insert together (at most [`max_batch`](Table::max_batch)); the others a read of the rows
    /// that hold their keys, and one update each for a replace or debounce.
    ///
    /// # Errors
    ///
    /// As [`enqueue_unique`](Table::enqueue_unique) and
    /// [`enqueue_many`](Table::enqueue_many). Outside a transaction, jobs enqueued before an
    /// error stay.
    pub fn enqueue_many_unique<'e, 'c: 'e, DB, A>(
        &'e self,
        conn: A,
        jobs: &'e [UniqueJob<'_>],
    ) -> BoxFuture<'e, Result<Vec<Enqueued>>>
    where
        DB: Backend,
        A: Acquire<'c, Database = DB> + Send + 'e,
    {
        Box::pin(self.many_unique(conn, jobs))
    }

    async fn many_unique<'c, DB, A>(&self, conn: A, jobs: &[UniqueJob<'_>]) -> Result<Vec<Enqueued>>
    where
        DB: Backend,
        A: Acquire<'c, Database = DB>,
    {
        let names = Names::of_table(DB::DIALECT, self)?;
        let Some(key_column) = names.unique_key.clone() else {
            return Err(Error::invalid_job(
                &self.name,
                format!(
                    "a unique job needs a unique key column: declare it with \
                     `Table::unique_key(..)` on table `{}`",
                    self.name
                ),
            ));
        };
        for job in jobs {
            self.check_unique(job)?;
        }
        if jobs.len() > self.max_batch() {
            return Err(Error::invalid_job(
                &self.name,
                format!(
                    "{} jobs do not fit one statement: enqueue_many_unique takes at most {}",
                    jobs.len(),
                    self.max_batch()
                ),
            ));
        }
        let mut conn = conn.acquire().await?;
        let clock = Clock::default();
        let mut done: Vec<Option<Enqueued>> = vec![None; jobs.len()];
        for _ in 0..ROUNDS {
            // The first job of each key still open goes in; a key given again waits its turn.
            let mut seen = Vec::new();
            let open: Vec<usize> = (0..jobs.len())
                .filter(|&i| done[i].is_none())
                .filter(|&i| {
                    let fresh = !seen.contains(&jobs[i].key());
                    seen.push(jobs[i].key());
                    fresh
                })
                .collect();
            if open.is_empty() {
                break;
            }
            let inserted = self
                .insert_free::<DB>(&mut conn, &names, &key_column, jobs, &open, &clock)
                .await?;
            for &i in &open {
                if let Some(id) = inserted.get(jobs[i].key()) {
                    done[i] = Some(Enqueued::New(*id));
                }
            }
            let taken: Vec<usize> = open.into_iter().filter(|&i| done[i].is_none()).collect();
            if taken.is_empty() {
                continue;
            }
            let keys: Vec<&str> = taken.iter().map(|&i| jobs[i].key()).collect();
            let holders = self
                .holders::<DB>(&mut conn, &names, &key_column, &keys)
                .await?;
            for i in taken {
                // A key freed since the insert goes round again.
                if let Some(holder) = holders.get(jobs[i].key()) {
                    done[i] = Some(
                        self.meet::<DB>(&mut conn, &names, &jobs[i], holder, &clock)
                            .await?,
                    );
                }
            }
        }
        let mut woken: Vec<Option<&str>> = Vec::new();
        let mut out = Vec::with_capacity(jobs.len());
        for (job, done) in jobs.iter().zip(done) {
            let Some(done) = done else {
                return Err(Error::UniqueKeyHidden {
                    table: self.name.clone(),
                    key: job.key().to_owned(),
                });
            };
            let group = job.job.group.as_deref();
            if matches!(
                done,
                Enqueued::New(_) | Enqueued::Replaced(_) | Enqueued::Debounced(_)
            ) && !woken.contains(&group)
            {
                wake(&self.name, group);
                woken.push(group);
            }
            out.push(done);
        }
        Ok(out)
    }

    /// Inserts the jobs `open` whose keys are free, returning their ids by key.
    async fn insert_free<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        names: &Names,
        key_column: &str,
        jobs: &[UniqueJob<'_>],
        open: &[usize],
        clock: &Clock,
    ) -> Result<HashMap<String, i64>> {
        let mut open = open.to_vec();
        if DB::DIALECT == Dialect::MySql && open.len() > 1 {
            // One taken key fails MySQL's whole insert: insert the keys found free.
            let keys: Vec<&str> = open.iter().map(|&i| jobs[i].key()).collect();
            let held = self.holders::<DB>(conn, names, key_column, &keys).await?;
            open.retain(|&i| !held.contains_key(jobs[i].key()));
            if open.is_empty() {
                return Ok(HashMap::new());
            }
        }
        let mut values = Vec::with_capacity(open.len() * (self.values_per_job() + 1) + 2);
        for &i in &open {
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
            values.push(Value::Text(Some(job.key())));
        }
        if names.notify && DB::DIALECT == Dialect::Postgres {
            values.push(Value::Text(Some(&names.table)));
            values.push(Value::Text(Some("")));
        }
        let text = unique_sql::insert(names, key_column, open.len());
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
                // target. A read of the schema renews it.
                (Err(error), Some(again)) if no_unique_index(&error) => {
                    let renew = sqlx::SqlStr::from_static("SELECT 1 FROM sqlite_master LIMIT 1");
                    DB::fetch_all(conn, backend::query::<DB>(renew, [])).await?;
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
    async fn holders<DB: Backend>(
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
    async fn meet<DB: Backend>(
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
        let args = Args {
            id: holder.id,
            payload: &job.job.payload,
            priority: job.job.priority,
            at,
            now: Some(clock.now()),
            ..Args::default()
        };
        let lock = unique_sql::lock(names);
        let changed = match &lock {
            None => DB::execute(conn, run::<DB>(&update, &args)).await?,
            Some(lock) => {
                // MySQL/MariaDB: the row's lock first, passed over when a claim holds it.
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                let locked = backend::fetch_i64::<DB>(&mut *tx, run::<DB>(lock, &args)).await?;
                let changed = match locked {
                    Some(_) => DB::execute(&mut *tx, run::<DB>(&update, &args)).await?,
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

    /// Refuses a unique job this table cannot hold.
    fn check_unique(&self, job: &UniqueJob<'_>) -> Result<()> {
        self.check(&job.job)?;
        let refuse = |reason: String| Err(Error::invalid_job(&self.name, reason));
        if job.key.contains('\0') {
            return refuse(format!(
                "the unique key {:?} holds a NUL character",
                job.key
            ));
        }
        if matches!(job.on_duplicate, OnDuplicate::Debounce { .. })
            && (self.retry_after.is_none() || self.created_at.is_none())
        {
            return refuse(format!(
                "a debounced job needs a retry_after and a created_at column: declare them \
                 with `Table::retry_after(..)` and `Table::created_at(..)` on table `{}`",
                self.name
            ));
        }
        Ok(())
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
            source: Some(error),
        }))
    }
}

/// Whether `error` says the conflict target has no unique index (PostgreSQL, SQLite).
fn no_unique_index(error: &sqlx::Error) -> bool {
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

fn run<DB: Backend>(stmt: &dialect::Stmt, args: &Args<'_>) -> backend::Q<DB> {
    backend::query::<DB>(stmt.sql(), stmt.values(args)).persistent(!stmt.unprepared)
}
