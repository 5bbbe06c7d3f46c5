use super::super::{Dialect, Names, Slot};
use crate::table::Table;

fn names(dialect: Dialect, table: Table, advisory: bool) -> Names {
    let form = if advisory { "advisory" } else { "row_lock" };
    Names::for_test(dialect, table, Some("mail"), form, true)
}

#[test]
fn row_lock_claims_one_locked_row_and_counts_on_return() {
    let table = Table::new("jobs").group("queue").retry_after("not_before");
    let mut n = names(Dialect::Postgres, table, false);
    n.attempt_max = 32_767; // a smallint column
    let sql = super::row_lock(&n);
    assert_eq!(
        sql.claim.text(),
        r#"SELECT CAST("id" AS BIGINT), "payload", CAST("attempt" AS BIGINT) FROM "jobs" WHERE "queue" = $1 AND "id" >= $2 AND ("not_before" IS NULL OR "not_before" <= $3) ORDER BY "id" LIMIT $4 FOR UPDATE SKIP LOCKED"#
    );
    assert_eq!(
        sql.retry.unwrap().text(),
        r#"UPDATE "jobs" SET "attempt" = CASE WHEN "attempt" < 32767 THEN "attempt" + 1 ELSE "attempt" END WHERE "id" = $1"#
    );
    assert_eq!(
        sql.retry_after.unwrap().text(),
        r#"UPDATE "jobs" SET "not_before" = $1, "attempt" = CASE WHEN "attempt" < 32767 THEN "attempt" + 1 ELSE "attempt" END WHERE "id" = $2"#
    );
    assert_eq!(sql.finish.text(), r#"DELETE FROM "jobs" WHERE "id" = $1"#);
    assert!(sql.begin.is_none());
    let mysql = super::row_lock(&names(Dialect::MySql, Table::new("jobs"), false));
    assert_eq!(
        mysql.begin,
        Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
    );
}

#[test]
fn row_lock_batches_on_mysql_reach_each_row_through_the_primary_key() {
    let table = Table::new("jobs").processed_at("done_at");
    let sql = super::row_lock(&names(Dialect::MySql, table, false));
    assert_eq!(
        sql.finish_many.for_len(2).text(),
        "UPDATE (SELECT CAST(? AS SIGNED) AS sqlxq_id UNION SELECT CAST(? AS SIGNED) AS \
         sqlxq_id) AS sqlxq_ids STRAIGHT_JOIN `jobs` ON `jobs`.`id` = sqlxq_ids.sqlxq_id \
         SET `done_at` = ?"
    );
    let sql = super::row_lock(&names(Dialect::MySql, Table::new("jobs"), false));
    assert_eq!(
        sql.finish_many.for_len(1).text(),
        "DELETE `jobs` FROM (SELECT CAST(? AS SIGNED) AS sqlxq_id) AS sqlxq_ids \
         STRAIGHT_JOIN `jobs` ON `jobs`.`id` = sqlxq_ids.sqlxq_id"
    );
    assert!(sql.retry_many.unwrap().for_len(2).text().ends_with(
        "ON `jobs`.`id` = sqlxq_ids.sqlxq_id SET `attempt` = CASE WHEN `attempt` < \
             9223372036854775807 THEN `attempt` + 1 ELSE `attempt` END"
    ));
}

#[test]
fn advisory_takes_keys_in_the_query_and_settles_many_rows_in_one_statement() {
    let sql = super::advisory(&names(Dialect::Postgres, Table::new("jobs"), true));
    assert_eq!(
        sql.lock_many.unwrap().text(),
        r#"SELECT CAST(c.sqlxq_id AS BIGINT) FROM (SELECT "id" AS sqlxq_id FROM "jobs" WHERE "id" >= $1 ORDER BY "id" LIMIT $2) AS c WHERE pg_try_advisory_lock(((CAST($3 AS BIGINT) << 32) | (CAST(c.sqlxq_id AS BIGINT) & 4294967295))) LIMIT $4"#
    );
    assert_eq!(
        sql.take.text(),
        r#"UPDATE "jobs" SET "attempt" = CASE WHEN "attempt" < 9223372036854775807 THEN "attempt" + 1 ELSE "attempt" END WHERE "id" = $1 AND 1 = 1 RETURNING CAST("id" AS BIGINT), "payload", CAST("attempt" AS BIGINT) - 1"#
    );
    assert_eq!(
        sql.take_many.for_len(2).text(),
        r#"UPDATE "jobs" SET "attempt" = CASE WHEN "attempt" < 9223372036854775807 THEN "attempt" + 1 ELSE "attempt" END WHERE "id" IN ($1, $2) AND 1 = 1 RETURNING CAST("id" AS BIGINT), "payload", CAST("attempt" AS BIGINT) - 1"#
    );
    assert_eq!(
        sql.unlock_many.as_ref().unwrap().for_len(2).text(),
        "SELECT d.k FROM (SELECT DISTINCT v.k FROM (VALUES (CAST($1 AS BIGINT)), (CAST($2 AS \
         BIGINT))) AS v (k)) AS d WHERE pg_advisory_unlock(((CAST($3 AS BIGINT) << 32) | \
         (CAST(d.k AS BIGINT) & 4294967295)))"
    );
    assert_eq!(
        sql.finish_many.for_len(4).text(),
        r#"DELETE FROM "jobs" WHERE "id" IN ($1, $2, $3, $4)"#
    );
    assert_eq!(
        sql.finish_unlock_many.as_ref().unwrap().for_len(2).text(),
        "WITH d AS (DELETE FROM \"jobs\" WHERE \"id\" IN ($1, $2) RETURNING 1) SELECT v.k \
         FROM (SELECT DISTINCT v.k FROM (VALUES (CAST($3 AS BIGINT)), (CAST($4 AS BIGINT))) \
         AS v (k)) AS v WHERE CASE WHEN (SELECT COUNT(*) FROM d) < 0 THEN FALSE WHEN \
         pg_try_advisory_xact_lock(((CAST($5 AS BIGINT) << 32) | (CAST(v.k AS BIGINT) & \
         4294967295))) THEN pg_advisory_unlock(((CAST($6 AS BIGINT) << 32) | (CAST(v.k AS \
         BIGINT) & 4294967295))) ELSE FALSE END"
    );
    assert_eq!(
        sql.lock_take.as_ref().unwrap().text(),
        "WITH sqlxq_keys (sqlxq_id) AS MATERIALIZED (SELECT CAST(c.sqlxq_id AS BIGINT) FROM \
         (SELECT \"id\" AS sqlxq_id FROM \"jobs\" WHERE \"id\" >= $1 ORDER BY \"id\" LIMIT $2) AS c \
         WHERE pg_try_advisory_lock(((CAST($3 AS BIGINT) << 32) | (CAST(c.sqlxq_id AS BIGINT) & \
         4294967295))) LIMIT $4), sqlxq_taken (sqlxq_id, sqlxq_1, sqlxq_2) AS (UPDATE \"jobs\" SET \
         \"attempt\" = CASE WHEN \"attempt\" < 9223372036854775807 THEN \"attempt\" + 1 ELSE \
         \"attempt\" END WHERE \"id\" = ANY(ARRAY(SELECT sqlxq_id FROM sqlxq_keys)) AND 1 = 1 RETURNING \
         CAST(\"id\" AS BIGINT), \"payload\", CAST(\"attempt\" AS BIGINT) - 1) SELECT k.sqlxq_id, \
         r.sqlxq_1, r.sqlxq_2, CASE WHEN r.sqlxq_id IS NOT NULL THEN CAST(0 AS BIGINT) WHEN \
         pg_advisory_unlock(((CAST($5 AS BIGINT) << 32) | (CAST(k.sqlxq_id AS BIGINT) & \
         4294967295))) THEN CAST(1 AS BIGINT) ELSE CAST(2 AS BIGINT) END FROM sqlxq_keys AS k LEFT \
         JOIN LATERAL (SELECT t.sqlxq_id, t.sqlxq_1, t.sqlxq_2 FROM sqlxq_taken AS t WHERE \
         t.sqlxq_id = k.sqlxq_id OFFSET 0) AS r ON true"
    );
    assert_eq!(
        sql.unlock_all.as_ref().unwrap().text(),
        "SELECT pg_advisory_unlock_all()"
    );
    assert!(sql.count.is_none() && sql.count_many.is_none());
    assert_eq!(
        sql.restore_attempt.unwrap().text(),
        r#"UPDATE "jobs" SET "attempt" = $1 WHERE "id" = $2"#
    );

    let mut n = names(Dialect::MySql, Table::new("jobs"), true);
    n.attempt_max = 255; // a tinyint unsigned column
    let sql = super::advisory(&n);
    let lock = sql.lock_many.unwrap();
    assert!(
        lock.text().starts_with(
            "SELECT CAST(c.sqlxq_id AS SIGNED) FROM (SELECT `id` AS sqlxq_id FROM `jobs` \
             WHERE `id` >= ? ORDER BY `id` LIMIT ?) AS c WHERE GET_LOCK(IF(CHAR_LENGTH(CONCAT(?, \
             c.sqlxq_id)) > 64"
        ) && lock.text().ends_with(", 0) = 1 LIMIT ?"),
        "{}",
        lock.text()
    );
    assert_eq!(
        sql.count.unwrap().text(),
        "UPDATE `jobs` SET `attempt` = CASE WHEN `attempt` < 255 THEN `attempt` + 1 \
         ELSE `attempt` END WHERE `id` = ?"
    );
    assert_eq!(
        sql.count_many.unwrap().for_len(2).text(),
        "UPDATE `jobs` SET `attempt` = CASE WHEN `attempt` < 255 THEN `attempt` + 1 \
         ELSE `attempt` END WHERE `id` IN (?, ?)"
    );
    // Acks: the DELETE commits, then the keys are released, in one round trip.
    let finish_unlock = sql.finish_unlock_many.as_ref().unwrap().for_len(2);
    assert!(finish_unlock.multi());
    assert!(
        finish_unlock.text().starts_with(
            "DELETE FROM `jobs` WHERE `id` IN (?, ?); SELECT CAST(d.k AS SIGNED) FROM (SELECT \
             CAST(? AS SIGNED) AS k UNION SELECT CAST(? AS SIGNED) AS k) AS d WHERE RELEASE_LOCK("
        ),
        "{}",
        finish_unlock.text()
    );
    // The count, then the read of the rows it counted, found again by the same condition.
    let take_count = sql.take_count_many.as_ref().unwrap().for_len(2);
    assert!(take_count.multi());
    assert_eq!(
        take_count.text(),
        "UPDATE `jobs` SET `attempt` = CASE WHEN `attempt` < 255 THEN `attempt` + 1 \
         ELSE `attempt` END WHERE `id` IN (?, ?) AND 1 = 1; SELECT CAST(`id` AS SIGNED), \
         `payload`, CAST(`attempt` AS SIGNED) - 1 FROM `jobs` WHERE `id` IN (?, ?) AND 1 = 1"
    );
    // Where the client writes the lock names: one row of one column, a character per name.
    let named = super::super::finish_unlock_named(&names(Dialect::MySql, Table::new("jobs"), true));
    let named = named.for_len(2);
    assert!(named.multi());
    assert_eq!(
        named.text(),
        "DELETE FROM `jobs` WHERE `id` IN (?, ?); SELECT CONCAT(RELEASE_LOCK(?) <=> 1, \
         RELEASE_LOCK(?) <=> 1)"
    );
    assert_eq!(named.slots[2..], [Slot::LockNameAt(0), Slot::LockNameAt(1)]);
    assert!(sql.unlock_many.unwrap().for_len(2).text().starts_with(
        "SELECT CAST(d.k AS SIGNED) FROM (SELECT CAST(? AS SIGNED) AS k UNION SELECT \
             CAST(? AS SIGNED) AS k) AS d WHERE RELEASE_LOCK("
    ));
    assert!(
        sql.lock_take.is_none(),
        "MySQL/MariaDB have no UPDATE .. RETURNING"
    );
    let sql = super::advisory(&names(Dialect::Sqlite, Table::new("jobs"), true));
    assert!(sql.lock_many.is_none() && sql.unlock.is_none() && sql.unlock_many.is_none());
    assert!(sql.lock_take.is_none());
}

#[test]
fn row_lock_fifo_claims_a_group_s_first_due_row_and_guards_the_group_s_first_row() {
    let table = Table::new("jobs").group("queue").retry_after("not_before");
    let mut n = Names::for_test(Dialect::Postgres, table, None, "row_lock", false);
    n.fifo = Some(super::super::names::Fifo {
        group: r#""queue""#.to_owned(),
        lease: None,
        limit: 1,
    });
    let sql = super::row_lock(&n);
    assert_eq!(
        sql.guard.unwrap().text(),
        r#"SELECT CAST("id" AS BIGINT) FROM "jobs" WHERE "id" = (SELECT MIN(h."id") FROM "jobs" AS h WHERE h."queue" = (SELECT g."queue" FROM "jobs" AS g WHERE g."id" = $1)) FOR UPDATE SKIP LOCKED"#
    );
    assert_eq!(
        sql.claim.text(),
        r#"SELECT CAST("id" AS BIGINT), "payload" FROM "jobs" WHERE ("not_before" IS NULL OR "not_before" <= $1) AND "id" = ANY (ARRAY(WITH RECURSIVE sqlxq_g (k) AS (SELECT (SELECT h."queue" FROM "jobs" AS h WHERE h."queue" IS NOT NULL ORDER BY h."queue" LIMIT 1) UNION ALL SELECT (SELECT h."queue" FROM "jobs" AS h WHERE h."queue" > sqlxq_g.k ORDER BY h."queue" LIMIT 1) FROM sqlxq_g WHERE sqlxq_g.k IS NOT NULL) SELECT (SELECT h."id" FROM "jobs" AS h WHERE h."queue" = sqlxq_g.k AND (h."not_before" IS NULL OR h."not_before" <= $2) ORDER BY h."id" LIMIT 1) FROM sqlxq_g)) ORDER BY "id" LIMIT $3 FOR UPDATE SKIP LOCKED"#
    );
}

#[test]
fn a_by_key_claim_reads_the_key_as_the_bytes_of_its_text_after_the_headers_from_the_start() {
    let keyed = |dialect: Dialect| {
        let mut n = names(dialect, Table::new("jobs").headers("headers"), false);
        n.key = Some(dialect.quote("account").unwrap());
        n
    };
    let sql = super::row_lock(&keyed(Dialect::Postgres));
    assert_eq!(
        sql.claim.text(),
        r#"SELECT CAST("id" AS BIGINT), "payload", CAST("attempt" AS BIGINT), convert_to("headers"::text, 'UTF8'), convert_to(CAST("account" AS TEXT), 'UTF8') FROM "jobs" WHERE 1 = 1 ORDER BY "id" LIMIT $1 FOR UPDATE SKIP LOCKED"#
    );
    let sql = super::row_lock(&keyed(Dialect::MySql));
    assert!(
        sql.claim.text().starts_with(
            "SELECT CAST(`id` AS SIGNED), `payload`, CAST(`attempt` AS SIGNED), \
             CAST(CONVERT(`headers` USING utf8mb4) AS BINARY), CAST(`account` AS BINARY) FROM"
        ),
        "{}",
        sql.claim.text()
    );
    let n = keyed(Dialect::Sqlite);
    let mut w = n.writer();
    n.read_key(&mut w, "q.");
    assert_eq!(w.finish().text(), ", CAST(q.`account` AS BLOB)");
}
