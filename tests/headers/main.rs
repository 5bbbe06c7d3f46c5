//! Headers' tests (`Table::headers`, `Job::header`, `Delivery::header`), a binary of their own:
//! the `it` binary takes about 12 GB and many minutes to compile, and these tests need none of
//! its areas. They follow `tests/it`'s pattern and reuse its support (`tests/it/support`, with
//! `tests/common`): each test is a generic function written once, `async fn name<DB: TestDb>()`
//! (and `<DB, F: Form<DB>>` for the claim forms), and `per_database!` below writes one module per
//! database whose `#[tokio::test]`s run them there — `cargo test --test headers sqlite::` runs
//! SQLite's.
//!
//! What is tested here: headers round-trip byte for byte (unicode, quotes, backslashes, control
//! characters, empty strings, many) on every claim form and every column type the role takes,
//! through single and bulk enqueues and unique jobs, to plain, batch, transactional and row mode
//! deliveries; a job without headers is delivered with none; what cannot be stored is refused at
//! enqueue; what another writer stored that is not an object of strings never reaches a handler;
//! a column that cannot hold headers is refused at start; `examples/traceparent.rs` continues the
//! enqueuing request's trace in the handler. The JSON text itself (escapes, what a
//! database rewrites) is unit-tested in `src/table/headers.rs`.

#[allow(
    dead_code,
    unused_imports,
    reason = "`tests/it`'s support, of which these tests use a part"
)]
#[path = "../it/support/mod.rs"]
mod support;

mod example;
mod kinds;
mod refusals;
mod round_trip;

/// `#[tokio::test]`s running `$area`'s generic tests with the type arguments given.
macro_rules! instantiate {
    ($area:ident<$db:ty>: $($test:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            crate::support::on_server_of(module_path!(), crate::$area::$test::<$db>()).await;
        }
    )+};
    ($area:ident<$db:ty, $form:ty>: $($test:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            crate::support::on_server_of(module_path!(), crate::$area::$test::<$db, $form>())
                .await;
        }
    )+};
}

/// In a database's module, one module per claim form with the tests run on each form.
macro_rules! forms {
    ($ty:ty: $($module:ident => $form:ident),+) => {$(
        mod $module {
            instantiate!(round_trip<$ty, crate::support::$form>:
                headers_round_trip_on_every_column_type);
            instantiate!(kinds<$ty, crate::support::$form>:
                batch_deliveries_carry_their_headers,
                transactional_deliveries_carry_their_headers,
                row_mode_deliveries_carry_their_headers,
            );
        }
    )+};
}

/// One module per database (`postgres18` runs PostgreSQL's on `SQLX_QUEUE_PG18_URL`), with one
/// module per claim form for the round trips; `$row_lock` where the database has row locks.
macro_rules! per_database {
    ($($db:ident => $ty:ty $(, $row_lock:ident)?);* $(;)?) => {$(
        mod $db {
            forms!($ty: lease => LeaseForm, advisory => AdvisoryForm);
            $(forms!($ty: $row_lock => RowLockForm);)?
            mod kinds {
                instantiate!(kinds<$ty>:
                    unique_jobs_carry_their_headers_and_a_replace_replaces_them,
                );
            }
            mod refusals {
                instantiate!(refusals<$ty>:
                    headers_into_a_table_without_the_column_are_refused,
                    a_header_with_a_nul_character_is_refused_at_enqueue,
                    stored_headers_that_are_not_an_object_of_strings_never_reach_a_handler,
                    a_column_that_cannot_hold_headers_is_refused_at_start,
                );
            }
        }
    )*};
}

// SQLite has no row locks: `RowLockForm` is not a `Form<sqlx::Sqlite>`.
per_database! {
    sqlite => sqlx::Sqlite;
    postgres => sqlx::Postgres, row_lock;
    postgres18 => sqlx::Postgres, row_lock;
    mysql => sqlx::MySql, row_lock;
}

use std::collections::BTreeMap;

use support::{Ctx, Spec, TestDb};

/// Headers as a delivery hands them, to compare.
pub(crate) type Map = BTreeMap<String, String>;

/// The column types the headers role takes on `DB`.
pub(crate) fn column_types<DB: TestDb>() -> &'static [&'static str] {
    match DB::LABEL {
        "postgres" => &["JSONB", "JSON", "TEXT"],
        "mysql" => &["JSON", "TEXT CHARACTER SET utf8mb4"],
        _ => &["TEXT"],
    }
}

/// A fresh table of `spec` with a `headers` column of type `ty`; its name.
pub(crate) async fn table_with_headers<DB: TestDb>(
    ctx: &mut Ctx<DB>,
    spec: Spec,
    ty: &str,
) -> String {
    let t = ctx.table(spec).await;
    ctx.exec(&format!("ALTER TABLE {t} ADD COLUMN headers {ty}"))
        .await;
    t
}

/// Headers that a careless encoder would get wrong: a W3C trace context, unicode (beyond the
/// Basic Multilingual Plane too), quotes, backslashes, every kind of control character but NUL,
/// empty keys and values, and many of them.
pub(crate) fn awkward() -> Map {
    let mut map: Map = [
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("tracestate", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"),
        ("unicode ключ", "値 🦀 e\u{301} \u{2028}\u{fffd}"),
        ("quote\"d", "say \"hi\""),
        ("back\\slash", "C:\\dir\\ \\u0041 \\n"),
        ("controls", "\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1b}\u{1f}\u{7f}"),
        ("", "empty key"),
        ("empty value", ""),
        ("  spaced  ", " {\"not\": \"json\"} "),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for i in 0..60 {
        map.insert(format!("h{i:02}"), "x".repeat(i * 7));
    }
    map
}

/// A delivery's headers as a map (through both accessors, which must agree).
pub(crate) fn read<DB: TestDb, M: sqlx_queue::state::Mode>(d: &sqlx_queue::Delivery<DB, M>) -> Map {
    let map: Map = d
        .headers()
        .iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    for (k, v) in &map {
        assert_eq!(d.header(k), Some(v.as_str()), "header({k:?})");
    }
    assert_eq!(map.len(), d.headers().len());
    map
}

/// `job` with every header of `map`.
pub(crate) fn with<'a>(mut job: sqlx_queue::Job<'a>, map: &'a Map) -> sqlx_queue::Job<'a> {
    for (k, v) in map {
        job = job.header(k.as_str(), v.as_str());
    }
    job
}
