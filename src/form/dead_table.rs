//! Whether a dead-letter table takes every row its queue moves into it, checked at start: a
//! move that fails leaves the row where it was, to fail again at its next cap.

use super::catalog::{Column, Fill, find_column};
use crate::dialect;
use crate::table::Dialect;

/// Checks the dead-letter table's columns (`dead`) against the queue table's (`queue`), each of
/// which it has (checked before). Returns the column at fault and what is wrong.
///
/// The move copies every column of the queue table (the lease column as NULL). So each copied
/// column must take the value as it is — the same type, or an integer type at least as wide
/// (on SQLite, a type of the same affinity) —, take NULL where the queue's column does, and not
/// be computed by the dead-letter table; and a column only the dead-letter table has must fill
/// itself: take NULL, have a default, or be generated, an identity, a serial, `AUTO_INCREMENT`
/// or SQLite's rowid alias.
pub(crate) fn check(
    dialect: Dialect,
    queue: &[Column],
    dead: &[Column],
) -> Result<(), (String, String)> {
    for column in queue {
        let Some(into) = find_column(dialect, dead, &column.name) else {
            continue;
        };
        let refuse = |reason: String| Err((into.name.clone(), reason));
        if into.fill == Fill::Generated {
            return refuse(
                "the dead-letter table computes this column (a generated column, or an identity \
                 GENERATED ALWAYS), so it refuses the value a moved row brings: declare it as a \
                 plain column"
                    .to_owned(),
            );
        }
        if !dialect::holds(dialect, &column.ty, &into.ty) {
            let same = match dialect {
                Dialect::Sqlite => "a type of the same affinity",
                Dialect::Postgres | Dialect::MySql => "the same type",
            };
            return refuse(format!(
                "the column has type `{}` in the dead-letter table and `{}` in the queue table, \
                 so a moved row's value might not fit or might change; it needs {same} (or an \
                 integer type at least as wide)",
                into.ty, column.ty
            ));
        }
        if column.nullable && !into.nullable {
            return refuse(
                "the column takes NULL in the queue table but not in the dead-letter table, so a \
                 row moved with NULL there (the lease column always is) would fail: let it take \
                 NULL"
                    .to_owned(),
            );
        }
    }
    for extra in dead {
        let own = find_column(dialect, queue, &extra.name).is_none();
        if own && !extra.nullable && extra.fill == Fill::Nothing {
            return Err((
                extra.name.clone(),
                "the dead-letter table's column is NOT NULL without a default, and the queue \
                 table has no such column, so every move would fail: give it a default, or let \
                 it take NULL"
                    .to_owned(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(name: &str, ty: &str, nullable: bool, fill: Fill) -> Column {
        Column {
            name: name.to_owned(),
            ty: ty.to_owned(),
            nullable,
            fill,
        }
    }

    fn queue() -> Vec<Column> {
        vec![
            column("id", "bigint", false, Fill::Default),
            column("payload", "bytea", false, Fill::Nothing),
            column("attempt", "integer", false, Fill::Default),
            column(
                "locked_until",
                "timestamp with time zone",
                true,
                Fill::Nothing,
            ),
        ]
    }

    fn refused(dead: &[Column]) -> String {
        check(Dialect::Postgres, &queue(), dead)
            .expect_err("refused")
            .0
    }

    #[test]
    fn the_queue_tables_own_columns_pass() {
        check(Dialect::Postgres, &queue(), &queue()).unwrap();
    }

    #[test]
    fn an_own_column_must_fill_itself() {
        let mut dead = queue();
        dead.push(column("reason", "text", false, Fill::Nothing));
        assert_eq!(refused(&dead), "reason");
        for fill in [Fill::Default, Fill::Generated] {
            dead.last_mut().unwrap().fill = fill;
            check(Dialect::Postgres, &queue(), &dead).unwrap();
        }
        dead.last_mut().unwrap().fill = Fill::Nothing;
        dead.last_mut().unwrap().nullable = true;
        check(Dialect::Postgres, &queue(), &dead).unwrap();
    }

    #[test]
    fn a_copied_column_takes_the_value_as_it_is() {
        let mut dead = queue();
        dead[2].ty = "bigint".to_owned();
        check(Dialect::Postgres, &queue(), &dead).unwrap();
        dead[2].ty = "smallint".to_owned();
        assert_eq!(refused(&dead), "attempt");
        let mut dead = queue();
        dead[3].nullable = false;
        assert_eq!(refused(&dead), "locked_until");
        let mut dead = queue();
        dead[0].fill = Fill::Generated;
        assert_eq!(refused(&dead), "id");
    }
}
