use super::*;
use Dialect::{MySql, Postgres, Sqlite};

fn text(dialect: Dialect, sql: &str) -> String {
    custom(dialect, sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .text()
        .to_owned()
}

fn refused(dialect: Dialect, sql: &str) -> String {
    match custom(dialect, sql) {
        Ok(stmt) => panic!("{dialect:?} accepted {sql:?} as {:?}", stmt.text()),
        Err(reason) => reason,
    }
}

#[test]
fn markers_become_placeholders_outside_quotes_and_casts() {
    let sql =
        "UPDATE jobs SET done_at = :now, note = 'at :id' WHERE id = :id AND x::text <> ':dead'";
    let stmt = custom(Postgres, sql).unwrap();
    assert_eq!(
        stmt.text(),
        "UPDATE jobs SET done_at = $1, note = 'at :id' WHERE id = $2 AND x::text <> ':dead'"
    );
    assert_eq!(&*stmt.slots, &[Slot::Now, Slot::Id]);
    assert_eq!(
        text(MySql, "DELETE FROM `a:b` WHERE id = :id"),
        "DELETE FROM `a:b` WHERE id = ?"
    );
    let error = refused(Sqlite, "DELETE FROM jobs WHERE id = :ident");
    assert!(error.contains(":ident"), "{error}");
}

#[test]
fn markers_in_comments_are_left_alone() {
    for dialect in [Postgres, MySql, Sqlite] {
        let stmt = custom(
            dialect,
            "DELETE FROM jobs /* not :token */ WHERE id = :id -- by :worker",
        )
        .unwrap();
        assert_eq!(&*stmt.slots, &[Slot::Id], "{dialect:?}");
    }
    let stmt = custom(MySql, "DELETE FROM jobs WHERE id = :id # by :worker").unwrap();
    assert_eq!(&*stmt.slots, &[Slot::Id]);
}

#[test]
fn a_second_statement_is_refused() {
    for dialect in [Postgres, MySql, Sqlite] {
        for sql in [
            "DELETE FROM jobs WHERE id = :id; DROP TABLE canary",
            "DELETE FROM jobs WHERE id = :id;DROP TABLE canary;",
            "DELETE FROM jobs WHERE id = :id; /* c */ DROP TABLE canary",
            "DELETE FROM jobs WHERE id = :id; -- c\nDROP TABLE canary",
            "DELETE FROM jobs WHERE id = :id;;",
            "DELETE FROM jobs WHERE note = 'a'';'; DROP TABLE canary",
        ] {
            let error = refused(dialect, sql);
            assert!(error.contains("more than one statement"), "{error}");
            assert!(
                error.contains("DROP TABLE canary") || sql.ends_with(";;"),
                "{error}"
            );
        }
    }
}

#[test]
fn one_trailing_semicolon_is_dropped() {
    for dialect in [Postgres, MySql, Sqlite] {
        for sql in [
            "DELETE FROM jobs WHERE id = :id;",
            "DELETE FROM jobs WHERE id = :id ;  \n",
            "DELETE FROM jobs WHERE id = :id; -- done",
            "DELETE FROM jobs WHERE id = :id; /* done */ ",
        ] {
            let text = text(dialect, sql);
            assert!(!text.contains(';'), "{dialect:?}: {text}");
            assert!(text.starts_with("DELETE FROM jobs WHERE id = "), "{text}");
        }
    }
}

#[test]
fn semicolons_in_strings_and_quoted_names_are_text() {
    for dialect in [Postgres, MySql, Sqlite] {
        text(dialect, "UPDATE jobs SET note = 'a;b' WHERE id = :id");
        text(
            dialect,
            "UPDATE jobs SET note = 'it''s; done' WHERE id = :id",
        );
    }
    text(
        Postgres,
        r#"UPDATE "jobs;x" SET "a""b;" = 1 WHERE id = :id"#,
    );
    text(Sqlite, r#"UPDATE "jobs;x" SET [a;b] = 1 WHERE id = :id"#);
    text(
        MySql,
        "UPDATE `jobs;x` SET `a``b;` = \"c;\"\"d\" WHERE id = :id",
    );
    text(Sqlite, "UPDATE `jobs;x` SET `a``b;` = 1 WHERE id = :id");
    // A backslash escapes a quote in MySQL's strings and PostgreSQL's E'..' strings only.
    text(
        MySql,
        r"UPDATE jobs SET note = 'it\'s; done' WHERE id = :id",
    );
    text(
        Postgres,
        r"UPDATE jobs SET note = E'it\'s; done' WHERE id = :id",
    );
    refused(
        Postgres,
        r"UPDATE jobs SET note = 'a\'; DROP TABLE canary; --'",
    );
    refused(
        Sqlite,
        r"UPDATE jobs SET note = 'a\'; DROP TABLE canary; --'",
    );
    text(
        MySql,
        r"UPDATE jobs SET note = 'a\'; DROP TABLE canary; --'",
    );
}

#[test]
fn postgres_dollar_quotes_and_nested_comments() {
    let stmt = custom(
        Postgres,
        "UPDATE jobs SET note = $$a; :id$$ || $q$ $$; $q$ WHERE id = :id",
    )
    .unwrap();
    assert_eq!(&*stmt.slots, &[Slot::Id]);
    text(Postgres, "UPDATE jobs SET a$b = 1 WHERE id = :id");
    text(
        Postgres,
        "DELETE FROM jobs /* a /* nested; */ still; */ WHERE id = :id",
    );
    refused(
        MySql,
        "DELETE FROM jobs /* a /* nested; */ still; */ WHERE id = :id",
    );
    refused(Postgres, "UPDATE jobs SET note = $q$a; WHERE id = :id");
}

#[test]
fn mysql_comments() {
    text(
        MySql,
        "DELETE FROM jobs WHERE id = :id # ; DROP TABLE canary",
    );
    refused(
        Postgres,
        "DELETE FROM jobs WHERE id = :id # ; DROP TABLE canary",
    );
    // `--` without a blank after it is two minus signs on MySQL.
    refused(
        MySql,
        "DELETE FROM jobs WHERE id = :id --1; DROP TABLE canary",
    );
    // The text of an executable comment is SQL.
    refused(
        MySql,
        "DELETE FROM jobs WHERE id = :id /*! ; DROP TABLE canary */",
    );
    refused(
        MySql,
        "DELETE FROM jobs WHERE id = :id /*M! ; DROP TABLE canary */",
    );
    let stmt = custom(
        MySql,
        "DELETE FROM jobs WHERE id = :id /*!50000 AND 1 = 1 */",
    )
    .unwrap();
    assert_eq!(&*stmt.slots, &[Slot::Id]);
}

#[test]
fn unterminated_and_empty_texts_are_refused() {
    for dialect in [Postgres, MySql, Sqlite] {
        assert!(refused(dialect, "DELETE FROM jobs WHERE note = 'a").contains("unterminated"));
        assert!(refused(dialect, "DELETE FROM jobs /* a").contains("unterminated"));
        assert!(refused(dialect, " -- nothing\n ;").contains("empty"));
        assert!(refused(dialect, "").contains("empty"));
    }
    assert!(refused(Sqlite, "DELETE FROM [jobs WHERE id = :id").contains("unterminated"));
}
