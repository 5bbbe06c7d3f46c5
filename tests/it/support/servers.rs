//! Which server of a database a test runs on. The PostgreSQL tests run on two servers, each in a
//! module of its own (`postgres::` on `SQLX_QUEUE_PG_URL`, PostgreSQL 15 in CI; `postgres18::` on
//! `SQLX_QUEUE_PG18_URL`): the same `TestDb` (`sqlx::Postgres`), with the URL's variable chosen
//! by the module the test was instantiated in and carried to `Ctx::new` in a task-local.

use std::future::Future;

use super::TestDb;

/// The database modules of `main.rs` that run on another server than their `TestDb`'s own
/// variable names, and the variable each reads instead.
const SERVERS: &[(&str, &str)] = &[("postgres18", "SQLX_QUEUE_PG18_URL")];

tokio::task_local! {
    static URL_VAR: &'static str;
}

/// Runs `test`, instantiated in module `module` (its `module_path!()`), on that module's server.
pub(crate) async fn on_server_of<F: Future>(module: &str, test: F) -> F::Output {
    let database = module.split("::").nth(1).unwrap_or_default();
    match SERVERS.iter().find(|(name, _)| *name == database) {
        Some((_, var)) => URL_VAR.scope(var, test).await,
        None => test.await,
    }
}

/// The variable holding the URL of the server this test runs on (`None`: SQLite).
pub(crate) fn url_var<DB: TestDb>() -> Option<&'static str> {
    DB::URL_VAR.map(|own| URL_VAR.try_with(|var| *var).unwrap_or(own))
}
