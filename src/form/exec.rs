//! Running a rendered statement on a connection, the ways the forms run them: apart from the
//! forms, which say what to run, and from the backend, which knows no statement.

use sqlx::Connection as _;

use super::Conns;
use crate::backend::{self, Backend, ClaimColumns, ClaimedRow, Q};
use crate::dialect::{Args, Stmt};

/// `stmt` with `args` bound: a query sqlx keeps prepared on the connection, or one it does not
/// (an unnamed statement) where the statement runs unprepared — the backend then runs it in a
/// transaction of its own outside one (a transaction pooler's session is the connection's for
/// one transaction only).
fn query<DB: Backend>(stmt: &Stmt, args: &Args<'_>) -> Q<DB> {
    debug_assert!(!stmt.multi(), "several statements run by `fetch_sets`");
    backend::query::<DB>(stmt.sql(), stmt.values(args)).persistent(!stmt.unprepared)
}

/// Runs `stmt` with `args` on `conn`: the rows it changed.
pub(crate) async fn execute<DB: Backend>(
    conn: &mut DB::Connection,
    stmt: &Stmt,
    args: &Args<'_>,
) -> Result<u64, sqlx::Error> {
    DB::execute(conn, query::<DB>(stmt, args)).await
}

/// Runs `stmt` with `args` on `conn`: its rows, as the database returned them.
pub(crate) async fn fetch_all<DB: Backend>(
    conn: &mut DB::Connection,
    stmt: &Stmt,
    args: &Args<'_>,
) -> Result<Vec<DB::Row>, sqlx::Error> {
    DB::fetch_all(conn, query::<DB>(stmt, args)).await
}

/// Runs the [`multi`](Stmt::multi) statement `stmt` with `args` written into its text, in one
/// round trip: each statement's rows, in order.
pub(crate) async fn fetch_sets<DB: Backend>(
    conn: &mut DB::Connection,
    stmt: &Stmt,
    args: &Args<'_>,
) -> Result<Vec<Vec<DB::Row>>, sqlx::Error> {
    debug_assert!(stmt.multi());
    DB::fetch_sets(conn, stmt.inlined(DB::DIALECT, args)).await
}

/// Runs `stmt` with `args` on `conn`, reading its first column as integers.
pub(crate) async fn fetch_i64s<DB: Backend>(
    conn: &mut DB::Connection,
    stmt: &Stmt,
    args: &Args<'_>,
) -> Result<Vec<i64>, sqlx::Error> {
    backend::fetch_i64s::<DB>(conn, query::<DB>(stmt, args)).await
}

/// Runs `stmt` with `args` on `conn`, reading its first row's first column as an integer.
pub(crate) async fn fetch_i64<DB: Backend>(
    conn: &mut DB::Connection,
    stmt: &Stmt,
    args: &Args<'_>,
) -> Result<Option<i64>, sqlx::Error> {
    backend::fetch_i64::<DB>(conn, query::<DB>(stmt, args)).await
}

/// Runs the claim `stmt` with `args` on `conn`, reading its rows.
pub(crate) async fn fetch_claimed<DB: Backend>(
    conn: &mut DB::Connection,
    stmt: &Stmt,
    args: &Args<'_>,
    columns: ClaimColumns,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    backend::fetch_claimed::<DB>(conn, query::<DB>(stmt, args), columns).await
}

/// Reads a row whole by `stmt` (row mode), without keeping the statement prepared.
pub(crate) async fn fetch_row<DB: Backend>(
    conn: &mut DB::Connection,
    stmt: &Stmt,
    id: i64,
) -> Result<Option<DB::Row>, sqlx::Error> {
    let args = Args {
        id,
        ..Args::default()
    };
    DB::fetch_transient(conn, query::<DB>(stmt, &args)).await
}

/// Runs `work` on a connection of `conns`: the connection is kept for the next statement, or
/// given back with the others after a failure.
pub(crate) async fn on_conn<DB: Backend, T>(
    conns: &Conns<DB>,
    work: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, sqlx::Error>,
) -> Result<T, sqlx::Error> {
    let mut conn = conns.get().await?;
    let done = conns.checked(work(&mut conn).await)?;
    conns.put(conn);
    Ok(done)
}

/// Begins a transaction on `conn` with `begin` (a plain `BEGIN` when `None`), as sqlx's
/// `Connection::begin_with` does, for the MySQL/MariaDB statements that need one.
pub(crate) async fn in_transaction<DB: Backend, T>(
    conn: &mut DB::Connection,
    begin: &'static str,
    work: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, sqlx::Error>,
) -> Result<T, sqlx::Error> {
    let mut tx = conn.begin_with(begin).await?;
    let done = work(&mut tx).await?;
    tx.commit().await?;
    Ok(done)
}
