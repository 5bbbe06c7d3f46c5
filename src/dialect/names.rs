//! The quoted names a queue's statements use, and the fragments every statement shares.

use super::{Slot, SqlWriter};
use crate::config::{FormKind, QueueConfig};
use crate::error::{Error, Result};
use crate::table::{Dialect, PayloadType, Pooler, Table};

/// The quoted names a queue's statements use.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    pub(crate) dialect: Dialect,
    pub(crate) table: String,
    pub(crate) id: String,
    pub(crate) payload: String,
    pub(crate) payload_type: PayloadType,
    pub(crate) group: Option<String>,
    pub(crate) retry_after: Option<String>,
    pub(crate) processed_at: Option<String>,
    pub(crate) lease: Option<String>,
    pub(crate) attempt: Option<String>,
    /// The largest value the attempt column takes: counting an attempt stops there (read from
    /// the catalog at start; `i64::MAX` until then).
    pub(crate) attempt_max: i64,
    pub(crate) priority: Option<String>,
    /// The unique key column ([`Table::unique_key`]).
    pub(crate) unique_key: Option<String>,
    /// The lease column the table declares (set from the lease form's `Queue::lease` at mount), for statements outside a runner.
    pub(crate) table_lease: Option<String>,
    /// The creation time column ([`Table::created_at`]).
    pub(crate) created_at: Option<String>,
    /// The cancel requests' table, quoted.
    pub(crate) cancel_requests: Option<String>,
    /// Whether claims return the creation time column too (with the `metrics` feature, for the
    /// pickup latency), after the attempt.
    pub(crate) read_created: bool,
    /// The headers column ([`Table::headers`]): enqueues write it, claims read it last (before
    /// the session).
    pub(crate) headers: Option<String>,
    /// The key a by-key queue routes its rows by (its key column, else the group column): claims
    /// read it after the headers.
    pub(crate) key: Option<String>,
    /// One row in work per group at a time, in order (the lease form).
    pub(crate) fifo: Option<Fifo>,
    /// Whether claims take only the rows of one group value (a named queue), or of every group
    /// (an unnamed FIFO queue).
    pub(crate) one_group: bool,
    /// Whether enqueues send the table's notification (PostgreSQL).
    pub(crate) notify: bool,
    /// Whether claims pass over the ids bound to [`Slot::Excluded`] (the claims' variants for a
    /// queue that holds rows back).
    pub(crate) excluding: bool,
    /// Whether the server deletes with `DELETE .. RETURNING` (MariaDB; MySQL has none).
    pub(crate) delete_returning: bool,
    /// Whether claims look at ids from a floor up ([`Slot::Floor`]; claims in id order only).
    pub(crate) floored: bool,
    /// Whether claims that hold a connection also return its server session (MySQL/MariaDB
    /// transactional row lock and advisory queues: a delivery cancelled at shutdown ends it).
    pub(crate) session: bool,
    /// Whether statements run unprepared, each in a transaction (a PostgreSQL table behind a
    /// transaction pooler: [`Pooler::Transaction`]).
    pub(crate) unprepared: bool,
}

/// The quoted columns of a FIFO or per-group queue's claims: its table's group column and its
/// lease column (none in the row lock form, whose rows in work are held by their claims' locks
/// and guarded by [`RowLockSql::guard`](super::RowLockSql::guard)), and how many rows of a group
/// may be in work at once (1: FIFO).
#[derive(Debug, Clone)]
pub(crate) struct Fifo {
    pub(crate) group: String,
    pub(crate) lease: Option<String>,
    pub(crate) limit: u32,
}

impl Names {
    /// The names of a table alone (enqueue).
    pub(crate) fn of_table(dialect: Dialect, table: &Table) -> Result<Self> {
        let opt = |name: &Option<String>| name.as_deref().map(|n| dialect.quote(n)).transpose();
        Ok(Names {
            dialect,
            table: dialect.quote_table(&table.name)?,
            id: dialect.quote(&table.id)?,
            payload: dialect.quote(&table.payload)?,
            payload_type: table.payload_type,
            group: opt(&table.group)?,
            retry_after: opt(&table.retry_after)?,
            processed_at: opt(&table.processed_at)?,
            lease: None,
            attempt: None,
            attempt_max: i64::MAX,
            priority: opt(&table.priority)?,
            unique_key: opt(&table.unique_key)?,
            table_lease: opt(&table.lease)?,
            created_at: opt(&table.created_at)?,
            cancel_requests: table
                .cancel_requests
                .as_deref()
                .map(|t| dialect.quote_table(t))
                .transpose()?,
            read_created: false,
            headers: opt(&table.headers)?,
            key: None,
            fifo: None,
            one_group: table.group.is_some(),
            notify: table.notify,
            excluding: false,
            floored: false,
            delete_returning: false,
            session: false,
            unprepared: dialect == Dialect::Postgres && table.pooler == Pooler::Transaction,
        })
    }

    /// The names of a queue: its table's and its own columns.
    pub(crate) fn of_queue(dialect: Dialect, config: &QueueConfig) -> Result<Self> {
        let mut names = Names::of_table(dialect, &config.table)?;
        if let FormKind::Lease { column, .. } = &config.form {
            names.lease = Some(dialect.quote(column)?);
        }

        let row_lock = config.form == FormKind::RowLock;
        names.fifo = match (config.per_group, &names.group, &names.lease) {
            (None, _, _) => None,
            (Some(limit), Some(group), Some(lease)) => Some(Fifo {
                group: group.clone(),
                lease: Some(lease.clone()),
                limit,
            }),
            (Some(limit), Some(group), None) if row_lock => Some(Fifo {
                group: group.clone(),
                lease: None,
                limit,
            }),
            // Refused when the queue was mounted (`QueueConfig::check`).
            (Some(_), _, _) => {
                return Err(Error::declaration(
                    config.label(),
                    "FIFO needs the table's group column and the lease or row lock form",
                ));
            }
        };
        names.key = config.key_column().map(|k| dialect.quote(k)).transpose()?;
        names.session = dialect == Dialect::MySql
            && config.transactional
            && !matches!(config.form, FormKind::Lease { .. });
        names.one_group = names.group.is_some() && config.name.is_some();
        names.read_created = cfg!(feature = "metrics") && names.created_at.is_some();
        names.attempt = config
            .attempt
            .as_deref()
            .map(|a| dialect.quote(a))
            .transpose()?;
        Ok(names)
    }

    /// These names, for the claims' variants that pass over held-back rows.
    pub(crate) fn excluding(&self) -> Names {
        Names {
            excluding: true,
            ..self.clone()
        }
    }

    /// These names for a claim's scan: from the floor up ([`Slot::Floor`]) where claims take
    /// rows in id order alone (no priority, no FIFO or per-group condition, whose rows below the
    /// floor become claimable as other rows settle).
    pub(crate) fn floored(&self) -> Names {
        Names {
            floored: self.claims_in_id_order(),
            ..self.clone()
        }
    }

    /// Whether claims take rows in id order alone: no priority, no FIFO or per-group condition
    /// — and no by-key queue's, whose row given back below the floor (a lease that waited in its
    /// key's lane) must be claimed again before the later rows of its key.
    pub(crate) fn claims_in_id_order(&self) -> bool {
        self.priority.is_none() && self.fifo.is_none() && self.key.is_none()
    }

    pub(crate) fn writer(&self) -> SqlWriter {
        SqlWriter::new(self.dialect).unprepared(self.unprepared)
    }

    /// `attempt = attempt + 1`, stopping at the column's largest value: a row whose attempt
    /// reached it would otherwise make every statement that counts it fail ("out of range"),
    /// and a claim fail for every row it takes with that one.
    pub(crate) fn count_attempt(&self, w: &mut SqlWriter, attempt: &str) {
        w.push(attempt)
            .push(" = CASE WHEN ")
            .push(attempt)
            .push(" < ")
            .push(&self.attempt_max.to_string())
            .push(" THEN ")
            .push(attempt)
            .push(" + 1 ELSE ")
            .push(attempt)
            .push(" END");
    }

    /// Reads the payload column (named with `prefix`, e.g. `q.`) as bytes.
    pub(crate) fn read_payload(&self, w: &mut SqlWriter, prefix: &str) {
        let (before, after) = match (self.payload_type, self.dialect) {
            (PayloadType::Bytes, _) => ("", ""),
            (_, Dialect::Postgres) => ("convert_to(", "::text, 'UTF8')"),
            // The column's own character set, whatever it is, read as UTF-8.
            (_, Dialect::MySql) => ("CAST(CONVERT(", " USING utf8mb4) AS BINARY)"),
            (_, Dialect::Sqlite) => ("CAST(", " AS BLOB)"),
        };
        w.push(before).push(prefix).push(&self.payload).push(after);
    }

    /// Reads the headers column (named with `prefix`) as UTF-8 bytes, whatever its type (text,
    /// JSON, `JSONB`); NULL stays NULL.
    pub(crate) fn read_headers(&self, w: &mut SqlWriter, prefix: &str) {
        let Some(headers) = &self.headers else {
            return;
        };
        let (before, after) = match self.dialect {
            Dialect::Postgres => ("convert_to(", "::text, 'UTF8')"),
            Dialect::MySql => ("CAST(CONVERT(", " USING utf8mb4) AS BINARY)"),
            Dialect::Sqlite => ("CAST(", " AS BLOB)"),
        };
        w.push(", ")
            .push(before)
            .push(prefix)
            .push(headers)
            .push(after);
    }

    /// Reads the key column (named with `prefix`) as the bytes of its text, whatever its type;
    /// NULL stays NULL.
    pub(crate) fn read_key(&self, w: &mut SqlWriter, prefix: &str) {
        let Some(key) = &self.key else {
            return;
        };
        let (before, after) = match self.dialect {
            Dialect::Postgres => ("convert_to(CAST(", " AS TEXT), 'UTF8')"),
            Dialect::MySql => ("CAST(", " AS BINARY)"),
            Dialect::Sqlite => ("CAST(", " AS BLOB)"),
        };
        w.push(", ").push(before).push(prefix).push(key).push(after);
    }

    /// The headers' parameter (their JSON text): on PostgreSQL cast to `jsonb`, which every
    /// column type the role takes (`jsonb`, `json`, `text`) is assigned from.
    pub(crate) fn headers_param(&self, w: &mut SqlWriter) {
        match self.dialect {
            Dialect::Postgres => w.push("CAST(").param(Slot::Headers).push(" AS jsonb)"),
            Dialect::MySql | Dialect::Sqlite => w.param(Slot::Headers),
        };
    }

    /// The payload's parameter, converted from bytes to the column's type.
    pub(crate) fn payload_param(&self, w: &mut SqlWriter) {
        let (before, after) = match (self.payload_type, self.dialect) {
            (PayloadType::Bytes, _) => ("", ""),
            (PayloadType::Text, Dialect::Postgres) => ("convert_from(", ", 'UTF8')"),
            (PayloadType::Json, Dialect::Postgres) => ("convert_from(", ", 'UTF8')::json"),
            (PayloadType::Jsonb, Dialect::Postgres) => ("convert_from(", ", 'UTF8')::jsonb"),
            (_, Dialect::MySql) => ("CONVERT(", " USING utf8mb4)"),
            (_, Dialect::Sqlite) => ("CAST(", " AS TEXT)"),
        };
        w.push(before).param(Slot::Payload).push(after);
    }
}

#[cfg(test)]
impl Names {
    /// A queue's names, for the statement tests: of `form` (`lease`, on `locked_until`;
    /// `row_lock`; `advisory`), serving group `named`, with the attempt column `attempt`.
    pub(crate) fn for_test(
        dialect: Dialect,
        table: Table,
        named: Option<&str>,
        form: &str,
        attempt: bool,
    ) -> Names {
        let form = match form {
            "lease" => FormKind::Lease {
                column: "locked_until".to_owned(),
                duration: crate::config::DEFAULT_LEASE,
            },
            "row_lock" => FormKind::RowLock,
            _ => FormKind::Advisory,
        };
        let mut config = QueueConfig::new(table, form);
        config.name = named.map(str::to_owned);
        config.attempt = attempt.then(|| "attempt".to_owned());
        Names::of_queue(dialect, &config).expect("valid names")
    }
}
