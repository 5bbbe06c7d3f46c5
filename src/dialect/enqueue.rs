//! The insert of jobs, one or many in a statement, the same on every database but for quoting,
//! placeholders and a PostgreSQL table's notification: apart from the claim's statements, as
//! nothing else here runs outside a queue.

use super::common::as_i64;
use super::{Dialect, Names, Slot, SqlWriter, Stmt};

/// The enqueue statement.
#[derive(Debug, Clone)]
pub(crate) struct EnqueueSql {
    /// `INSERT` of one job; binds payload, then group, `retry_after`, priority and headers where
    /// the table has them.
    pub(crate) insert: Stmt,
    /// Whether `insert` returns the new id (else the driver's last insert id is read).
    pub(crate) returning: bool,
    /// The quoted table name `insert` binds to compute its notification channel, on a notifying
    /// PostgreSQL table.
    pub(crate) notify_table: Option<String>,
}

pub(super) fn enqueue(n: &Names, returning: bool) -> EnqueueSql {
    let mut w = n.writer();
    w.push("INSERT INTO ")
        .push(&n.table)
        .push(" (")
        .push(&n.payload);
    for column in [&n.group, &n.retry_after, &n.priority, &n.headers]
        .into_iter()
        .flatten()
    {
        w.push(", ").push(column);
    }
    w.push(") VALUES (");
    n.payload_param(&mut w);
    if n.group.is_some() {
        w.push(", ").param(Slot::Group);
    }
    if n.retry_after.is_some() {
        w.push(", ").param(Slot::At);
    }
    if n.priority.is_some() {
        w.push(", ").param(Slot::Priority);
    }
    if n.headers.is_some() {
        w.push(", ");
        n.headers_param(&mut w);
    }
    w.push(")");
    if n.notify && n.dialect == Dialect::Postgres {
        return EnqueueSql {
            insert: notifying(w, n),
            returning: true,
            notify_table: Some(n.table.clone()),
        };
    }
    if returning {
        w.push(" RETURNING ");
        as_i64(&mut w, &n.id);
    }
    EnqueueSql {
        insert: w.finish(),
        returning,
        notify_table: None,
    }
}

/// Wraps an `INSERT` so that it also sends the table's notification, in the same statement:
/// `WITH ins AS (INSERT .. RETURNING ..), n AS (SELECT pg_notify(..)) SELECT ins.id FROM ins,
/// n`, which returns the new ids.
fn notifying(mut w: SqlWriter, n: &Names) -> Stmt {
    let mut out = n.writer();
    out.push("WITH ins AS (");
    w.push(" RETURNING ");
    as_i64(&mut w, &n.id);
    w.push(" AS id");
    out.append(w);
    out.push("), n AS (SELECT pg_notify(");
    super::postgres::channel(&mut out, Slot::NotifyTable);
    out.push(", ")
        .param(Slot::NotifyPayload)
        .push(")) SELECT ins.id FROM ins, n");
    out.finish()
}

/// `INSERT` of `rows` jobs in one statement; binds, per row, what [`enqueue`] binds (and, on a
/// notifying PostgreSQL table, the notification last). PostgreSQL and SQLite return the new ids
/// (in any order: they were given in the rows' order, so ascending is theirs); MySQL/MariaDB
/// reports the first, the others following it by `@@auto_increment_increment`.
pub(super) fn enqueue_many(n: &Names, rows: usize) -> String {
    let mut w = n.writer();
    w.push("INSERT INTO ")
        .push(&n.table)
        .push(" (")
        .push(&n.payload);
    for column in [&n.group, &n.retry_after, &n.priority, &n.headers]
        .into_iter()
        .flatten()
    {
        w.push(", ").push(column);
    }
    w.push(") VALUES ");
    for row in 0..rows {
        w.push(if row == 0 { "(" } else { ", (" });
        n.payload_param(&mut w);
        if n.group.is_some() {
            w.push(", ").param(Slot::Group);
        }
        if n.retry_after.is_some() {
            w.push(", ").param(Slot::At);
        }
        if n.priority.is_some() {
            w.push(", ").param(Slot::Priority);
        }
        if n.headers.is_some() {
            w.push(", ");
            n.headers_param(&mut w);
        }
        w.push(")");
    }
    if n.notify && n.dialect == Dialect::Postgres {
        return notifying(w, n).text().to_owned();
    }
    if n.dialect != Dialect::MySql {
        w.push(" RETURNING ");
        as_i64(&mut w, &n.id);
    }
    w.finish().text().to_owned()
}

#[cfg(test)]
mod tests {
    use super::super::{Claim, Dialect, Names};
    use crate::table::Table;

    #[test]
    fn enqueue_binds_group_and_delay_where_the_table_has_them() {
        let table = Table::new("jobs").group("queue").retry_after("not_before");
        let n = Names::of_table(Dialect::Postgres, &table).unwrap();
        let sql = super::super::enqueue(&n);
        assert_eq!(
            sql.insert.text(),
            r#"INSERT INTO "jobs" ("payload", "queue", "not_before") VALUES ($1, $2, $3) RETURNING CAST("id" AS BIGINT)"#
        );
        let n = Names::of_table(Dialect::MySql, &Table::new("jobs")).unwrap();
        let sql = super::super::enqueue(&n);
        assert_eq!(
            sql.insert.text(),
            "INSERT INTO `jobs` (`payload`) VALUES (?)"
        );
        assert!(!sql.returning);
    }

    #[test]
    fn text_and_json_payloads_are_converted_from_and_to_bytes() {
        use crate::PayloadType;
        let jsonb = Table::new("jobs").payload_type(PayloadType::Jsonb);
        let n = Names::of_table(Dialect::Postgres, &jsonb).unwrap();
        assert_eq!(
            super::super::enqueue(&n).insert.text(),
            r#"INSERT INTO "jobs" ("payload") VALUES (convert_from($1, 'UTF8')::jsonb) RETURNING CAST("id" AS BIGINT)"#
        );
        let text = Table::new("jobs").payload_type(PayloadType::Text);
        let n = Names::of_table(Dialect::MySql, &text).unwrap();
        assert_eq!(
            super::enqueue_many(&n, 2),
            "INSERT INTO `jobs` (`payload`) VALUES (CONVERT(? USING utf8mb4)), \
             (CONVERT(? USING utf8mb4))"
        );
        let table = Table::new("jobs").payload_type(PayloadType::Json);
        let n = Names::for_test(Dialect::Sqlite, table, None, "lease", false);
        let Claim::Returning(claim) =
            super::super::sqlite::lease_claim(&n, n.lease.as_deref().unwrap())
        else {
            panic!("SQLite claims in one statement");
        };
        assert!(
            claim
                .text()
                .ends_with("RETURNING `id`, CAST(`payload` AS BLOB)"),
            "{}",
            claim.text()
        );
    }

    #[test]
    fn headers_are_written_as_json_text_and_read_as_bytes() {
        let table = || Table::new("jobs").headers("h");
        let n = Names::of_table(Dialect::Postgres, &table()).unwrap();
        assert_eq!(
            super::super::enqueue(&n).insert.text(),
            r#"INSERT INTO "jobs" ("payload", "h") VALUES ($1, CAST($2 AS jsonb)) RETURNING CAST("id" AS BIGINT)"#
        );
        let n = Names::of_table(Dialect::MySql, &table()).unwrap();
        assert_eq!(
            super::enqueue_many(&n, 2),
            "INSERT INTO `jobs` (`payload`, `h`) VALUES (?, ?), (?, ?)"
        );
        let n = Names::for_test(Dialect::Postgres, table(), None, "lease", true);
        let Claim::Returning(claim) =
            super::super::postgres::lease_claim(&n, n.lease.as_deref().unwrap())
        else {
            panic!("PostgreSQL claims in one statement");
        };
        assert!(
            claim
                .text()
                .ends_with(r#"CAST(q."attempt" AS BIGINT) - 1, convert_to(q."h"::text, 'UTF8')"#),
            "{}",
            claim.text()
        );
        let n = Names::for_test(Dialect::Sqlite, table(), None, "lease", false);
        let Claim::Returning(claim) =
            super::super::sqlite::lease_claim(&n, n.lease.as_deref().unwrap())
        else {
            panic!("SQLite claims in one statement");
        };
        assert!(
            claim
                .text()
                .ends_with("RETURNING `id`, `payload`, CAST(`h` AS BLOB)"),
            "{}",
            claim.text()
        );
    }

    #[test]
    fn bulk_enqueue_is_one_statement() {
        let table = Table::new("jobs").group("queue");
        let n = Names::of_table(Dialect::Postgres, &table).unwrap();
        assert_eq!(
            super::enqueue_many(&n, 3),
            r#"INSERT INTO "jobs" ("payload", "queue") VALUES ($1, $2), ($3, $4), ($5, $6) RETURNING CAST("id" AS BIGINT)"#
        );
        let n = Names::of_table(Dialect::MySql, &table).unwrap();
        assert_eq!(
            super::enqueue_many(&n, 2),
            "INSERT INTO `jobs` (`payload`, `queue`) VALUES (?, ?), (?, ?)",
            "MySQL returns nothing: the first id and the increment tell them"
        );
    }
}
