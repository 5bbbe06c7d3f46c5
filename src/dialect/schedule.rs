//! The statements of periodic jobs' ticks, on the table where each schedule records the last
//! tick that was fired (`name` primary key, `last_tick` a time): the row's insert when the
//! schedule first starts, the read of its last tick, and the compare-and-set that fires a tick —
//! only the runner whose update moved `last_tick` forward enqueues the tick's job, in the same
//! transaction.

use super::{Dialect, Slot, SqlWriter, Stmt};

/// The statements of one schedules table, rendered once per runner.
#[derive(Debug, Clone)]
pub(crate) struct TickSql {
    /// `INSERT` of the schedule's row with its first `last_tick`; a row already there is left
    /// as it is (PostgreSQL and SQLite: `ON CONFLICT (name) DO NOTHING`; MySQL/MariaDB: the
    /// duplicate-key error, which the caller reads). Binds the name, then the time.
    pub(crate) seed: Stmt,
    /// `SELECT last_tick` of the schedule's row. Binds the name.
    pub(crate) last: Stmt,
    /// `UPDATE .. SET last_tick = tick WHERE name = .. AND last_tick < tick`: one row changed
    /// when this tick was not fired yet. Binds the tick, the name, the tick.
    pub(crate) advance: Stmt,
}

/// The statements on `table` (quoted), run unprepared where `unprepared`.
pub(crate) fn ticks(dialect: Dialect, table: &str, unprepared: bool) -> TickSql {
    let (name, last_tick) = match dialect {
        Dialect::MySql | Dialect::Sqlite => ("`name`", "`last_tick`"),
        Dialect::Postgres => ("\"name\"", "\"last_tick\""),
    };
    let writer = || SqlWriter::new(dialect).unprepared(unprepared);

    let mut w = writer();
    w.push("INSERT INTO ")
        .push(table)
        .push(" (")
        .push(name)
        .push(", ")
        .push(last_tick)
        .push(") VALUES (")
        .param(Slot::Schedule)
        .push(", ")
        .param(Slot::Tick)
        .push(")");
    if dialect != Dialect::MySql {
        w.push(" ON CONFLICT (").push(name).push(") DO NOTHING");
    }
    let seed = w.finish();

    let mut w = writer();
    w.push("SELECT ")
        .push(last_tick)
        .push(" FROM ")
        .push(table)
        .push(" WHERE ")
        .push(name)
        .push(" = ")
        .param(Slot::Schedule);
    let last = w.finish();

    let mut w = writer();
    w.push("UPDATE ")
        .push(table)
        .push(" SET ")
        .push(last_tick)
        .push(" = ")
        .param(Slot::Tick)
        .push(" WHERE ")
        .push(name)
        .push(" = ")
        .param(Slot::Schedule)
        .push(" AND ")
        .push(last_tick)
        .push(" < ")
        .param(Slot::Tick);
    let advance = w.finish();

    TickSql {
        seed,
        last,
        advance,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_is_fired_by_the_update_that_moves_last_tick_forward() {
        let pg = ticks(Dialect::Postgres, "\"sqlx_queue_schedules\"", false);
        assert_eq!(
            pg.seed.text(),
            r#"INSERT INTO "sqlx_queue_schedules" ("name", "last_tick") VALUES ($1, $2) ON CONFLICT ("name") DO NOTHING"#
        );
        assert_eq!(
            pg.last.text(),
            r#"SELECT "last_tick" FROM "sqlx_queue_schedules" WHERE "name" = $1"#
        );
        assert_eq!(
            pg.advance.text(),
            r#"UPDATE "sqlx_queue_schedules" SET "last_tick" = $1 WHERE "name" = $2 AND "last_tick" < $3"#
        );
        assert_eq!(&*pg.advance.slots, [Slot::Tick, Slot::Schedule, Slot::Tick]);
        let my = ticks(Dialect::MySql, "`app`.`ticks`", false);
        assert_eq!(
            my.seed.text(),
            "INSERT INTO `app`.`ticks` (`name`, `last_tick`) VALUES (?, ?)"
        );
        assert_eq!(
            my.advance.text(),
            "UPDATE `app`.`ticks` SET `last_tick` = ? WHERE `name` = ? AND `last_tick` < ?"
        );
        let lite = ticks(Dialect::Sqlite, "`ticks`", false);
        assert_eq!(
            lite.seed.text(),
            "INSERT INTO `ticks` (`name`, `last_tick`) VALUES (?, ?) ON CONFLICT (`name`) DO NOTHING"
        );
        assert!(ticks(Dialect::Postgres, "\"t\"", true).advance.unprepared);
    }
}
