//! A claim's rows as its statement returns them: the row's columns, decoded one by one, so that
//! a value that does not decode marks its row alone.

use chrono::{DateTime, Utc};

use super::{Backend, Q};
use crate::table::Headers;

/// One claimed row, as a claim statement returns it:
/// `(id, payload[, attempt][, created_at][, headers][, key][, session])`.
#[derive(Debug)]
pub(crate) struct ClaimedRow {
    pub(crate) id: i64,
    pub(crate) payload: Vec<u8>,
    /// The delivery's number, where the queue has an attempt column.
    pub(crate) attempt: Option<i64>,
    /// When the row was created, where the claim reads it (its table's `created_at`, with the
    /// `metrics` feature): `None` too when the value does not decode, which only loses its
    /// pickup latency.
    pub(crate) created_at: Option<DateTime<Utc>>,
    /// The job's headers, where the table has a headers column (else empty).
    pub(crate) headers: Headers,
    /// The bytes of the row's key as text, where a by-key queue reads it (`None` too for NULL).
    pub(crate) key: Option<Vec<u8>>,
    /// The server session that holds the row (MySQL/MariaDB transactional row lock and advisory
    /// claims), so a delivery cancelled at shutdown can end it.
    pub(crate) session: Option<i64>,
    /// Why the row's payload, attempt or headers did not decode: it never reaches the handler.
    pub(crate) undecodable: Option<String>,
}

/// The columns a claim returns after `(id, payload)`, in this order.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ClaimColumns {
    pub(crate) attempt: bool,
    pub(crate) created_at: bool,
    pub(crate) headers: bool,
    pub(crate) key: bool,
}

/// Runs a claim and reads its rows. The id identifies a row; a value of the rest that does not
/// decode marks that row alone, which the runner settles by the decode policy.
pub(crate) async fn fetch_claimed<DB: Backend>(
    conn: &mut DB::Connection,
    query: Q<DB>,
    columns: ClaimColumns,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    let rows = DB::fetch_all(conn, query).await?;
    claimed_rows::<DB>(&rows, columns)
}

/// The claimed rows of a claim statement's result, every column the row's.
pub(crate) fn claimed_rows<DB: Backend>(
    rows: &[DB::Row],
    columns: ClaimColumns,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    use sqlx::Row as _;
    // Sized once: a list grown row by row reallocates twice for a batch of 16.
    let mut claimed = Vec::with_capacity(rows.len());
    for row in rows {
        claimed.push(claimed_row::<DB>(row, columns, row.len())?);
    }
    Ok(claimed)
}

/// One claimed row of a claim statement's result, whose first `len` columns are the row's (a
/// column past `columns`' is the server session holding it).
pub(crate) fn claimed_row<DB: Backend>(
    row: &DB::Row,
    columns: ClaimColumns,
    len: usize,
) -> Result<ClaimedRow, sqlx::Error> {
    let created = 2 + usize::from(columns.attempt);
    let headers = created + usize::from(columns.created_at);
    let key = headers + usize::from(columns.headers);
    let session = key + usize::from(columns.key);
    let id = DB::get_i64(row, 0)?;
    let rest = || -> Result<_, sqlx::Error> {
        let attempt = match columns.attempt {
            true => Some(DB::get_i64(row, 2)?),
            false => None,
        };
        let headers = match columns.headers {
            true => DB::get_bytes_or_null(row, headers)?.unwrap_or_default(),
            false => Vec::new(),
        };
        Ok((DB::get_bytes(row, 1)?, attempt, headers))
    };
    let (payload, attempt, headers, undecodable) = match rest() {
        Ok((payload, attempt, headers)) => match Headers::decode(&headers) {
            Ok(headers) => (payload, attempt, headers, None),
            Err(why) => (payload, attempt, Headers::default(), Some(why)),
        },
        Err(error) => (
            Vec::new(),
            None,
            Headers::default(),
            Some(error.to_string()),
        ),
    };
    let created_at = columns
        .created_at
        .then(|| DB::get_created(row, created))
        .flatten();
    // A key that does not decode is a key of its own: the row still runs.
    let key = match columns.key {
        true => DB::get_bytes_or_null(row, key).ok().flatten(),
        false => None,
    };
    let session = match len > session {
        true => Some(DB::get_i64(row, session)?),
        false => None,
    };
    Ok(ClaimedRow {
        id,
        payload,
        attempt,
        created_at,
        headers,
        key,
        session,
        undecodable,
    })
}
