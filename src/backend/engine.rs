//! Which server speaks a dialect, as its version string names it: engines that take PostgreSQL's
//! or MySQL's protocol and statements but not all of their locking (CockroachDB, YugabyteDB,
//! TiDB), told apart at start so that the forms they cannot hold a row with are refused there.

use crate::table::Dialect;

/// The server behind a connection, from its version string (PostgreSQL's `version()`,
/// MySQL's `VERSION()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    PostgreSql,
    /// CockroachDB: `version()` starts `CockroachDB`.
    CockroachDb,
    /// YugabyteDB's YSQL: `version()` carries `-YB-` (`PostgreSQL 11.2-YB-2.20.1.0-b0 on ..`).
    YugabyteDb,
    MySql,
    MariaDb,
    /// TiDB: `VERSION()` carries `TiDB` (`8.0.11-TiDB-v7.5.1`).
    TiDb,
    Sqlite,
}

impl Engine {
    /// The engine whose version string `version` is, on a connection of `dialect`.
    pub(crate) fn detect(dialect: Dialect, version: &str) -> Engine {
        match dialect {
            Dialect::Postgres if version.trim_start().starts_with("CockroachDB") => {
                Engine::CockroachDb
            }
            Dialect::Postgres if version.contains("-YB-") => Engine::YugabyteDb,
            Dialect::Postgres => Engine::PostgreSql,
            Dialect::MySql if version.contains("TiDB") => Engine::TiDb,
            Dialect::MySql if version.to_ascii_lowercase().contains("mariadb") => Engine::MariaDb,
            Dialect::MySql => Engine::MySql,
            Dialect::Sqlite => Engine::Sqlite,
        }
    }

    /// Its name in messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Engine::PostgreSql => "PostgreSQL",
            Engine::CockroachDb => "CockroachDB",
            Engine::YugabyteDb => "YugabyteDB",
            Engine::MySql => "MySQL",
            Engine::MariaDb => "MariaDB",
            Engine::TiDb => "TiDB",
            Engine::Sqlite => "SQLite",
        }
    }

    /// The version's first `n` numbers (major, minor, ..), read where the engine writes them:
    /// after `PostgreSQL ` (`version()`), after `v` on CockroachDB, at the start on MySQL and
    /// MariaDB (TiDB's own version follows `-TiDB-v`).
    pub(crate) fn numbers(self, version: &str) -> Vec<u32> {
        let from = match self {
            Engine::CockroachDb => version.find(" v").map(|at| at + 2),
            Engine::TiDb => version.find("-TiDB-v").map(|at| at + 7),
            Engine::PostgreSql | Engine::YugabyteDb => version
                .find("PostgreSQL ")
                .map(|at| at + "PostgreSQL ".len())
                .or(Some(0)),
            Engine::MySql | Engine::MariaDb | Engine::Sqlite => Some(0),
        };
        let Some(rest) = from.and_then(|from| version.get(from..)) else {
            return Vec::new();
        };
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        rest[..end]
            .split('.')
            .map_while(|part| part.parse().ok())
            .collect()
    }

    /// The major version (0 when the string has none).
    pub(crate) fn major(self, version: &str) -> u32 {
        self.numbers(version).first().copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_are_told_apart_by_their_version_strings() {
        let cases = [
            (
                Dialect::Postgres,
                "PostgreSQL 15.20 (Debian 15.20-0+deb12u1) on x86_64-pc-linux-gnu, compiled by gcc",
                Engine::PostgreSql,
                15,
            ),
            (
                Dialect::Postgres,
                "PostgreSQL 18.6 on x86_64-pc-linux-gnu, compiled by gcc (GCC) 14.2.1, 64-bit",
                Engine::PostgreSql,
                18,
            ),
            (
                Dialect::Postgres,
                "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.10)",
                Engine::CockroachDb,
                23,
            ),
            (
                Dialect::Postgres,
                "CockroachDB CCL v22.2.8 (x86_64-pc-linux-gnu, built 2023/04/17)",
                Engine::CockroachDb,
                22,
            ),
            (
                Dialect::Postgres,
                "PostgreSQL 11.2-YB-2.20.1.0-b0 on x86_64-pc-linux-gnu, compiled by clang version \
                 16.0.6, 64-bit",
                Engine::YugabyteDb,
                11,
            ),
            (
                Dialect::Postgres,
                "PostgreSQL 15.2-YB-2.25.1.0-b0 on x86_64-pc-linux-gnu",
                Engine::YugabyteDb,
                15,
            ),
            (Dialect::MySql, "8.0.11-TiDB-v7.5.1", Engine::TiDb, 7),
            (Dialect::MySql, "5.7.25-TiDB-v6.5.0", Engine::TiDb, 6),
            (
                Dialect::MySql,
                "10.11.19-MariaDB-0+deb12u1",
                Engine::MariaDb,
                10,
            ),
            (Dialect::MySql, "8.0.36", Engine::MySql, 8),
            (Dialect::MySql, "8.4.0-commercial", Engine::MySql, 8),
            (Dialect::Sqlite, "3.51.3", Engine::Sqlite, 3),
        ];
        for (dialect, version, engine, major) in cases {
            let found = Engine::detect(dialect, version);
            assert_eq!(found, engine, "{version}");
            assert_eq!(found.major(version), major, "{version}");
        }
        assert_eq!(
            Engine::CockroachDb.numbers("CockroachDB CCL v23.1.11 (x86_64)"),
            [23, 1, 11]
        );
        assert_eq!(Engine::TiDb.numbers("8.0.11-TiDB-v8.5.6"), [8, 5, 6]);
    }

    #[test]
    fn a_version_without_numbers_has_major_zero() {
        assert_eq!(Engine::PostgreSql.major("PostgreSQL devel"), 0);
        assert_eq!(Engine::CockroachDb.major("CockroachDB"), 0);
    }
}
