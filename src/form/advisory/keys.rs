//! The advisory form's keys, made of the table's identity as the catalog resolves it, never of
//! its spelling: on PostgreSQL a `bigint`, the table's class (FNV-1a, 32 bits, of its resolved
//! name: `table` in `public`, else `schema.table`) in its high half and the id's low 32 bits in
//! its low half; on MySQL/MariaDB the lock name `<database>.<table>:<id>` (`sqlxq:` and its MD5
//! when longer than 64 characters); on SQLite a key held in this process (one process per
//! database file), of the file and the table's name. A collision between two rows' keys only
//! makes one wait for the other; it never lets a row be delivered twice.

use crate::backend::Key;
use crate::dialect::Args;
use crate::table::Dialect;

/// How a table's keys are made.
#[derive(Debug, Clone)]
pub(crate) enum Keys {
    Postgres { class: i64 },
    MySql { prefix: String },
    InProcess { table: u64 },
}

impl Keys {
    /// The keys of the table whose identity's key is `identity` (see `catalog::Identity`).
    pub(crate) fn of(dialect: Dialect, identity: &str) -> Self {
        match dialect {
            Dialect::Postgres => Keys::Postgres {
                class: i64::from(fnv1a_32(identity)),
            },
            Dialect::MySql => Keys::MySql {
                prefix: format!("{identity}:"),
            },
            Dialect::Sqlite => Keys::InProcess {
                table: fnv1a_64(identity),
            },
        }
    }

    /// The PostgreSQL key of row `id`.
    fn key(&self, id: i64) -> i64 {
        match self {
            Keys::Postgres { class } => (class << 32) | (id & 0xffff_ffff),
            _ => 0,
        }
    }

    /// The values of row `id`'s key statements.
    pub(crate) fn args(&self, id: i64) -> Args<'_> {
        match self {
            Keys::Postgres { class } => Args {
                id,
                key: self.key(id),
                key_class: *class,
                ..Args::default()
            },
            Keys::MySql { prefix } => Args {
                id,
                key_prefix: Some(prefix),
                ..Args::default()
            },
            Keys::InProcess { .. } => Args {
                id,
                ..Args::default()
            },
        }
    }

    /// The lock names of rows `ids` as the server's `GET_LOCK` computes them (MySQL/MariaDB):
    /// `None` unless every id's name fits the 64 characters a lock name takes without the hash
    /// the server then takes of it (see `dialect::mysql::lock_name`), which the client does not
    /// compute.
    pub(crate) fn lock_names(&self, ids: &[i64]) -> Option<Vec<String>> {
        match self {
            Keys::MySql { prefix } if names_fit(prefix) => {
                Some(ids.iter().map(|id| format!("{prefix}{id}")).collect())
            }
            _ => None,
        }
    }

    /// Whether [`lock_names`](Self::lock_names) names every row.
    pub(crate) fn names_fit(&self) -> bool {
        matches!(self, Keys::MySql { prefix } if names_fit(prefix))
    }

    /// What a connection records for row `id`'s key.
    pub(crate) fn key_of(&self, id: i64) -> Key {
        match self {
            Keys::InProcess { table } => Key::InProcess(*table, id),
            _ => Key::Session(id),
        }
    }
}

/// Whether `prefix` and any id, 20 characters at most (`i64::MIN`), make a name of 64
/// characters at most (`CHAR_LENGTH`, characters, not bytes).
fn names_fit(prefix: &str) -> bool {
    prefix.chars().count() + 20 <= 64
}

pub(crate) use crate::dialect::fnv1a_32;
use crate::dialect::fnv1a_64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_separate_tables() {
        // FNV-1a test vectors.
        assert_eq!(fnv1a_32(""), 0x811c_9dc5);
        assert_eq!(fnv1a_32("a"), 0xe40c_292c);
        let jobs = Keys::of(Dialect::Postgres, "jobs");
        let mail = Keys::of(Dialect::Postgres, "mail_jobs");
        assert_ne!(jobs.key(7), mail.key(7));
        assert_ne!(jobs.key(7), jobs.key(8));
        assert_eq!(jobs.key(7) & 0xffff_ffff, 7);
        assert_eq!(
            jobs.key(7) >> 32,
            Keys::of(Dialect::Postgres, "jobs").key(1) >> 32
        );
    }

    #[test]
    fn mysql_lock_names_carry_the_database() {
        let Keys::MySql { prefix } = Keys::of(Dialect::MySql, "shop.jobs") else {
            panic!()
        };
        assert_eq!(prefix, "shop.jobs:");
        let keys = Keys::of(Dialect::MySql, "shop.jobs");
        assert_eq!(
            keys.lock_names(&[7, -1]),
            Some(vec!["shop.jobs:7".to_owned(), "shop.jobs:-1".to_owned()])
        );
        // 44 characters, and 20 of `i64::MIN`: 64, named by the client; one more is hashed.
        let long = format!("shop.{}", "j".repeat(38));
        assert!(Keys::of(Dialect::MySql, &long).names_fit());
        let longer = format!("shop.{}", "é".repeat(39));
        assert!(!Keys::of(Dialect::MySql, &longer).names_fit());
        assert_eq!(Keys::of(Dialect::MySql, &longer).lock_names(&[1]), None);
        assert!(!Keys::of(Dialect::Postgres, "jobs").names_fit());
    }
}
