//! What a column's type holds, read from the type's name as each database's catalog writes it
//! (`format_type` on PostgreSQL, `COLUMN_TYPE` on MySQL/MariaDB, the declared type on SQLite).

use super::Dialect;

/// The values an integer type holds, `(smallest, largest)`; `None` for a type that is not an
/// integer.
pub(crate) fn integer_range(dialect: Dialect, ty: &str) -> Option<(i128, i128)> {
    let ty = ty.to_ascii_lowercase();
    let signed = |bits: u32| Some((-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1));
    match dialect {
        Dialect::Postgres => match ty.as_str() {
            "smallint" => signed(16),
            "integer" => signed(32),
            "bigint" => signed(64),
            _ => None,
        },
        // `int(11)`, `tinyint(3) unsigned`, `bigint unsigned zerofill`: the display width does
        // not change the range.
        Dialect::MySql => {
            let bits = match ty.split(['(', ' ']).next()? {
                "tinyint" => 8,
                "smallint" => 16,
                "mediumint" => 24,
                "int" | "integer" => 32,
                "bigint" => 64,
                _ => return None,
            };
            if ty.split([' ', ')']).any(|word| word == "unsigned") {
                Some((0, (1i128 << bits) - 1))
            } else {
                signed(bits)
            }
        }
        // Any declared type containing INT has integer affinity: 64-bit values.
        Dialect::Sqlite => ty.contains("int").then(|| signed(64)).flatten(),
    }
}

/// The largest value the statements may write into an attempt column of type `ty`: the type's
/// own, or `i64::MAX` where it is larger (MySQL's `bigint unsigned`), since attempts are read as
/// `i64`.
pub(crate) fn attempt_max(dialect: Dialect, ty: &str) -> i64 {
    integer_range(dialect, ty).map_or(i64::MAX, |(_, max)| i64::try_from(max).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_ranges_per_dialect() {
        assert_eq!(attempt_max(Dialect::Postgres, "smallint"), 32_767);
        assert_eq!(attempt_max(Dialect::Postgres, "integer"), 2_147_483_647);
        assert_eq!(attempt_max(Dialect::Postgres, "bigint"), i64::MAX);
        assert_eq!(integer_range(Dialect::Postgres, "numeric"), None);
        assert_eq!(
            integer_range(Dialect::MySql, "tinyint(4)"),
            Some((-128, 127))
        );
        assert_eq!(
            integer_range(Dialect::MySql, "tinyint(3) unsigned"),
            Some((0, 255))
        );
        assert_eq!(
            attempt_max(Dialect::MySql, "smallint unsigned zerofill"),
            65_535
        );
        assert_eq!(attempt_max(Dialect::MySql, "mediumint(9)"), 8_388_607);
        assert_eq!(
            attempt_max(Dialect::MySql, "int(10) unsigned"),
            4_294_967_295
        );
        assert_eq!(attempt_max(Dialect::MySql, "bigint(20)"), i64::MAX);
        assert_eq!(attempt_max(Dialect::MySql, "bigint(20) unsigned"), i64::MAX);
        assert_eq!(integer_range(Dialect::MySql, "point"), None);
        assert_eq!(attempt_max(Dialect::Sqlite, "TINYINT"), i64::MAX);
        assert_eq!(attempt_max(Dialect::Sqlite, "INTEGER"), i64::MAX);
        assert_eq!(integer_range(Dialect::Sqlite, "TEXT"), None);
    }
}
