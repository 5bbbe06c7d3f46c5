//! What a column's type holds, read from the type's name as each database's catalog writes it
//! (`format_type` on PostgreSQL, `COLUMN_TYPE` on MySQL/MariaDB, the declared type on SQLite).

use super::{mysql, postgres, sqlite};
use crate::table::{Dialect, PayloadType};

/// What a column's type must hold for its role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Integer,
    Bytes,
    Text,
    Json,
    Jsonb,
    Time,
}

impl Kind {
    /// The kind of a payload column declared `payload_type`.
    pub(crate) fn payload(payload_type: PayloadType) -> Kind {
        match payload_type {
            PayloadType::Text => Kind::Text,
            PayloadType::Json => Kind::Json,
            PayloadType::Jsonb => Kind::Jsonb,
            _ => Kind::Bytes,
        }
    }

    /// Whether a column of type `ty` (as the catalog writes it) holds this kind.
    pub(crate) fn accepts(self, dialect: Dialect, ty: &str) -> bool {
        let ty = ty.to_ascii_lowercase();
        if self == Kind::Integer {
            return integer_range(dialect, &ty).is_some();
        }
        match dialect {
            Dialect::Postgres => postgres::accepts(self, &ty),
            Dialect::MySql => mysql::accepts(self, &ty),
            Dialect::Sqlite => sqlite::accepts(self, &ty),
        }
    }

    /// The types that hold this kind, in words.
    pub(crate) fn expected(self, dialect: Dialect) -> &'static str {
        match dialect {
            Dialect::Postgres => postgres::expected(self),
            Dialect::MySql => mysql::expected(self),
            Dialect::Sqlite => sqlite::expected(self),
        }
    }
}

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

/// Whether a column of type `into` takes every value of a column of type `from` as it is: the
/// same type, an integer type at least as wide, or on SQLite a type of the same affinity (SQLite
/// converts a value by the declared type's affinity alone, and enforces no length).
pub(crate) fn holds(dialect: Dialect, from: &str, into: &str) -> bool {
    if dialect == Dialect::Sqlite {
        return sqlite_affinity(from) == sqlite_affinity(into);
    }
    if let (Some((from_min, from_max)), Some((into_min, into_max))) =
        (integer_range(dialect, from), integer_range(dialect, into))
    {
        return into_min <= from_min && from_max <= into_max;
    }
    normalize(dialect, from) == normalize(dialect, into)
}

/// A type's name in one spelling: lower case, single spaces, and PostgreSQL's default time
/// precision (6) left out.
fn normalize(dialect: Dialect, ty: &str) -> String {
    let ty = ty
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_ascii_lowercase();
    match dialect {
        Dialect::Postgres => ty.replace("(6)", ""),
        Dialect::MySql | Dialect::Sqlite => ty,
    }
}

/// A declared type's affinity, by SQLite's rules (§3.1 of its "Datatypes" page), in their order.
fn sqlite_affinity(ty: &str) -> &'static str {
    let ty = ty.to_ascii_uppercase();
    let has = |part: &str| ty.contains(part);
    if has("INT") {
        "INTEGER"
    } else if has("CHAR") || has("CLOB") || has("TEXT") {
        "TEXT"
    } else if has("BLOB") || ty.trim().is_empty() {
        "BLOB"
    } else if has("REAL") || has("FLOA") || has("DOUB") {
        "REAL"
    } else {
        "NUMERIC"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_holds_the_same_type_or_a_wider_integer() {
        use Dialect::*;
        assert!(holds(Postgres, "integer", "integer"));
        assert!(holds(Postgres, "integer", "bigint"));
        assert!(!holds(Postgres, "bigint", "integer"));
        assert!(!holds(Postgres, "text", "character varying(64)"));
        assert!(!holds(Postgres, "integer", "text"));
        assert!(holds(
            Postgres,
            "timestamp with time zone",
            "timestamp(6) with time zone"
        ));
        assert!(holds(MySql, "int(11)", "bigint(20)"));
        assert!(holds(MySql, "tinyint(3) unsigned", "smallint(6)"));
        assert!(!holds(MySql, "int(11)", "int(10) unsigned"));
        assert!(!holds(MySql, "bigint(20) unsigned", "bigint(20)"));
        assert!(holds(MySql, "varchar(64)", "VARCHAR(64)"));
        assert!(!holds(MySql, "longblob", "blob"));
        assert!(holds(Sqlite, "INTEGER", "BIGINT"));
        assert!(holds(Sqlite, "TEXT", "VARCHAR(10)"));
        assert!(holds(Sqlite, "BLOB", ""));
        assert!(!holds(Sqlite, "TEXT", "INTEGER"));
        assert!(!holds(Sqlite, "TEXT", "JSON"));
    }

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
