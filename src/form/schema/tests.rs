use super::*;

#[test]
fn servers_without_skip_locked_are_refused() {
    let check = |dialect, version: &str| check_version(Engine::detect(dialect, version), version);
    check(Dialect::MySql, "10.11.19-MariaDB-0+deb12u1").unwrap();
    check(Dialect::MySql, "10.6.0-MariaDB").unwrap();
    check(Dialect::MySql, "8.0.36").unwrap();
    check(Dialect::MySql, "8.4.0-commercial").unwrap();
    let err = check(Dialect::MySql, "10.5.23-MariaDB").unwrap_err();
    assert!(matches!(&err, Error::ServerTooOld { needed, .. } if needed == "10.6.0"));
    assert!(err.to_string().contains("10.5.23-MariaDB"), "{err}");
    let err = check(Dialect::MySql, "5.7.44-log").unwrap_err();
    assert!(matches!(err, Error::ServerTooOld { needed, .. } if needed == "8.0.1"));
    check(
        Dialect::Postgres,
        "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu)",
    )
    .unwrap();
    check(
        Dialect::Postgres,
        "CockroachDB CCL v24.2.0 (x86_64-pc-linux-gnu)",
    )
    .unwrap();
    let err = check(Dialect::Postgres, "CockroachDB CCL v22.2.8 (x86_64)").unwrap_err();
    assert!(
        matches!(&err, Error::ServerTooOld { server, needed, .. }
            if server == "CockroachDB" && needed == "23.1"),
        "{err}"
    );
    // TiDB reports MySQL 8.0.11 (or 5.7.25): its own version decides nothing here.
    check(Dialect::MySql, "5.7.25-TiDB-v6.5.0").unwrap();
    check(
        Dialect::Postgres,
        "PostgreSQL 9.6.24 on x86_64-pc-linux-gnu",
    )
    .unwrap();
}

#[test]
fn column_types_per_dialect() {
    assert!(Kind::Time.accepts(Dialect::Postgres, "timestamp with time zone"));
    assert!(!Kind::Time.accepts(Dialect::Postgres, "timestamp(3) with time zone"));
    assert!(!Kind::Time.accepts(Dialect::Postgres, "timestamp without time zone"));
    assert!(Kind::Time.accepts(Dialect::MySql, "datetime(6)"));
    assert!(!Kind::Time.accepts(Dialect::MySql, "datetime"));
    assert!(Kind::Integer.accepts(Dialect::MySql, "bigint(20)"));
    assert!(Kind::Integer.accepts(Dialect::MySql, "int(11) unsigned"));
    assert!(!Kind::Integer.accepts(Dialect::MySql, "point"));
    assert!(Kind::Bytes.accepts(Dialect::MySql, "longblob"));
    assert!(!Kind::Bytes.accepts(Dialect::Postgres, "text"));
    assert!(Kind::Bytes.accepts(Dialect::Sqlite, "BLOB"));
    assert!(!Kind::Bytes.accepts(Dialect::Sqlite, "INTEGER"));
}
