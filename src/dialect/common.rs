//! Statements whose text is the same on every database but for quoting and placeholders.

use super::{Claim, Dialect, Names, Slot, SqlWriter, Stmt};

/// The lease form's statements.
#[derive(Debug, Clone)]
pub(crate) struct LeaseSql {
    pub(crate) claim: Claim,
    /// The claim, passing over held-back rows.
    pub(crate) claim_excluding: Claim,
    /// The id the claim would take next, passing over held-back rows: the row a claim that
    /// failed for a reason of its own failed on.
    pub(crate) next: Stmt,
    /// `lease = new token`, guarded by the current token.
    pub(crate) extend: Stmt,
    /// `lease = NULL`, guarded: retry, and a delivery dropped unsettled.
    pub(crate) release: Stmt,
    /// `lease = NULL` where the lease is either of two tokens: a delivery cancelled while its
    /// extension to the second was in flight, whose outcome is unknown.
    pub(crate) release_either: Stmt,
    /// `retry_after = at, lease = NULL`, guarded; absent without a `retry_after` column.
    pub(crate) retry_after: Option<Stmt>,
    /// ack and drop: `DELETE`, or `processed_at = now, lease = NULL`, guarded.
    pub(crate) finish: Stmt,
    /// `SELECT 1 .. FOR UPDATE`, guarded: confirms and locks the lease before a custom
    /// settlement runs in the same transaction.
    pub(crate) confirm: Stmt,
    /// Acknowledgements of many rows in one statement, each guarded by its own token;
    /// `finish_many[k]` takes `2^k` `(id, token)` pairs.
    pub(crate) finish_many: FinishMany,
}

/// How many acknowledgements one statement settles at most.
pub(crate) const MAX_FINISH: usize = 64;

/// How many held-back rows a claim passes over at most (`Slot::Excluded`).
pub(crate) const MAX_EXCLUDED: u16 = 16;

/// Acknowledgements of many lease rows at once.
#[derive(Debug, Clone)]
pub(crate) enum FinishMany {
    /// `DELETE`/`UPDATE .. WHERE (id, lease) IN (..) RETURNING id`: the ids settled
    /// (PostgreSQL, SQLite).
    Returning(Box<[Stmt]>),
    /// In one transaction, `SELECT id .. WHERE (id, lease) IN (..) FOR UPDATE` — the rows still
    /// held — then the `DELETE`/`UPDATE` of those ids (MySQL/MariaDB, which have no
    /// `UPDATE .. RETURNING`).
    LockThenFinish {
        held: Box<[Stmt]>,
        finish: Box<[Stmt]>,
    },
}

impl LeaseSql {
    /// Every statement, to prepare at start.
    pub(crate) fn statements(&self) -> Vec<&Stmt> {
        let mut all = self.claim.statements();
        if let Claim::SelectThenUpdate { select, .. } = &self.claim_excluding {
            all.push(select);
        } else {
            all.extend(self.claim_excluding.statements());
        }
        all.push(&self.next);
        all.extend([
            &self.extend,
            &self.release,
            &self.release_either,
            &self.finish,
            &self.confirm,
        ]);
        match &self.finish_many {
            FinishMany::Returning(statements) => all.extend(statements.iter()),
            FinishMany::LockThenFinish { held, finish } => {
                all.extend(held.iter().chain(finish.iter()));
            }
        }
        all.extend(self.retry_after.as_ref());
        all
    }
}

/// The enqueue statement.
#[derive(Debug, Clone)]
pub(crate) struct EnqueueSql {
    /// `INSERT` of one job; binds payload, then group and `retry_after` where the table has them.
    pub(crate) insert: Stmt,
    /// Whether `insert` returns the new id (else the driver's last insert id is read).
    pub(crate) returning: bool,
    /// The quoted table name `insert` binds to compute its notification channel, on a notifying
    /// PostgreSQL table.
    pub(crate) notify_table: Option<String>,
}

/// `WHERE` conditions that make a row claimable now (no leading `WHERE`): its group, not
/// processed, no live lease, due.
pub(super) fn claimable(w: &mut SqlWriter, n: &Names) {
    let mut any = false;
    let mut and = |w: &mut SqlWriter| {
        if std::mem::replace(&mut any, true) {
            w.push(" AND ");
        }
    };
    if let (Some(group), true) = (&n.group, n.one_group) {
        and(w);
        w.push(group).push(" = ").param(Slot::Group);
    }
    if let Some(processed_at) = &n.processed_at {
        and(w);
        w.push(processed_at).push(" IS NULL");
    }
    if let Some(lease) = &n.lease {
        and(w);
        w.push("(")
            .push(lease)
            .push(" IS NULL OR ")
            .push(lease)
            .push(" < ")
            .param(Slot::Now)
            .push(")");
    }
    if let Some(retry_after) = &n.retry_after {
        and(w);
        w.push("(")
            .push(retry_after)
            .push(" IS NULL OR ")
            .push(retry_after)
            .push(" <= ")
            .param(Slot::Now)
            .push(")");
    }
    if n.fifo {
        and(w);
        fifo(w, n);
    }
    if n.excluding {
        and(w);
        w.push(&n.id).push(" NOT IN (");
        for i in 0..MAX_EXCLUDED {
            if i > 0 {
                w.push(", ");
            }
            w.param(Slot::Excluded(i));
        }
        w.push(")");
    }
    if !any {
        w.push("1 = 1");
    }
}

/// The id a claim would take next: `SELECT id .. WHERE <claimable> ORDER BY .. LIMIT 1`, a plain
/// read that locks nothing.
pub(crate) fn next(n: &Names) -> Stmt {
    let mut w = n.writer();
    w.push("SELECT ");
    as_i64(&mut w, &n.id);
    w.push(" FROM ").push(&n.table).push(" WHERE ");
    claimable(&mut w, n);
    order(&mut w, n);
    w.push(" LIMIT 1");
    w.finish()
}

/// FIFO within a group: a row is claimable only when no other row of its group is in work
/// (under a live lease) and no earlier row of its group is due. A delayed row does not hold
/// back later rows that are due.
fn fifo(w: &mut SqlWriter, n: &Names) {
    let group = n.group.as_deref().expect("FIFO needs a group column");
    let lease = n.lease.as_deref().expect("FIFO needs the lease form");
    let outer = |w: &mut SqlWriter, column: &str| {
        w.push(&n.table).push(".").push(column);
    };
    let same_group = |w: &mut SqlWriter| {
        w.push(" FROM ")
            .push(&n.table)
            .push(" AS h WHERE h.")
            .push(group)
            .push(" = ");
        outer(w, group);
        if let Some(processed_at) = &n.processed_at {
            w.push(" AND h.").push(processed_at).push(" IS NULL");
        }
    };
    w.push("NOT EXISTS (SELECT 1");
    same_group(w);
    w.push(" AND h.").push(&n.id).push(" <> ");
    outer(w, &n.id);
    w.push(" AND h.").push(lease).push(" >= ").param(Slot::Now);
    w.push(") AND NOT EXISTS (SELECT 1");
    same_group(w);
    w.push(" AND h.").push(&n.id).push(" < ");
    outer(w, &n.id);
    if let Some(retry_after) = &n.retry_after {
        w.push(" AND (h.")
            .push(retry_after)
            .push(" IS NULL OR h.")
            .push(retry_after)
            .push(" <= ")
            .param(Slot::Now)
            .push(")");
    }
    w.push(")");
}

/// ` ORDER BY`: priority (smaller first), then due time (a row never delayed first), then id.
pub(super) fn order(w: &mut SqlWriter, n: &Names) {
    w.push(" ORDER BY ");
    if let Some(priority) = &n.priority {
        w.push(priority).push(", ");
        if let Some(retry_after) = &n.retry_after {
            match n.dialect {
                // NULLs sort first in ascending order on MySQL and SQLite, last on PostgreSQL.
                Dialect::Postgres => w.push(retry_after).push(" NULLS FIRST, "),
                Dialect::MySql | Dialect::Sqlite => w.push(retry_after).push(", "),
            };
        }
    }
    w.push(&n.id);
}

/// `id` read as a 64-bit integer (PostgreSQL decodes strictly; MySQL reads it signed).
pub(super) fn as_i64(w: &mut SqlWriter, column: &str) {
    match w.dialect() {
        Dialect::Postgres => w.push("CAST(").push(column).push(" AS BIGINT)"),
        Dialect::MySql => w.push("CAST(").push(column).push(" AS SIGNED)"),
        Dialect::Sqlite => w.push(column),
    };
}

/// `DELETE` of row `id`, or `processed_at = now` where the table keeps finished rows; the lease
/// cleared too in the lease form.
pub(super) fn finish(w: &mut SqlWriter, n: &Names) {
    match &n.processed_at {
        Some(processed_at) => {
            w.push("UPDATE ")
                .push(&n.table)
                .push(" SET ")
                .push(processed_at)
                .push(" = ")
                .param(Slot::Now);
            if let Some(lease) = &n.lease {
                w.push(", ").push(lease).push(" = NULL");
            }
        }
        None => {
            w.push("DELETE FROM ").push(&n.table);
        }
    }
}

/// `SET lease = ?, attempt = attempt + 1` (saturating) of a lease claim.
pub(super) fn lease_set(w: &mut SqlWriter, n: &Names) {
    let lease = n
        .lease
        .as_deref()
        .expect("lease statements need a lease column");
    w.push(" SET ")
        .push(lease)
        .push(" = ")
        .param(Slot::NewToken);
    if let Some(attempt) = &n.attempt {
        w.push(", ");
        n.count_attempt(w, attempt);
    }
}

fn guarded(w: &mut SqlWriter, n: &Names, lease: &str) {
    w.push(" WHERE ")
        .push(&n.id)
        .push(" = ")
        .param(Slot::Id)
        .push(" AND ")
        .push(lease)
        .push(" = ")
        .param(Slot::Token);
}

/// `(id, lease) IN ((?, ?), ..)` of `count` pairs.
fn pairs(w: &mut SqlWriter, n: &Names, lease: &str, count: u16) {
    w.push("(")
        .push(&n.id)
        .push(", ")
        .push(lease)
        .push(") IN (");
    for i in 0..count {
        w.push(if i == 0 { "(" } else { ", (" })
            .param(Slot::IdAt(i))
            .push(", ")
            .param(Slot::TokenAt(i))
            .push(")");
    }
    w.push(")");
}

/// `id IN (?, ..)` of `count` ids.
pub(super) fn ids(w: &mut SqlWriter, n: &Names, count: u16) {
    w.push(&n.id).push(" IN (");
    for i in 0..count {
        if i > 0 {
            w.push(", ");
        }
        w.param(Slot::IdAt(i));
    }
    w.push(")");
}

fn finish_many(n: &Names, lease: &str) -> FinishMany {
    let sizes = || (0..=MAX_FINISH.trailing_zeros()).map(|k| 1u16 << k);
    match n.dialect {
        Dialect::Postgres | Dialect::Sqlite => FinishMany::Returning(
            sizes()
                .map(|count| {
                    let mut w = n.writer();
                    finish(&mut w, n);
                    w.push(" WHERE ");
                    pairs(&mut w, n, lease, count);
                    w.push(" RETURNING ");
                    as_i64(&mut w, &n.id);
                    w.finish()
                })
                .collect(),
        ),
        Dialect::MySql => FinishMany::LockThenFinish {
            held: sizes()
                .map(|count| {
                    let mut w = n.writer();
                    w.push("SELECT ");
                    as_i64(&mut w, &n.id);
                    w.push(" FROM ").push(&n.table).push(" WHERE ");
                    pairs(&mut w, n, lease, count);
                    w.push(" FOR UPDATE");
                    w.finish()
                })
                .collect(),
            finish: sizes()
                .map(|count| {
                    let mut w = n.writer();
                    finish(&mut w, n);
                    w.push(" WHERE ");
                    ids(&mut w, n, count);
                    w.finish()
                })
                .collect(),
        },
    }
}

pub(super) fn lease(n: &Names, claim: Claim, claim_excluding: Claim, next: Stmt) -> LeaseSql {
    let lease = n
        .lease
        .as_deref()
        .expect("lease statements need a lease column");
    let update = |w: &mut SqlWriter| {
        w.push("UPDATE ").push(&n.table).push(" SET ");
    };

    let mut w = n.writer();
    update(&mut w);
    w.push(lease).push(" = ").param(Slot::NewToken);
    guarded(&mut w, n, lease);
    let extend = w.finish();

    let mut w = n.writer();
    update(&mut w);
    w.push(lease).push(" = NULL");
    guarded(&mut w, n, lease);
    let release = w.finish();

    let mut w = n.writer();
    update(&mut w);
    w.push(lease)
        .push(" = NULL WHERE ")
        .push(&n.id)
        .push(" = ")
        .param(Slot::Id)
        .push(" AND ")
        .push(lease)
        .push(" IN (")
        .param(Slot::Token)
        .push(", ")
        .param(Slot::NewToken)
        .push(")");
    let release_either = w.finish();

    let retry_after = n.retry_after.as_deref().map(|retry_after| {
        let mut w = n.writer();
        update(&mut w);
        w.push(retry_after)
            .push(" = ")
            .param(Slot::At)
            .push(", ")
            .push(lease)
            .push(" = NULL");
        guarded(&mut w, n, lease);
        w.finish()
    });

    let mut w = n.writer();
    finish(&mut w, n);
    guarded(&mut w, n, lease);
    let finish = w.finish();

    let mut w = n.writer();
    w.push("SELECT ");
    as_i64(&mut w, "1");
    w.push(" FROM ").push(&n.table);
    guarded(&mut w, n, lease);
    if n.dialect != Dialect::Sqlite {
        w.push(" FOR UPDATE");
    }
    let confirm = w.finish();

    LeaseSql {
        claim,
        claim_excluding,
        next,
        extend,
        release,
        release_either,
        retry_after,
        finish,
        confirm,
        finish_many: finish_many(n, lease),
    }
}

pub(super) fn enqueue(n: &Names, returning: bool) -> EnqueueSql {
    let mut w = n.writer();
    w.push("INSERT INTO ")
        .push(&n.table)
        .push(" (")
        .push(&n.payload);
    for column in [&n.group, &n.retry_after, &n.priority]
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
    w.push(")");
    if n.notify && n.dialect == Dialect::Postgres {
        return EnqueueSql {
            insert: notifying(w, n, true),
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
/// `WITH ins AS (INSERT .. RETURNING ..), n AS (SELECT pg_notify(..)) SELECT .. FROM ins, n`,
/// which returns the new id (`one`) or how many rows were inserted.
fn notifying(mut w: SqlWriter, n: &Names, one: bool) -> Stmt {
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
        .push(")) SELECT ")
        .push(if one { "ins.id" } else { "COUNT(*)" })
        .push(" FROM ins, n");
    out.finish()
}

/// `INSERT` of `rows` jobs in one statement; binds, per row, what [`enqueue`] binds (and, on a
/// notifying PostgreSQL table, the notification last: it then returns the count inserted).
pub(super) fn enqueue_many(n: &Names, rows: usize) -> String {
    let mut w = n.writer();
    w.push("INSERT INTO ")
        .push(&n.table)
        .push(" (")
        .push(&n.payload);
    for column in [&n.group, &n.retry_after, &n.priority]
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
        w.push(")");
    }
    if n.notify && n.dialect == Dialect::Postgres {
        return notifying(w, n, false).text().to_owned();
    }
    w.finish().text().to_owned()
}

#[cfg(test)]
mod tests {
    use super::super::{Claim, Dialect, Names, lease as render_lease};
    use super::FinishMany;
    use crate::table::Table;

    fn names(dialect: Dialect, table: Table) -> Names {
        Names::for_test(dialect, table, Some("mail"), "lease", true)
    }

    #[test]
    fn lease_settlements_carry_the_token() {
        let n = names(Dialect::Postgres, Table::new("jobs"));
        let sql = render_lease(&n, 8);
        assert_eq!(
            sql.finish.text(),
            r#"DELETE FROM "jobs" WHERE "id" = $1 AND "locked_until" = $2"#
        );
        assert_eq!(
            sql.release.text(),
            r#"UPDATE "jobs" SET "locked_until" = NULL WHERE "id" = $1 AND "locked_until" = $2"#
        );
        assert_eq!(
            sql.extend.text(),
            r#"UPDATE "jobs" SET "locked_until" = $1 WHERE "id" = $2 AND "locked_until" = $3"#
        );
        assert!(sql.retry_after.is_none());
    }

    #[test]
    fn many_acknowledgements_are_one_statement_each_row_guarded() {
        let n = names(Dialect::Postgres, Table::new("jobs"));
        let FinishMany::Returning(statements) = render_lease(&n, 8).finish_many else {
            panic!("PostgreSQL returns the settled ids");
        };
        assert_eq!(statements.len(), 7, "1, 2, 4, .. 64 rows");
        assert_eq!(
            statements[1].text(),
            r#"DELETE FROM "jobs" WHERE ("id", "locked_until") IN (($1, $2), ($3, $4)) RETURNING CAST("id" AS BIGINT)"#
        );
        let n = names(Dialect::MySql, Table::new("jobs").processed_at("done_at"));
        let FinishMany::LockThenFinish { held, finish } = render_lease(&n, 8).finish_many else {
            panic!("MySQL locks the rows still held first");
        };
        assert_eq!(
            held[0].text(),
            "SELECT CAST(`id` AS SIGNED) FROM `jobs` WHERE (`id`, `locked_until`) IN ((?, ?)) \
             FOR UPDATE"
        );
        assert_eq!(
            finish[1].text(),
            "UPDATE `jobs` SET `done_at` = ?, `locked_until` = NULL WHERE `id` IN (?, ?)"
        );
    }

    #[test]
    fn processed_at_marks_instead_of_deleting() {
        let table = Table::new("jobs")
            .processed_at("done_at")
            .retry_after("not_before");
        let n = names(Dialect::Sqlite, table);
        let sql = render_lease(&n, 8);
        assert_eq!(
            sql.finish.text(),
            "UPDATE `jobs` SET `done_at` = ?, `locked_until` = NULL \
             WHERE `id` = ? AND `locked_until` = ?"
        );
        assert_eq!(
            sql.retry_after.unwrap().text(),
            "UPDATE `jobs` SET `not_before` = ?, `locked_until` = NULL \
             WHERE `id` = ? AND `locked_until` = ?"
        );
    }

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
        let Claim::Returning(claim) = super::super::sqlite::lease_claim(&n) else {
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
    fn bulk_enqueue_is_one_statement() {
        let table = Table::new("jobs").group("queue");
        let n = Names::of_table(Dialect::Postgres, &table).unwrap();
        assert_eq!(
            super::enqueue_many(&n, 3),
            r#"INSERT INTO "jobs" ("payload", "queue") VALUES ($1, $2), ($3, $4), ($5, $6)"#
        );
    }
}
