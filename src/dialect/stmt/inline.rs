//! A statement's text with its values written in as literals, for statements sent together as
//! one text (a [`multi`](Stmt::multi) statement on MySQL/MariaDB; a batch's settlement joined
//! with the next claim): one round trip for several statements, none of them prepared.

use std::fmt::Write as _;

use super::{Args, Stmt};
use crate::table::{Dialect, Value};

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
        // Written by hand, not through `fmt`: a batch's texts carry dozens of values, and
        // `write!` per value and per hexadecimal byte cost MariaDB's advisory batches more
        // client time than the statements they save (callgrind: 74M of the crate's 193M
        // instructions in a drain of 5,000 rows at 8 workers x 16, the baseline's 103M).
        let sql = self.sql.as_bytes();
        let mut out = String::with_capacity(self.sql.len() + 24 * self.slots.len());
        let mut values = self.values(args);
        let mut quote = None;
        // The start of the text not copied yet: placeholders and quotes are ASCII, so every
        // run copied ends on a character boundary.
        let mut copied = 0;
        let mut i = 0;
        while i < sql.len() {
            let c = sql[i];
            match (quote, c, dialect) {
                (None, b'?', Dialect::MySql) => {
                    let Some(value) = values.next() else {
                        i += 1;
                        continue;
                    };
                    out.push_str(&self.sql[copied..i]);
                    mysql(&mut out, value);
                    i += 1;
                    copied = i;
                }
                (None, b'$', Dialect::Postgres)
                    if sql.get(i + 1).is_some_and(u8::is_ascii_digit) =>
                {
                    out.push_str(&self.sql[copied..i]);
                    // Numbered in order of appearance: `$n` is the n-th slot.
                    let mut n = 0usize;
                    i += 1;
                    while let Some(digit) = sql.get(i).filter(|c| c.is_ascii_digit()) {
                        n = n * 10 + usize::from(digit - b'0');
                        i += 1;
                    }
                    copied = i;
                    let slot = self.slots.get(n.wrapping_sub(1)).copied();
                    debug_assert!(slot.is_some(), "${n} without its slot");
                    if let Some(slot) = slot {
                        postgres(&mut out, args.value(slot));
                    }
                }
                (None, b'\'' | b'"', _) | (None, b'`', Dialect::MySql) => {
                    quote = Some(c);
                    i += 1;
                }
                (Some(open), _, _) => {
                    if c == open {
                        quote = None;
                    }
                    i += 1;
                }
                (None, _, _) => i += 1,
            }
        }
        out.push_str(&self.sql[copied..]);
        debug_assert!(
            dialect != Dialect::MySql || values.next().is_none(),
            "a value without its placeholder"
        );
        out
    }
}

/// `v` in decimal.
fn integer(out: &mut String, v: i64) {
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
        out.push('-');
    }
    for &digit in &digits[at..] {
        out.push(char::from(digit));
    }
}

/// `value` as a MySQL/MariaDB literal (see [`Stmt::inlined`]).
fn mysql(out: &mut String, value: Value<'_>) {
    match value {
        Value::I64(v) => integer(out, v),
        Value::Bytes(v) => hex(out, "X'", v, "'"),
        Value::Text(Some(v)) => hex(out, "_utf8mb4 X'", v.as_bytes(), "'"),
        Value::Time(Some(v)) => {
            let _ = write!(
                out,
                "CAST('{}' AS DATETIME(6))",
                v.format("%Y-%m-%d %H:%M:%S%.6f")
            );
        }
        Value::Text(None) | Value::Time(None) => out.push_str("NULL"),
    }
}

/// `value` as a PostgreSQL literal of the type sqlx binds it as (see [`Stmt::inlined`]).
fn postgres(out: &mut String, value: Value<'_>) {
    match value {
        // Quoted: `-9223372036854775808` unquoted is a `numeric` negated, which no index on a
        // `bigint` serves.
        Value::I64(v) => {
            out.push('\'');
            integer(out, v);
            out.push_str("'::int8");
        }
        Value::Bytes(v) => hex(out, "decode('", v, "', 'hex')"),
        Value::Text(Some(v)) => {
            out.push_str("E'");
            for c in v.chars() {
                match c {
                    '\'' => out.push_str("''"),
                    '\\' => out.push_str("\\\\"),
                    c => out.push(c),
                }
            }
            out.push_str("'::text");
        }
        Value::Time(Some(v)) => {
            let _ = write!(
                out,
                "'{}'::timestamptz",
                v.format("%Y-%m-%d %H:%M:%S%.6f+00")
            );
        }
        Value::Text(None) => out.push_str("NULL::text"),
        Value::Time(None) => out.push_str("NULL::timestamptz"),
    }
}

fn hex(out: &mut String, open: &str, bytes: &[u8], close: &str) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.push_str(open);
    out.reserve(2 * bytes.len() + close.len());
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 15)]));
    }
    out.push_str(close);
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
