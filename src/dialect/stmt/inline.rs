//! A statement's text with its values written in as literals, for statements sent together as
//! one text (a [`multi`](Stmt::multi) statement on MySQL/MariaDB; a batch's settlement joined
//! with the next claim): one round trip for several statements, none of them prepared.

use std::io::Write as _;

use super::{Args, Stmt};
use crate::table::{Dialect, Value};

/// Where a value is written into a statement's text: the placeholder's bytes (`start..end`)
/// and the index of its slot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mark {
    start: u32,
    end: u32,
    slot: u16,
}

/// The placeholders of `sql` that take one of its `slots` values, in order, found once when the
/// statement is written: MySQL/MariaDB's `?` take the values in order (a `?` past the last is
/// text), PostgreSQL's `$n` the n-th. A placeholder's character inside quotes is text.
pub(super) fn marks(sql: &str, dialect: Dialect, slots: usize) -> Box<[Mark]> {
    let sql = sql.as_bytes();
    let mut marks = Vec::with_capacity(slots);
    let mut quote = None;
    let mut i = 0;
    while i < sql.len() {
        let c = sql[i];
        let start = i;
        i += 1;
        match (quote, c, dialect) {
            (None, b'?', Dialect::MySql) if marks.len() < slots => {
                marks.push((start, i, marks.len()))
            }
            (None, b'$', Dialect::Postgres) if sql.get(i).is_some_and(u8::is_ascii_digit) => {
                let mut n = 0usize;
                while let Some(digit) = sql.get(i).filter(|c| c.is_ascii_digit()) {
                    n = n * 10 + usize::from(digit - b'0');
                    i += 1;
                }
                debug_assert!((1..=slots).contains(&n), "${n} without its slot");
                if (1..=slots).contains(&n) {
                    marks.push((start, i, n - 1));
                }
            }
            (None, b'\'' | b'"', _) | (None, b'`', Dialect::MySql) => quote = Some(c),
            (Some(open), _, _) if c == open => quote = None,
            _ => {}
        }
    }
    marks
        .into_iter()
        .map(|(start, end, slot)| Mark {
            start: u32::try_from(start).expect("a statement under 4 GiB"),
            end: u32::try_from(end).expect("a statement under 4 GiB"),
            slot: u16::try_from(slot).expect("under 65,536 placeholders"),
        })
        .collect()
}

impl Stmt {
    /// Its text with the values of `args` in place of its placeholders, as `dialect`'s literals
    /// of the types the placeholders are bound with:
    /// - MySQL/MariaDB (`?`): integers as numbers, text and bytes in hexadecimal (nothing to
    ///   escape, whatever the server's `sql_mode`), times as `DATETIME(6)`;
    /// - PostgreSQL (`$n`): each value cast to the type sqlx binds it as (`int8`, `bytea`,
    ///   `text`, `timestamptz`), so that the statement reads and plans as when bound; text as an
    ///   escape string (`E'..'`, whatever `standard_conforming_strings` says), bytes in
    ///   hexadecimal.
    ///
    /// A placeholder's character inside quotes is text, not a placeholder.
    pub(crate) fn inlined(&self, dialect: Dialect, args: &Args<'_>) -> String {
        // Written by hand, not through `fmt`, into bytes, between placeholders found when the
        // statement was written: a batch's texts carry dozens of values, and `write!` per value
        // and per hexadecimal byte, then a scan of the text per call, cost MariaDB's advisory
        // batches more client time than the statements they save (callgrind, a drain of 5,000
        // rows at 8 workers x 16: 74M instructions of the crate's 193M, then 18M of 145M; the
        // baseline's whole drain 103M).
        debug_assert!(
            dialect != Dialect::MySql || self.marks.len() == self.slots.len(),
            "a value without its placeholder"
        );
        let sql = self.sql.as_bytes();
        let mut out = Vec::with_capacity(sql.len() + 40 * self.marks.len());
        let mut copied = 0;
        for mark in &self.marks {
            out.extend_from_slice(&sql[copied..mark.start as usize]);
            let value = args.value(self.slots[usize::from(mark.slot)]);
            match dialect {
                Dialect::Postgres => postgres(&mut out, value),
                Dialect::MySql | Dialect::Sqlite => mysql(&mut out, value),
            }
            copied = mark.end as usize;
        }
        out.extend_from_slice(&sql[copied..]);
        // Runs of a `str` cut at ASCII placeholders, and ASCII or a `str`'s bytes written.
        String::from_utf8(out).expect("UTF-8 in, UTF-8 out")
    }
}

/// `v` in decimal.
fn integer(out: &mut Vec<u8>, v: i64) {
    let mut digits = [0u8; 20];
    let mut n = v.unsigned_abs();
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
}

/// `value` as a MySQL/MariaDB literal (see [`Stmt::inlined`]).
fn mysql(out: &mut Vec<u8>, value: Value<'_>) {
    match value {
        Value::I64(v) => integer(out, v),
        Value::Bytes(v) => hex(out, b"X'", v, b"'"),
        Value::Text(Some(v)) => hex(out, b"_utf8mb4 X'", v.as_bytes(), b"'"),
        Value::Time(Some(v)) => {
            let _ = write!(
                out,
                "CAST('{}' AS DATETIME(6))",
                v.format("%Y-%m-%d %H:%M:%S%.6f")
            );
        }
        Value::Text(None) | Value::Time(None) => out.extend_from_slice(b"NULL"),
    }
}

/// `value` as a PostgreSQL literal of the type sqlx binds it as (see [`Stmt::inlined`]).
fn postgres(out: &mut Vec<u8>, value: Value<'_>) {
    match value {
        // Quoted: `-9223372036854775808` unquoted is a `numeric` negated, which no index on a
        // `bigint` serves.
        Value::I64(v) => {
            out.push(b'\'');
            integer(out, v);
            out.extend_from_slice(b"'::int8");
        }
        Value::Bytes(v) => hex(out, b"decode('", v, b"', 'hex')"),
        Value::Text(Some(v)) => {
            out.extend_from_slice(b"E'");
            // Byte by byte: no byte of a multi-byte character is ASCII.
            for &byte in v.as_bytes() {
                match byte {
                    b'\'' => out.extend_from_slice(b"''"),
                    b'\\' => out.extend_from_slice(b"\\\\"),
                    byte => out.push(byte),
                }
            }
            out.extend_from_slice(b"'::text");
        }
        Value::Time(Some(v)) => {
            let _ = write!(
                out,
                "'{}'::timestamptz",
                v.format("%Y-%m-%d %H:%M:%S%.6f+00")
            );
        }
        Value::Text(None) => out.extend_from_slice(b"NULL::text"),
        Value::Time(None) => out.extend_from_slice(b"NULL::timestamptz"),
    }
}

fn hex(out: &mut Vec<u8>, open: &[u8], bytes: &[u8], close: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(open);
    let at = out.len();
    out.resize(at + 2 * bytes.len(), 0);
    for (pair, byte) in out[at..].chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 15)];
    }
    out.extend_from_slice(close);
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;

    use super::super::{Slot, SqlWriter};
    use super::*;

    #[test]
    fn postgres_values_are_cast_to_their_bound_types() {
        let mut w = SqlWriter::new(Dialect::Postgres);
        w.push("SELECT a FROM \"t$1\" WHERE a IN (")
            .param(Slot::IdAt(0))
            .push(", ")
            .param(Slot::IdAt(1))
            .push(") AND b = '$2' AND c <= ")
            .param(Slot::Now)
            .push(" AND g = ")
            .param(Slot::Group)
            .push(" AND p = ")
            .param(Slot::Payload)
            .push(" AND h = ")
            .param(Slot::Headers)
            .push(" AND f >= ")
            .param(Slot::Floor)
            .push(" LIMIT ")
            .param(Slot::Limit);
        let stmt = w.finish();
        assert_eq!(
            stmt.text(),
            "SELECT a FROM \"t$1\" WHERE a IN ($1, $2) AND b = '$2' AND c <= $3 AND g = $4 \
             AND p = $5 AND h = $6 AND f >= $7 LIMIT $8"
        );
        let now = DateTime::parse_from_rfc3339("2026-12-03T08:01:02.000304Z").unwrap();
        let args = Args {
            ids: &[7, -9],
            now: Some(now.to_utc()),
            group: Some("é'x\\y"),
            payload: &[0, 255],
            limit: 16,
            ..Args::default()
        };
        assert_eq!(
            stmt.inlined(Dialect::Postgres, &args),
            "SELECT a FROM \"t$1\" WHERE a IN ('7'::int8, '-9'::int8) AND b = '$2' AND c <= \
             '2026-12-03 08:01:02.000304+00'::timestamptz AND g = E'é''x\\\\y'::text AND \
             p = decode('00ff', 'hex') AND h = NULL::text AND f >= '-9223372036854775808'::int8 \
             LIMIT '16'::int8"
        );
    }
}
