use super::ident::validate_ident;
use super::*;
use crate::error::Error;

#[test]
fn plain_names_pass() {
    for name in [
        "jobs",
        "signup_jobs",
        "Jobs2",
        "jöbs",
        "my jobs",
        "a$b",
        "a-b",
    ] {
        validate_ident(name).unwrap();
    }
}

#[test]
fn hostile_names_are_refused() {
    for name in [
        "",
        "jobs\"; DROP TABLE canary; --",
        "jobs`; DROP TABLE canary; --",
        "jobs; DROP TABLE canary",
        "jobs -- comment",
        "jobs/*x*/",
        "a'b",
        "a\\b",
        "a\0b",
        "a\nb",
        " jobs",
        "jobs ",
        &"x".repeat(256),
    ] {
        let err = validate_ident(name).unwrap_err();
        assert!(matches!(err, Error::Identifier { .. }), "{name:?} passed");
    }
}

#[test]
fn quoting_per_dialect() {
    assert_eq!(Dialect::Postgres.quote("jobs").unwrap(), "\"jobs\"");
    assert_eq!(Dialect::MySql.quote("jobs").unwrap(), "`jobs`");
    assert_eq!(Dialect::Sqlite.quote("jobs").unwrap(), "`jobs`");
    assert_eq!(
        Dialect::Postgres.quote_table("app.jobs").unwrap(),
        "\"app\".\"jobs\""
    );
    assert_eq!(
        Dialect::MySql.quote_table("app.jobs").unwrap(),
        "`app`.`jobs`"
    );
}

#[test]
fn postgres_refuses_names_it_would_truncate() {
    let long = "j".repeat(64);
    assert!(matches!(
        Dialect::Postgres.quote(&long),
        Err(Error::Identifier { .. })
    ));
    Dialect::Postgres.quote(&"j".repeat(63)).unwrap();
    assert!(Dialect::MySql.quote(&"j".repeat(65)).is_err());
    Dialect::Sqlite.quote(&long).unwrap();
}

#[test]
fn mysql_refuses_characters_beyond_the_basic_multilingual_plane() {
    for name in ["jobs_\u{20000}", "jobs_\u{1D4B3}", "jobs_\u{1F980}"] {
        let Err(Error::Identifier { reason, .. }) = Dialect::MySql.quote(name) else {
            panic!("{name} quoted");
        };
        assert!(reason.contains("Basic Multilingual Plane"), "{reason}");
    }
    Dialect::MySql.quote("jobs_\u{4E2D}\u{E9}").unwrap();
    Dialect::Postgres.quote("jobs_\u{20000}").unwrap();
    Dialect::Sqlite.quote("jobs_\u{20000}").unwrap();
}

#[test]
fn qualified_names_split() {
    assert_eq!(table_parts("jobs").unwrap(), (None, "jobs"));
    assert_eq!(table_parts("app.jobs").unwrap(), (Some("app"), "jobs"));
    assert_eq!(
        table_parts("\"app\".\"jobs\"").unwrap(),
        (Some("app"), "jobs")
    );
    assert_eq!(table_parts("`jobs`").unwrap(), (None, "jobs"));
    assert!(table_parts("\"jo\"bs\"").is_err());
    assert!(table_parts("a.b.c").is_err());
    assert!(table_parts(".jobs").is_err());
    assert!(table_parts("app.").is_err());
}
