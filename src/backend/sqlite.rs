//! SQLite's driver calls: this process's statements queued one at a time.

use std::future::Future;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sqlx::{SqlStr, Sqlite};
use sqlx_core::transaction::TransactionManager;

use super::driver::Driver;
use super::{Backend, InsertFailed, Q};
use crate::table::{Dialect, Value, ValueKind};

impl Backend for Sqlite {}

/// This process's statements on SQLite, one at a time. SQLite has one writer: when two of
/// a runner's connections write at once, the loser sleeps in SQLite's busy handler (1 ms,
/// then longer) for a lock held a fraction of that, and at eight workers the runner spent its
/// time asleep. Queued here instead, each statement starts the moment the previous one ends.
/// Statements inside a transaction are not queued: the transaction may hold the write lock
/// a queued statement waits for.
static STATEMENTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Driver for Sqlite {
    const DIALECT: Dialect = Dialect::Sqlite;

    driver_common!();
    prepare_untyped!();

    fn gate(
        conn: &Self::Connection,
    ) -> impl Future<Output = Option<tokio::sync::MutexGuard<'static, ()>>> + Send {
        let in_transaction =
            <Sqlite as sqlx::Database>::TransactionManager::get_transaction_depth(conn) > 0;
        async move {
            if in_transaction {
                None
            } else {
                Some(STATEMENTS.lock().await)
            }
        }
    }

    async fn insert_id_on(
        conn: &mut Self::Connection,
        query: Q<Self>,
    ) -> Result<i64, InsertFailed> {
        Ok(Self::execute(conn, query).await.map(|_| 0)?)
    }

    fn insert_id<'e, 'c: 'e, E>(
        executor: E,
        query: Q<Self>,
        returning: bool,
    ) -> BoxFuture<'e, Result<i64, InsertFailed>>
    where
        E: 'e + sqlx::Executor<'c, Database = Self>,
    {
        use sqlx::Row as _;
        Box::pin(async move {
            if returning {
                Ok(query.fetch_one(executor).await?.try_get(0)?)
            } else {
                Ok(query.execute(executor).await?.last_insert_rowid())
            }
        })
    }

    fn get_created(row: &Self::Row, index: usize) -> Option<DateTime<Utc>> {
        // The text the README's default writes (`%Y-%m-%d %H:%M:%f`) is read here: sqlx's own
        // decoding tries an RFC 3339 parse and two format strings first, a cost every claimed row
        // paid with the `metrics` feature. Any other form (an integer, a Julian day, an offset)
        // goes to sqlx's.
        sqlx::Row::try_get::<&str, _>(row, index)
            .ok()
            .and_then(text_time)
            .or_else(|| Self::get_time(row, index).ok())
    }

    async fn server(
        conn: &mut Self::Connection,
    ) -> Result<(String, Option<DateTime<Utc>>), sqlx::Error> {
        let version: String = sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(conn)
            .await?;
        Ok((version, None))
    }
}

/// `YYYY-MM-DD HH:MM:SS`, then optionally `.` and 1 to 9 digits of a second, then optionally `Z`
/// (a `T` may stand for the space), as UTC; `None` for anything else.
fn text_time(text: &str) -> Option<DateTime<Utc>> {
    let b = text.strip_suffix('Z').unwrap_or(text).as_bytes();
    let number = |from: usize, to: usize| -> Option<u32> {
        b.get(from..to)?.iter().try_fold(0u32, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    let separated = b.len() >= 19
        && b[4] == b'-'
        && b[7] == b'-'
        && (b[10] == b' ' || b[10] == b'T')
        && b[13] == b':'
        && b[16] == b':';
    if !separated {
        return None;
    }
    let nanos = match &b[19..] {
        [] => 0,
        [b'.', digits @ ..] if (1..=9).contains(&digits.len()) => {
            number(20, b.len())? * 10u32.pow(9 - digits.len() as u32)
        }
        _ => return None,
    };
    let date = chrono::NaiveDate::from_ymd_opt(
        i32::try_from(number(0, 4)?).ok()?,
        number(5, 7)?,
        number(8, 10)?,
    )?;
    let time = chrono::NaiveTime::from_hms_nano_opt(
        number(11, 13)?,
        number(14, 16)?,
        number(17, 19)?,
        nanos,
    )?;
    Some(date.and_time(time).and_utc())
}

#[cfg(test)]
mod tests {
    use chrono::NaiveDateTime;

    use super::text_time;

    #[test]
    fn reads_the_text_sqlite_writes_as_chrono_does() {
        for text in [
            "2026-12-02 11:30:00",
            "2026-12-02 11:30:00.1",
            "2026-12-02 11:30:00.123",
            "2026-12-02T11:30:00.123456",
            "2026-12-02 11:30:00.123456789Z",
            "1999-02-28 23:59:59.999",
        ] {
            let plain = text.trim_end_matches('Z');
            let format = if plain.contains('T') {
                "%FT%T%.f"
            } else {
                "%F %T%.f"
            };
            let expected = NaiveDateTime::parse_from_str(plain, format)
                .unwrap()
                .and_utc();
            assert_eq!(text_time(text), Some(expected), "{text}");
        }
    }

    #[test]
    fn leaves_every_other_form_to_sqlx() {
        for text in [
            "",
            "1733140000",
            "2026-12-02",
            "2026-12-02 11:30",
            "2026-12-02 11:30:00+01:00",
            "2026-12-02 11:30:00.",
            "2026-12-02 11:30:00.1234567891",
            "2026-13-02 11:30:00",
            "2026-02-30 11:30:00",
            "2026-12-02 24:00:00",
            "2026-12-02 11:30:0x",
            "+026-12-02 11:30:00",
        ] {
            assert_eq!(text_time(text), None, "{text}");
        }
    }
}
