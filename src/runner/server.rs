//! What [`Runner::start`](super::Runner::start) refuses for the server it found and the way to
//! it: a form the engine cannot hold a row with (its version string names it), and what needs
//! one server session behind a transaction pooler.

use crate::backend::Engine;
use crate::config::{FormKind, QueueConfig};
use crate::error::{Error, Result};
use crate::table::{Dialect, Pooler};

/// Refuses a queue whose form or wake-ups the engine cannot serve.
pub(super) fn check_engine(engine: Engine, config: &QueueConfig) -> Result<()> {
    let queue = config.label();
    let lease = matches!(config.form, FormKind::Lease { .. });
    match (engine, &config.form) {
        (Engine::TiDb, FormKind::RowLock | FormKind::Lease { .. }) => {
            return Err(Error::unsupported(
                queue,
                format!(
                    "TiDB accepts `FOR UPDATE SKIP LOCKED` but takes no lock with it, so two \
                     claims would take the same row ({} form); use the advisory lock form",
                    if lease { "the lease" } else { "the row lock" }
                ),
            ));
        }
        (Engine::CockroachDb, FormKind::Advisory) => {
            return Err(Error::unsupported(
                queue,
                "CockroachDB has no session advisory locks (its `pg_try_advisory_lock` takes \
                 none), so two runners would hold the same row; use the lease or row lock form",
            ));
        }
        (Engine::YugabyteDb, FormKind::Advisory) => {
            return Err(Error::unsupported(
                queue,
                "YugabyteDB's session advisory locks (none before 2.25, a preview since) are \
                 not supported by this crate; use the lease or row lock form",
            ));
        }
        _ => {}
    }
    if config.listen_notify && matches!(engine, Engine::CockroachDb | Engine::YugabyteDb) {
        return Err(Error::unsupported(
            queue,
            format!(
                "`.listen_notify()` needs PostgreSQL's LISTEN/NOTIFY, which {} lacks (polling \
                 and in-process wake-ups remain)",
                engine.name()
            ),
        ));
    }
    Ok(())
}

/// What stands between the runner's pool and the server, as its tables say it (each
/// [`Table::pooler`](crate::Table::pooler): the queues' and the schedules' job tables). One
/// pool has one way to the server: tables that say it differently are refused.
pub(super) fn one_pooler<'a>(
    configs: &'a [QueueConfig],
    schedules: impl IntoIterator<Item = (String, &'a crate::table::Table)>,
) -> Result<Pooler> {
    let mut said: Option<(String, Pooler)> = None;
    let tables = configs
        .iter()
        .map(|config| (config.label().to_owned(), &config.table))
        .chain(schedules);
    for (owner, table) in tables {
        match &said {
            None => said = Some((owner, table.pooler)),
            Some((first, pooler)) if *pooler != table.pooler => {
                return Err(Error::declaration(
                    &owner,
                    format!(
                        "its table `{}` says `{:?}` and {first}'s `{:?}`: a runner's queues and \
                         schedules share one pool, so their tables must say one \
                         `Table::pooler`",
                        table.name, table.pooler, pooler
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(said.map_or(Pooler::None, |(_, pooler)| pooler))
}

/// Refuses queues on one table that hold their jobs in work differently — claim forms, or
/// lease columns — where the table has a unique key or cancel requests: a cancellation and a
/// unique job's replace tell a job in work by their queue's form, and would take another
/// form's job in work for a queued one.
pub(super) fn one_form_per_table(configs: &[QueueConfig]) -> Result<()> {
    let held = |config: &QueueConfig| match &config.form {
        FormKind::Lease { column, .. } => format!("the lease column `{column}`"),
        FormKind::RowLock => "the row lock form".to_owned(),
        FormKind::Advisory => "the advisory lock form".to_owned(),
    };
    for (i, config) in configs.iter().enumerate() {
        let table = &config.table;
        if table.unique_key.is_none() && table.cancel_requests.is_none() {
            continue;
        }
        let other = configs[..i]
            .iter()
            .find(|o| o.table.name == table.name && held(o) != held(config));
        if let Some(other) = other {
            return Err(Error::declaration(
                config.label(),
                format!(
                    "it holds its jobs by {} and {} on the same table `{}` by {}: a \
                     cancellation or a unique job's replace tells a job in work by its queue's \
                     form, so every queue of a table with a unique key or cancel requests must \
                     use one form (and one lease column)",
                    held(config),
                    other.label(),
                    table.name,
                    held(other)
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses, behind a transaction pooler, what needs one server session across transactions.
pub(super) fn check_pooler(dialect: Dialect, config: &QueueConfig) -> Result<()> {
    let queue = config.label();
    if config.table.pooler != Pooler::Transaction {
        return Ok(());
    }
    if dialect != Dialect::Postgres {
        return Err(Error::unsupported(
            queue,
            format!(
                "`Pooler::Transaction` is for PostgreSQL behind a transaction pooler (PgBouncer's \
                 `pool_mode = transaction`); {} is not supported behind one",
                dialect.product()
            ),
        ));
    }
    if config.form == FormKind::Advisory {
        return Err(Error::unsupported(
            queue,
            "the advisory lock form holds each row by a session lock, and a transaction pooler \
             (`Pooler::Transaction`) lends a session for one transaction only: use the lease or \
             row lock form, or connect to the server (or a session pooler) directly",
        ));
    }
    if config.listen_notify {
        return Err(Error::unsupported(
            queue,
            "`.listen_notify()` keeps a session listening, and a transaction pooler \
             (`Pooler::Transaction`) lends a session for one transaction only: drop it (polling \
             and in-process wake-ups remain), or listen on a direct connection",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Table;
    use std::time::Duration;

    fn config(form: FormKind) -> QueueConfig {
        QueueConfig::new(Table::new("jobs"), form)
    }

    fn lease() -> FormKind {
        FormKind::Lease {
            column: "locked_until".into(),
            duration: Duration::from_secs(30),
        }
    }

    #[test]
    fn queues_of_a_table_with_keys_or_requests_hold_their_jobs_one_way() {
        let on = |table: Table, form| QueueConfig::new(table, form);
        let keyed = Table::new("jobs").unique_key("dedupe");
        let asked = Table::new("jobs").cancel_requests("jobs_cancels");
        let other_lease = FormKind::Lease {
            column: "held_until".into(),
            duration: Duration::from_secs(30),
        };
        for table in [keyed.clone(), asked] {
            for form in [FormKind::RowLock, FormKind::Advisory, other_lease.clone()] {
                let mixed = [on(table.clone(), lease()), on(table.clone(), form)];
                let err = one_form_per_table(&mixed).unwrap_err().to_string();
                assert!(err.contains("one form"), "{err}");
            }
            one_form_per_table(&[on(table.clone(), lease()), on(table.clone(), lease())]).unwrap();
        }
        // Without a unique key or requests, and on other tables, forms may differ.
        one_form_per_table(&[config(lease()), config(FormKind::RowLock)]).unwrap();
        let elsewhere = on(Table::new("other").unique_key("dedupe"), FormKind::RowLock);
        one_form_per_table(&[on(keyed, lease()), elsewhere]).unwrap();
    }

    #[test]
    fn engines_refuse_the_forms_they_cannot_hold_a_row_with() {
        let refused = |engine, form| check_engine(engine, &config(form)).is_err();
        assert!(refused(Engine::TiDb, FormKind::RowLock));
        assert!(refused(Engine::TiDb, lease()));
        assert!(!refused(Engine::TiDb, FormKind::Advisory));
        assert!(refused(Engine::CockroachDb, FormKind::Advisory));
        assert!(!refused(Engine::CockroachDb, FormKind::RowLock));
        assert!(!refused(Engine::CockroachDb, lease()));
        assert!(refused(Engine::YugabyteDb, FormKind::Advisory));
        assert!(!refused(Engine::YugabyteDb, lease()));
        for engine in [Engine::PostgreSql, Engine::MySql, Engine::MariaDb] {
            for form in [FormKind::RowLock, lease(), FormKind::Advisory] {
                assert!(!refused(engine, form));
            }
        }
        let err = check_engine(Engine::TiDb, &config(FormKind::RowLock)).unwrap_err();
        assert!(err.to_string().contains("TiDB"), "{err}");
        let mut listening = config(lease());
        listening.listen_notify = true;
        assert!(check_engine(Engine::CockroachDb, &listening).is_err());
        assert!(check_engine(Engine::PostgreSql, &listening).is_ok());
    }

    #[test]
    fn a_transaction_pooler_refuses_what_needs_one_session() {
        let pooled = |form| {
            let mut config = config(form);
            config.table = config.table.pooler(Pooler::Transaction);
            config
        };
        let err = check_pooler(Dialect::Postgres, &pooled(FormKind::Advisory)).unwrap_err();
        assert!(err.to_string().contains("transaction pooler"), "{err}");
        check_pooler(Dialect::Postgres, &pooled(lease())).unwrap();
        check_pooler(Dialect::Postgres, &pooled(FormKind::RowLock)).unwrap();
        let mut listening = pooled(lease());
        listening.listen_notify = true;
        assert!(check_pooler(Dialect::Postgres, &listening).is_err());
        assert!(check_pooler(Dialect::Sqlite, &pooled(lease())).is_err());
        check_pooler(Dialect::Postgres, &config(FormKind::Advisory)).unwrap();
    }
}
