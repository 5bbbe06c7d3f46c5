//! The baseline's statements: per database and claim form, the fewest statements the form
//! allows, written here by hand (not read from the crate's renderer) for the benches' table
//! `(id, payload, attempt, locked_until)`. The throughput bench runs them all; the latency bench
//! runs the lease form's to count the driver's own allocations.
//!
//! Round trips per batch of n rows (a single delivery is a batch of one); none grows with n:
//!
//! | form | PostgreSQL | MySQL/MariaDB | SQLite |
//! |---|---|---|---|
//! | row lock | `BEGIN`, claim, `DELETE`, `COMMIT`: 4 | the same: 4 | (no row locks) |
//! | lease | claim, `DELETE`: 2 | `BEGIN`, claim, `UPDATE`, `COMMIT`, `DELETE`: 5 | claim, `DELETE`: 2 |
//! | advisory | lock, take, `DELETE`, unlock: 4 | lock, count, take, `DELETE`, unlock: 5 | candidates, take, `DELETE`: 3 |
//!
//! Every form counts attempts as the crate's queues in the benches do (`.attempt("attempt")`),
//! by columns of these statements: the lease claim and the advisory take add one to `attempt`
//! before the handler runs; the row lock claim reads it (a crash rolls the transaction back, so
//! the form counts at settlement, and an ack deletes the row). MySQL/MariaDB has no
//! `UPDATE … RETURNING`: there the advisory form counts with an `UPDATE` and reads the rows with
//! a `SELECT`, one statement more than on PostgreSQL. SQLite's advisory keys live in the
//! process (as the crate's do): its baseline locks them in a `HashSet`, without a round trip.
//!
//! MySQL/MariaDB sessions run at READ COMMITTED (set once per connection), as the crate's claim
//! transactions do. PostgreSQL binds id lists as one array (`= ANY($1)`); MySQL and SQLite
//! render one text per list length (`IN (?, ?, …)`), each prepared once per connection.

/// `?, ?, …`: `n` placeholders.
fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// PostgreSQL.
pub(crate) mod postgres {
    /// Row lock, in a transaction: up to `$1` rows, locked until `COMMIT`.
    pub(crate) fn row_lock_claim(t: &str) -> String {
        format!("SELECT id, payload, attempt FROM {t} ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED")
    }

    /// Row lock and advisory: the batch's acks.
    pub(crate) fn delete(t: &str) -> String {
        format!("DELETE FROM {t} WHERE id = ANY($1)")
    }

    /// Lease: up to `$3` rows free at `$2`, leased until `$1` (the token), attempt counted.
    pub(crate) fn lease_claim(t: &str) -> String {
        format!(
            "UPDATE {t} SET locked_until = $1, attempt = attempt + 1 WHERE id IN (SELECT id \
             FROM {t} WHERE locked_until IS NULL OR locked_until < $2 ORDER BY id LIMIT $3 FOR \
             UPDATE SKIP LOCKED) RETURNING id, payload, attempt"
        )
    }

    /// Lease: the batch's acks, fenced by the token `$2`.
    pub(crate) fn lease_delete(t: &str) -> String {
        format!("DELETE FROM {t} WHERE id = ANY($1) AND locked_until = $2")
    }

    /// Advisory: session locks on up to `$2` free rows in id order, keys `($1 << 32) | id`.
    /// `OFFSET 0` keeps the lock call out of the inner scan, so only the rows returned (and the
    /// ones held elsewhere) are tried.
    pub(crate) fn advisory_lock(t: &str) -> String {
        format!(
            "SELECT id FROM (SELECT id FROM {t} ORDER BY id OFFSET 0) c WHERE \
             pg_try_advisory_lock(($1::int8 << 32) | id) LIMIT $2"
        )
    }

    /// Advisory: re-reads the locked rows (one settled elsewhere after the lock's snapshot is
    /// gone) and counts their attempt.
    pub(crate) fn advisory_take(t: &str) -> String {
        format!(
            "UPDATE {t} SET attempt = attempt + 1 WHERE id = ANY($1) RETURNING id, payload, attempt"
        )
    }

    /// Advisory: releases every key of the batch; true when each was held.
    pub(crate) fn advisory_unlock() -> String {
        "SELECT bool_and(pg_advisory_unlock(($1::int8 << 32) | k)) FROM unnest($2::int8[]) AS k"
            .to_owned()
    }
}

/// MySQL and MariaDB.
pub(crate) mod mysql {
    use super::marks;

    /// Once per connection: claims read the latest committed rows and lock only those they take.
    pub(crate) const SESSION: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

    /// Row lock, in a transaction: up to `?` rows, locked until `COMMIT`.
    pub(crate) fn row_lock_claim(t: &str) -> String {
        format!("SELECT id, payload, attempt FROM {t} ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED")
    }

    /// Row lock and advisory: the acks of `n` rows.
    pub(crate) fn delete(t: &str, n: usize) -> String {
        format!("DELETE FROM {t} WHERE id IN ({})", marks(n))
    }

    /// Lease, in a transaction: up to `?` rows free at `?`, locked until `COMMIT`.
    pub(crate) fn lease_claim(t: &str) -> String {
        format!(
            "SELECT id, payload, attempt FROM {t} WHERE locked_until IS NULL OR locked_until < ? \
             ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED"
        )
    }

    /// Lease, in the claim's transaction: leases `n` rows until `?` (the token), attempt counted.
    pub(crate) fn lease_update(t: &str, n: usize) -> String {
        format!(
            "UPDATE {t} SET locked_until = ?, attempt = attempt + 1 WHERE id IN ({})",
            marks(n)
        )
    }

    /// Lease: the acks of `n` rows, fenced by the token.
    pub(crate) fn lease_delete(t: &str, n: usize) -> String {
        format!(
            "DELETE FROM {t} WHERE id IN ({}) AND locked_until = ?",
            marks(n)
        )
    }

    /// Advisory: named locks (`GET_LOCK(prefix || id, 0)`) on up to the last `?` rows free
    /// among the first `?` in id order. The derived table has a `LIMIT`, so the server neither
    /// merges it nor pushes the lock call into it: the call runs on the rows read, in order,
    /// until the outer `LIMIT` is reached.
    pub(crate) fn advisory_lock(t: &str) -> String {
        format!(
            "SELECT c.id FROM (SELECT id FROM {t} ORDER BY id LIMIT ?) AS c WHERE \
             GET_LOCK(CONCAT(?, c.id), 0) = 1 LIMIT ?"
        )
    }

    /// Advisory: counts the attempt of `n` locked rows.
    pub(crate) fn advisory_count(t: &str, n: usize) -> String {
        format!(
            "UPDATE {t} SET attempt = attempt + 1 WHERE id IN ({})",
            marks(n)
        )
    }

    /// Advisory: re-reads `n` locked rows (one settled elsewhere after the lock's snapshot is
    /// gone).
    pub(crate) fn advisory_take(t: &str, n: usize) -> String {
        format!(
            "SELECT id, payload, attempt FROM {t} WHERE id IN ({})",
            marks(n)
        )
    }

    /// Advisory: releases `n` named locks; the sum is `n` when each was held.
    pub(crate) fn advisory_unlock(n: usize) -> String {
        format!(
            "SELECT CAST({} AS SIGNED)",
            vec!["RELEASE_LOCK(?)"; n].join(" + ")
        )
    }
}

/// SQLite.
pub(crate) mod sqlite {
    use super::marks;

    /// Lease: up to `?` rows free at `?`, leased until `?` (the token), attempt counted. One
    /// writer at a time: the statement takes the database's write lock, no row is skipped.
    /// The `LIMIT` is an expression: SQLite 3.51 reads a bare `LIMIT ?` when it prepares the
    /// statement, and prepares it again whenever that parameter is bound anew.
    pub(crate) fn lease_claim(t: &str) -> String {
        format!(
            "UPDATE {t} SET locked_until = ?, attempt = attempt + 1 WHERE id IN (SELECT id FROM \
             {t} WHERE locked_until IS NULL OR locked_until < ? ORDER BY id \
             LIMIT CAST(? AS INTEGER)) RETURNING id, payload, attempt"
        )
    }

    /// Lease: the acks of `n` rows, fenced by the token.
    pub(crate) fn lease_delete(t: &str, n: usize) -> String {
        format!(
            "DELETE FROM {t} WHERE id IN ({}) AND locked_until = ?",
            marks(n)
        )
    }

    /// Advisory: the first `?` rows in id order, among which a worker locks free keys in the
    /// process (the `LIMIT` an expression, as in `lease_claim`).
    pub(crate) fn advisory_candidates(t: &str) -> String {
        format!("SELECT id FROM {t} ORDER BY id LIMIT CAST(? AS INTEGER)")
    }

    /// Advisory: re-reads `n` locked rows and counts their attempt.
    pub(crate) fn advisory_take(t: &str, n: usize) -> String {
        format!(
            "UPDATE {t} SET attempt = attempt + 1 WHERE id IN ({}) RETURNING id, payload, attempt",
            marks(n)
        )
    }

    /// Advisory: the acks of `n` rows.
    pub(crate) fn delete(t: &str, n: usize) -> String {
        format!("DELETE FROM {t} WHERE id IN ({})", marks(n))
    }
}
