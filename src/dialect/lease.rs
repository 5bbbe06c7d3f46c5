//! The lease form's statements, the same on every database but for quoting and placeholders
//! (each database's claim is its own, in its file): extend, release, settle, and many
//! acknowledgements in one statement, every one guarded by the row's token.

use super::common::{as_i64, finish, finish_ids, ids};
use super::{BySize, Claim, Dialect, Names, Slot, SqlWriter, Stmt};

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
    /// `lease = NULL, attempt = the count the claim read`, guarded: a row claimed but never
    /// delivered (claimed ahead of the workers when the runner stopped) goes back as it was;
    /// absent without an attempt column (`release` does).
    pub(crate) release_unstarted: Option<Stmt>,
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
    /// one statement per number of `(id, token)` pairs.
    pub(crate) finish_many: FinishMany,
    /// `finish_many` of rows that carry one token (a batch, or the rows of one claim): `id IN
    /// (..) AND lease = ?`, which SQLite runs for a fraction of the pairs' cost, with one token
    /// bound for all. PostgreSQL and SQLite: MariaDB plans a locking `id IN (..)` on a small
    /// table as a scan.
    pub(crate) finish_one_token: Option<OneToken>,
}

/// The acknowledgements of rows that carry one token, in one statement (`id IN (..) AND lease =
/// ?`): see [`LeaseSql::finish_one_token`].
#[derive(Debug, Clone)]
pub(crate) struct OneToken {
    /// The settlement. A table that deletes its finished rows: without `RETURNING`, its count of
    /// rows says whether it settled every one — rows returned one by one cost sqlx's SQLite
    /// driver a message each (a batch of 16 at one worker: 238M → 213M instructions per 5,000
    /// rows, the hand-written loop's 180M). A table that marks them (`processed_at`): returning
    /// the ids it settled.
    pub(crate) finish: BySize,
    /// `SELECT id .. WHERE id IN (..)` (tables that delete): after a settlement that counted
    /// fewer rows than its ids, the rows still there, which it did not settle (another claim
    /// took them).
    pub(crate) present: Option<BySize>,
}

/// How many acknowledgements one statement settles at most.
pub(crate) const MAX_FINISH: usize = 64;

/// Acknowledgements of many lease rows at once.
#[derive(Debug, Clone)]
pub(crate) enum FinishMany {
    /// `DELETE`/`UPDATE .. WHERE (id, lease) IN (..) RETURNING id`: the ids settled
    /// (PostgreSQL, SQLite; MariaDB's `DELETE`).
    Returning(BySize),
    /// In one transaction, `SELECT id .. WHERE (id, lease) IN (..) FOR UPDATE` — the rows still
    /// held — then the `DELETE`/`UPDATE` of those ids (MySQL, which has no `RETURNING`, and
    /// MariaDB's `UPDATE`).
    LockThenFinish { held: BySize, finish: BySize },
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
        if let Some(one) = &self.finish_one_token {
            all.extend(one.finish.iter().chain(one.present.iter().flatten()));
        }
        all.extend(self.retry_after.as_ref());
        all.extend(self.release_unstarted.as_ref());
        all
    }
}

/// `SET lease = ?, attempt = attempt + 1` (saturating) of a lease claim on the (quoted) column
/// `lease`.
pub(super) fn lease_set(w: &mut SqlWriter, n: &Names, lease: &str) {
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

/// `(id, lease) IN ((?, ?), ..)` of `count` pairs; one pair as `id = ? AND lease = ?`, which
/// MariaDB 10.11 reads through the primary key where it plans `IN ((?, ?))` as a scan.
fn pairs(w: &mut SqlWriter, n: &Names, lease: &str, count: u16) {
    if count == 1 {
        w.push(&n.id)
            .push(" = ")
            .param(Slot::IdAt(0))
            .push(" AND ")
            .push(lease)
            .push(" = ")
            .param(Slot::TokenAt(0));
        return;
    }
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

fn finish_many(n: &Names, lease: &str) -> FinishMany {
    // MariaDB returns from a `DELETE` (not from an `UPDATE`, a table that keeps finished rows).
    let returning = match n.dialect {
        Dialect::Postgres | Dialect::Sqlite => true,
        Dialect::MySql => n.delete_returning && n.processed_at.is_none(),
    };
    if returning {
        return FinishMany::Returning(BySize::new(MAX_FINISH, |count| {
            let mut w = n.writer();
            finish(&mut w, n);
            w.push(" WHERE ");
            pairs(&mut w, n, lease, count);
            w.push(" RETURNING ");
            as_i64(&mut w, &n.id);
            w.finish()
        }));
    }
    FinishMany::LockThenFinish {
        held: BySize::new(MAX_FINISH, |count| {
            let mut w = n.writer();
            w.push("SELECT ");
            as_i64(&mut w, &n.id);
            w.push(" FROM ").push(&n.table).push(" WHERE ");
            pairs(&mut w, n, lease, count);
            w.push(" FOR UPDATE");
            w.finish()
        }),
        finish: BySize::new(MAX_FINISH, |count| {
            let mut w = n.writer();
            finish_ids(&mut w, n, count);
            w.finish()
        }),
    }
}

/// The lease form's statements on the (quoted) lease column `lease`, around its claims.
pub(super) fn lease(
    n: &Names,
    lease: &str,
    claim: Claim,
    claim_excluding: Claim,
    next: Stmt,
) -> LeaseSql {
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

    let release_unstarted = n.attempt.as_deref().map(|attempt| {
        let mut w = n.writer();
        update(&mut w);
        w.push(lease)
            .push(" = NULL, ")
            .push(attempt)
            .push(" = ")
            .param(Slot::Attempt);
        guarded(&mut w, n, lease);
        w.finish()
    });

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
        release_unstarted,
        release_either,
        retry_after,
        finish,
        confirm,
        finish_many: finish_many(n, lease),
        finish_one_token: (n.dialect != Dialect::MySql).then(|| OneToken {
            finish: BySize::new(MAX_FINISH, |count| {
                let mut w = n.writer();
                finish_ids(&mut w, n, count);
                w.push(" AND ").push(lease).push(" = ").param(Slot::Token);
                if n.processed_at.is_some() {
                    w.push(" RETURNING ");
                    as_i64(&mut w, &n.id);
                }
                w.finish()
            }),
            present: n.processed_at.is_none().then(|| {
                BySize::new(MAX_FINISH, |count| {
                    let mut w = n.writer();
                    w.push("SELECT ");
                    as_i64(&mut w, &n.id);
                    w.push(" FROM ").push(&n.table).push(" WHERE ");
                    ids(&mut w, n, count);
                    w.finish()
                })
            }),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Dialect, Names, lease as render_lease};
    use super::FinishMany;
    use crate::table::Table;

    fn names(dialect: Dialect, table: Table) -> Names {
        Names::for_test(dialect, table, Some("mail"), "lease", true)
    }

    #[test]
    fn lease_settlements_carry_the_token() {
        let n = names(Dialect::Postgres, Table::new("jobs"));
        let sql = render_lease(&n, n.lease.as_deref().unwrap(), 8);
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
        assert_eq!(
            sql.release_unstarted.unwrap().text(),
            r#"UPDATE "jobs" SET "locked_until" = NULL, "attempt" = $1 WHERE "id" = $2 AND "locked_until" = $3"#
        );
    }

    #[test]
    fn many_acknowledgements_are_one_statement_each_row_guarded() {
        let n = names(Dialect::Postgres, Table::new("jobs"));
        let FinishMany::Returning(statements) =
            render_lease(&n, n.lease.as_deref().unwrap(), 8).finish_many
        else {
            panic!("PostgreSQL returns the settled ids");
        };
        assert_eq!(statements.iter().count(), 7, "1, 2, 4, .. 64 rows");
        let sql = render_lease(&n, n.lease.as_deref().unwrap(), 8);
        let one = sql.finish_one_token.unwrap();
        assert_eq!(
            one.finish.for_len(2).text(),
            r#"DELETE FROM "jobs" WHERE "id" IN ($1, $2) AND "locked_until" = $3"#
        );
        assert_eq!(
            one.present.unwrap().for_len(2).text(),
            r#"SELECT CAST("id" AS BIGINT) FROM "jobs" WHERE "id" IN ($1, $2)"#
        );
        let marking = names(
            Dialect::Postgres,
            Table::new("jobs").processed_at("done_at"),
        );
        let one = render_lease(&marking, marking.lease.as_deref().unwrap(), 8)
            .finish_one_token
            .unwrap();
        assert!(one.present.is_none());
        assert!(
            one.finish
                .for_len(2)
                .text()
                .ends_with(r#"RETURNING CAST("id" AS BIGINT)"#)
        );
        assert_eq!(
            statements.for_len(2).text(),
            r#"DELETE FROM "jobs" WHERE ("id", "locked_until") IN (($1, $2), ($3, $4)) RETURNING CAST("id" AS BIGINT)"#
        );
        let n = names(Dialect::MySql, Table::new("jobs").processed_at("done_at"));
        let FinishMany::LockThenFinish { held, finish } =
            render_lease(&n, n.lease.as_deref().unwrap(), 8).finish_many
        else {
            panic!("MySQL locks the rows still held first");
        };
        assert_eq!(
            held.for_len(1).text(),
            "SELECT CAST(`id` AS SIGNED) FROM `jobs` WHERE `id` = ? AND `locked_until` = ? \
             FOR UPDATE"
        );
        assert_eq!(
            held.for_len(2).text(),
            "SELECT CAST(`id` AS SIGNED) FROM `jobs` WHERE (`id`, `locked_until`) IN ((?, ?), \
             (?, ?)) FOR UPDATE"
        );
        assert_eq!(
            finish.for_len(2).text(),
            "UPDATE `jobs` SET `done_at` = ?, `locked_until` = NULL WHERE `id` IN (?, ?)"
        );
        let mut n = names(Dialect::MySql, Table::new("jobs"));
        n.delete_returning = true;
        let FinishMany::Returning(statements) =
            render_lease(&n, n.lease.as_deref().unwrap(), 8).finish_many
        else {
            panic!("MariaDB returns the deleted ids");
        };
        assert_eq!(
            statements.for_len(2).text(),
            "DELETE FROM `jobs` WHERE (`id`, `locked_until`) IN ((?, ?), (?, ?)) RETURNING \
             CAST(`id` AS SIGNED)"
        );
    }

    #[test]
    fn processed_at_marks_instead_of_deleting() {
        let table = Table::new("jobs")
            .processed_at("done_at")
            .retry_after("not_before");
        let n = names(Dialect::Sqlite, table);
        let sql = render_lease(&n, n.lease.as_deref().unwrap(), 8);
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
}
