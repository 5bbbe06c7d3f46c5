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

    /// What a connection records for row `id`'s key.
    pub(crate) fn key_of(&self, id: i64) -> Key {
        match self {
            Keys::InProcess { table } => Key::InProcess(*table, id),
            _ => Key::Session(id),
        }
    }
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
    }
}
