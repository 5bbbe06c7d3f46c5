//! A periodic job's tick, enqueued: the schedules table's row of each schedule holds the last tick
//! fired, and a tick is fired by the transaction whose compare-and-set moves it forward — that
//! transaction, and no other, enqueues the tick's job, with the unique key `name@tick`.
//!
//! The unique key alone cannot keep a tick to one job: it holds only while the job is unfinished
//! (the index is partial on unfinished rows, MySQL/MariaDB clear a finished row's key, and a
//! finished job is usually deleted), so a runner that reached a tick late — its clock behind, a
//! pause, a restart — would enqueue a tick whose job another runner enqueued and finished
//! already. The row's `last_tick` outlives the job. The runner (`runner::schedule`) decides when
//! a tick is due; what a tick writes is here.

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::Connection as _;

use super::unique_job::Enqueued;
use super::{Job, bound};
use crate::backend::Backend;
use crate::dialect::{self, Args, Names, Stmt, TickSql, unique_sql};
use crate::error::{Error, Result, SchemaError};
use crate::table::{Dialect, Table};

/// A schedules table: where every schedule of a runner records its last tick.
#[derive(Debug, Clone)]
pub(crate) struct Ticks {
    table: String,
    sql: TickSql,
}

/// What a tick's transaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fired {
    /// This transaction fired the tick: its job, as the unique enqueue found it (a job of the
    /// tick still unfinished, after the schedule's row was reset, is [`Enqueued::Duplicate`]).
    Enqueued(Enqueued),
    /// The tick, or a later one, was fired already: nothing was written.
    Already,
    /// The tick was due but no job was made for it (its job function failed): nothing was
    /// written, so another runner may fire it.
    NoJob,
}

impl Ticks {
    /// The schedules table `table` (a name, optionally qualified) on `dialect`.
    pub(crate) fn new(dialect: Dialect, table: &str, unprepared: bool) -> Result<Self> {
        let quoted = dialect.quote_table(table)?;
        Ok(Ticks {
            table: table.to_owned(),
            sql: dialect::ticks(dialect, &quoted, unprepared),
        })
    }

    /// Prepares the statements on `conn`: a missing table or column is an [`Error::Schema`]
    /// naming the table, for schedule `label`.
    pub(crate) async fn check<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        label: &str,
    ) -> Result<()> {
        for stmt in [&self.sql.seed, &self.sql.last, &self.sql.advance] {
            prepare::<DB>(conn, stmt).await.map_err(|error| {
                let reason = "the schedules table needs the columns `name` (text, its primary \
                              key) and `last_tick` (a time): create it with `Runner::schema` \
                              (the guide's \"periodic\" page shows it), or name yours with \
                              `Runner::schedules_table`";
                let fix = dialect::schema::schedules_table(DB::DIALECT, &self.table)
                    .ok()
                    .map(|sql| format!("{sql};"));
                schema_error(label, &self.table, stmt, reason.to_owned(), error).with_fix(fix)
            })?;
        }
        Ok(())
    }

    /// The last tick of schedule `name`, inserting its row with `now` when it has none (a new
    /// schedule: `None`).
    pub(crate) async fn last<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        name: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>> {
        if self.seed::<DB>(conn, name, now).await? {
            return Ok(None);
        }
        let args = Args {
            schedule: Some(name),
            ..Args::default()
        };
        let rows = DB::fetch_all(conn, bound::<DB>(&self.sql.last, &args)).await?;
        // A row deleted since the insert: the schedule starts anew.
        rows.first()
            .map(|row| DB::get_time(row, 0))
            .transpose()
            .map_err(Error::Database)
    }

    /// Inserts schedule `name`'s row with `last_tick` `at`, unless it has one: whether it did.
    async fn seed<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        name: &str,
        at: DateTime<Utc>,
    ) -> Result<bool> {
        let args = Args {
            schedule: Some(name),
            tick: Some(at),
            ..Args::default()
        };
        match DB::execute(conn, bound::<DB>(&self.sql.seed, &args)).await {
            Ok(n) => Ok(n > 0),
            // MySQL/MariaDB: the row is there (an error that ends the statement alone, not the
            // transaction it may run in).
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(false),
            Err(error) => Err(error.into()),
        }
    }
}

/// The unique key of schedule `name`'s job of `tick`: `name@` and the tick in RFC 3339, UTC,
/// with as many fractional digits as it has (`nightly@2026-03-29T01:00:00Z`).
pub(crate) fn tick_key(name: &str, tick: DateTime<Utc>) -> String {
    format!(
        "{name}@{}",
        tick.to_rfc3339_opts(SecondsFormat::AutoSi, true)
    )
}

impl Table {
    /// Refuses a table that cannot take a schedule's jobs: one without a unique key column
    /// ([`Error::Declaration`] for schedule `label`), or whose insert of a unique job the
    /// database refuses ([`Error::Schema`]: a missing table or column, no unique index on the
    /// key).
    pub(crate) async fn check_ticks<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        label: &str,
    ) -> Result<()> {
        let names = Names::of_table(DB::DIALECT, self)?;
        let Some(key) = names.unique_key.as_deref() else {
            return Err(Error::declaration(
                label,
                format!(
                    "a schedule's jobs carry the unique key `name@tick`: declare the unique key \
                     column of table `{}` with `Table::unique_key(..)`",
                    self.name
                ),
            ));
        };
        let insert = unique_sql::insert(&names, key, 1);
        prepare::<DB>(conn, &insert).await.map_err(|error| {
            let reason = format!(
                "a schedule's jobs go into this table with a unique key: it needs the declared \
                 columns, and a unique index on `{}` alone (partial on unfinished rows where the \
                 table keeps them)",
                self.unique_key.as_deref().unwrap_or_default()
            );
            // The index alone where the table is there without it; else the whole table.
            let fix = if super::unique::no_unique_index(&error) {
                dialect::schema::unique_index(DB::DIALECT, self)
            } else {
                let mut plan = dialect::schema::Plan::default();
                plan.queue(self, None, None).ok();
                dialect::schema::fix_for(DB::DIALECT, &plan, &self.name)
            };
            schema_error(label, &self.name, &insert, reason, error).with_fix(fix)
        })
    }

    /// Fires `tick` of schedule `name`, in one transaction on `conn`: moves the schedule's last
    /// tick forward to `tick` (or inserts its row, when it has none) — which fails when this
    /// tick or a later one was fired — and
    /// enqueues the job `make` builds, with the unique key [`tick_key`]. `make` runs only when the
    /// tick is this transaction's; `None` rolls it back.
    pub(crate) async fn enqueue_tick<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        ticks: &Ticks,
        name: &str,
        tick: DateTime<Utc>,
        make: impl FnOnce() -> Option<Job<'static>>,
    ) -> Result<Fired> {
        let mut tx = match dialect::begin_write(DB::DIALECT) {
            Some(begin) => conn.begin_with(begin).await?,
            None => conn.begin().await?,
        };
        let args = Args {
            schedule: Some(name),
            tick: Some(tick),
            ..Args::default()
        };
        let advanced = DB::execute(&mut tx, bound::<DB>(&ticks.sql.advance, &args)).await? > 0;
        // A schedule whose row was deleted while it ran: the first tick puts it back.
        if !advanced && !ticks.seed::<DB>(&mut tx, name, tick).await? {
            tx.rollback().await?;
            return Ok(Fired::Already);
        }
        let Some(job) = make() else {
            tx.rollback().await?;
            return Ok(Fired::NoJob);
        };
        let job = job.unique(tick_key(name, tick));
        let done = self
            .many_unique_on::<DB>(&mut tx, std::slice::from_ref(&job))
            .await?;
        tx.commit().await?;
        Ok(Fired::Enqueued(done[0]))
    }
}

async fn prepare<DB: Backend>(conn: &mut DB::Connection, stmt: &Stmt) -> sqlx::Result<()> {
    DB::prepare(conn, stmt.sql(), &stmt.kinds(), stmt.unprepared).await
}

fn schema_error(
    label: &str,
    table: &str,
    stmt: &Stmt,
    reason: String,
    source: sqlx::Error,
) -> Error {
    Error::Schema(Box::new(SchemaError {
        queue: label.to_owned(),
        table: table.to_owned(),
        column: None,
        statement: Some(stmt.text().to_owned()),
        reason,
        fix: None,
        source: Some(source),
    }))
}
