//! MySQL/MariaDB: the named locks of a unique enqueue's keys (see `dialect::unique_sql::key_locks`
//! for why), taken in one order — sorted by name — before its statements and released after
//! them: after the crate's own transaction committed, or, inside the caller's, after its
//! savepoint (the caller's commit comes later; an enqueue of the key then waits in InnoDB alone).

use sqlx::{AssertSqlSafe, SqlSafeStr as _};

use crate::backend::{self, Backend};
use crate::dialect::{self, unique_sql};
use crate::error::Result;
use crate::table::{Dialect, Table, Value};

use super::super::unique_job::UniqueJob;

/// The lock names of one enqueue's keys, sorted and each once; none off MySQL/MariaDB.
pub(super) struct KeyLocks {
    names: Vec<String>,
}

impl KeyLocks {
    /// The locks of `jobs`' keys on `table`: a name of 24 characters per key, a hash of the
    /// table's name as given and the key (two keys sharing a hash share a lock: they wait for
    /// each other, nothing more).
    pub(super) fn of<DB: Backend>(table: &Table, jobs: &[UniqueJob<'_>]) -> Self {
        if DB::DIALECT != Dialect::MySql {
            return KeyLocks { names: Vec::new() };
        }
        let mut names: Vec<String> = jobs
            .iter()
            .map(|job| {
                let hash = dialect::fnv1a_64(&format!("{}\0{}", table.name, job.key()));
                format!("sqlxq:u:{hash:016x}")
            })
            .collect();
        names.sort_unstable();
        names.dedup();
        KeyLocks { names }
    }

    /// Takes the locks on `conn`, each waiting as long as InnoDB lets a lock wait; one not
    /// taken in that time is gone without (its enqueue then waits in InnoDB).
    pub(super) async fn take<DB: Backend>(&self, conn: &mut DB::Connection) -> Result<()> {
        if self.names.is_empty() {
            return Ok(());
        }
        let (take, _) = unique_sql::key_locks(self.names.len());
        let values = self
            .names
            .iter()
            .flat_map(|name| [name, name, name])
            .map(|name| Value::Text(Some(name)));
        self.run::<DB>(conn, take, values).await
    }

    /// Releases the locks on `conn`.
    pub(super) async fn release<DB: Backend>(&self, conn: &mut DB::Connection) -> Result<()> {
        if self.names.is_empty() {
            return Ok(());
        }
        let (_, release) = unique_sql::key_locks(self.names.len());
        let values = self.names.iter().map(|name| Value::Text(Some(name)));
        self.run::<DB>(conn, release, values).await
    }

    async fn run<'v, DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        sql: String,
        values: impl Iterator<Item = Value<'v>>,
    ) -> Result<()> {
        let sql = AssertSqlSafe(sql).into_sql_str();
        let query = backend::query::<DB>(sql, values);
        DB::fetch_all(conn, query).await?;
        Ok(())
    }
}
