//! What an insert refuses before it is sent — a job the table cannot hold, a statement no
//! MySQL/MariaDB server takes — and what a refusal from the server means: apart from the inserts,
//! which read best without their error paths.

use super::Job;
use crate::backend::{Backend, InsertFailed};
use crate::dialect;
use crate::error::{Error, Result, SchemaError};
use crate::table::{Dialect, PayloadType, Table, table_parts};

/// The largest `max_allowed_packet` of MySQL/MariaDB: 1 GiB.
const MYSQL_MAX_PACKET: usize = 1 << 30;

impl Table {
    /// Refuses, before sending it, a statement of `bytes` that MySQL/MariaDB could never take:
    /// `max_allowed_packet` is at most 1 GiB.
    pub(super) fn refuse_too_large<DB: Backend>(&self, bytes: usize) -> Result<()> {
        if DB::DIALECT == Dialect::MySql && bytes > MYSQL_MAX_PACKET {
            return Err(Error::PayloadTooLarge {
                table: self.name.clone(),
                bytes: bytes as u64,
                setting: "max_allowed_packet",
                source: None,
            });
        }
        Ok(())
    }

    /// An insert's failure: the driver's error as [`explain`](Table::explain) says it, or an id
    /// the crate cannot return.
    pub(super) fn insert_failed<DB: Backend>(
        &self,
        failed: InsertFailed,
        statement: &str,
        bytes: usize,
    ) -> Error {
        match failed {
            InsertFailed::Driver(error) => self.explain::<DB>(error, statement, bytes),
            InsertFailed::IdOutOfRange(id) => Error::IdOutOfRange {
                table: self.name.clone(),
                id,
            },
        }
    }

    /// The insert's error, or a clearer one where the driver's words would not say what is
    /// wrong.
    ///
    /// The executor is the caller's (often its transaction) and the insert consumes it, so
    /// nothing can be asked of the server first (its `max_allowed_packet`, SQLite's attached
    /// databases); the server's answer is read instead. A statement larger than
    /// `max_allowed_packet` gets error 1153 or a closed connection from MySQL/MariaDB, where the
    /// driver says "Connection reset by peer" ([`Backend`]'s `too_large` says which answers are
    /// taken for it); a table qualified PostgreSQL's way (`public.jobs`) gets "no such table" or
    /// "unknown database" from SQLite.
    pub(super) fn explain<DB: Backend>(
        &self,
        error: sqlx::Error,
        statement: &str,
        bytes: usize,
    ) -> Error {
        if let Some(setting) = DB::too_large(&error, bytes) {
            return Error::PayloadTooLarge {
                table: self.name.clone(),
                bytes: bytes as u64,
                setting,
                source: Some(error),
            };
        }
        let qualified = match (DB::DIALECT, table_parts(&self.name)) {
            (Dialect::Sqlite, Ok((Some(schema), bare))) => Some((schema, bare)),
            _ => None,
        };
        let message = match &error {
            sqlx::Error::Database(e) => e.message(),
            _ => "",
        };
        let Some((schema, bare)) = qualified else {
            return Error::Database(error);
        };
        let reason = if message.starts_with("unknown database") {
            dialect::sqlite_qualified(schema, bare, Some(&[]))
        } else if message == format!("no such table: {schema}.{bare}") {
            dialect::sqlite_qualified(schema, bare, None)
        } else {
            return Error::Database(error);
        };
        Error::Schema(Box::new(SchemaError {
            queue: self.name.clone(),
            table: self.name.clone(),
            column: None,
            statement: Some(statement.to_owned()),
            reason,
            fix: None,
            source: Some(error),
        }))
    }

    /// Refuses a job this table cannot hold.
    pub(super) fn check(&self, job: &Job<'_>) -> Result<()> {
        self.check_headers(job)?;
        let refuse = |reason: String| Err(Error::invalid_job(&self.name, reason));
        match (&self.group, &job.group) {
            (Some(column), None) => refuse(format!(
                "table `{}` has the group column `{column}`: give the job its group with \
                 `Job::group(..)`",
                self.name
            )),
            (None, Some(group)) => refuse(format!(
                "the job is for group {group:?}, but table `{}` has no group column",
                self.name
            )),
            _ if job.delay.is_some() && self.retry_after.is_none() => refuse(format!(
                "a delayed job needs a retry_after column, and table `{}` has none",
                self.name
            )),
            _ if self.payload_type != PayloadType::Bytes
                && (std::str::from_utf8(&job.payload).is_err() || job.payload.contains(&0)) =>
            {
                refuse(format!(
                    "the payload column `{}` of table `{}` holds text ({:?}): the job's payload \
                     is not UTF-8 text without NUL bytes",
                    self.payload, self.name, self.payload_type
                ))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(all(test, feature = "mysql"))]
mod tests {
    use crate::backend::driver::Driver as _;
    use crate::error::Error;
    use crate::table::Table;

    #[test]
    fn a_statement_larger_than_any_max_allowed_packet_is_not_sent() {
        let table = Table::new("jobs");
        table.refuse_too_large::<sqlx::MySql>(1 << 30).unwrap();
        let refused = table.refuse_too_large::<sqlx::MySql>((1 << 30) + 1);
        assert!(
            matches!(refused, Err(Error::PayloadTooLarge { bytes, source: None, .. }) if bytes == (1 << 30) + 1),
            "{refused:?}"
        );
        #[cfg(feature = "sqlite")]
        table
            .refuse_too_large::<sqlx::Sqlite>((1 << 30) + 1)
            .unwrap();
    }

    #[test]
    fn a_broken_connection_is_taken_for_a_large_statement_from_one_mebibyte() {
        use std::io::{Error as Io, ErrorKind};
        let reset = || sqlx::Error::Io(Io::from(ErrorKind::ConnectionReset));
        assert_eq!(
            sqlx::MySql::too_large(&reset(), 1 << 20),
            Some("max_allowed_packet")
        );
        assert_eq!(sqlx::MySql::too_large(&reset(), 1000), None);
        let refused = sqlx::Error::Io(Io::from(ErrorKind::ConnectionRefused));
        assert_eq!(sqlx::MySql::too_large(&refused, 1 << 20), None);
        #[cfg(feature = "sqlite")]
        assert_eq!(sqlx::Sqlite::too_large(&reset(), 1 << 20), None);
    }
}
