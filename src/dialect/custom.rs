//! A service's own settlement statements ([`Queue::custom`](crate::Queue::custom)): their
//! markers become placeholders, and a text that holds more than one statement is refused.
//!
//! The text is scanned as the database's lexer reads it, so a `;` or a marker inside a string,
//! a quoted identifier or a comment is neither a statement's end nor a placeholder. This scan is
//! what keeps a second statement out on SQLite, whose driver prepares the first statement of a
//! text and runs the others too; PostgreSQL and MySQL/MariaDB refuse several statements in a
//! prepared one anyway (so where their lexers depend on a setting — PostgreSQL's
//! `standard_conforming_strings`, MySQL's `NO_BACKSLASH_ESCAPES` and `ANSI_QUOTES` — the server
//! still has the last word).

use super::{Dialect, Slot, SqlWriter, Stmt};

/// Renders a service's own settlement statement: its markers `:id`, `:token`, `:at`, `:dead`,
/// `:now` and `:group` become this dialect's placeholders, bound with the settlement's values.
/// Strings, quoted identifiers, comments and PostgreSQL's `::` casts are left alone. One
/// trailing `;` (followed by nothing but blanks and comments) is dropped.
///
/// # Errors
///
/// An unknown marker, a second statement, an unterminated string, quoted identifier or comment,
/// or no statement at all, in words.
pub(crate) fn custom(dialect: Dialect, sql: &str) -> Result<Stmt, String> {
    let mut scan = Scan {
        dialect,
        sql,
        bytes: sql.as_bytes(),
        at: 0,
    };
    let mut w = SqlWriter::new(dialect);
    let mut copied = 0;
    let mut end = None;
    let mut empty = true;
    while let Some(c) = scan.peek(0) {
        if scan.skip_blank_or_comment()? {
            continue;
        }
        if let Some(semicolon) = end {
            return Err(format!(
                "more than one statement: text follows the `;` at byte {semicolon} (`{}`); a \
                 custom statement is one statement",
                excerpt(&sql[scan.at..])
            ));
        }
        if c == b';' {
            end = Some(scan.at);
            scan.at += 1;
            continue;
        }
        empty = false;
        match c {
            b':' if scan.peek(1) == Some(b':') => scan.at += 2,
            b':' if scan.peek(1).is_some_and(|next| next.is_ascii_alphabetic()) => {
                w.push(&sql[copied..scan.at]);
                let name_start = scan.at + 1;
                scan.at = name_start;
                while scan
                    .peek(0)
                    .is_some_and(|next| next.is_ascii_alphanumeric() || next == b'_')
                {
                    scan.at += 1;
                }
                w.param(marker(&sql[name_start..scan.at])?);
                copied = scan.at;
            }
            _ => scan.skip_token(c)?,
        }
    }
    if empty {
        return Err("the statement is empty".to_owned());
    }
    w.push(&sql[copied..end.unwrap_or(sql.len())]);
    Ok(w.finish())
}

fn marker(name: &str) -> Result<Slot, String> {
    Ok(match name {
        "id" => Slot::Id,
        "token" => Slot::Token,
        "at" => Slot::At,
        "dead" => Slot::DeadGroup,
        "now" => Slot::Now,
        "group" => Slot::Group,
        other => {
            return Err(format!(
                "unknown marker `:{other}` (the markers are :id, :token, :at, :dead, :now and \
                 :group)"
            ));
        }
    })
}

/// The start of `rest`, for a message.
fn excerpt(rest: &str) -> String {
    let mut excerpt: String = rest.chars().take(40).collect();
    if excerpt.len() < rest.len() {
        excerpt.push_str("..");
    }
    excerpt
}

/// A position in a statement's text. Every character the scan acts on is ASCII, so each
/// position it stops at is a character boundary.
struct Scan<'a> {
    dialect: Dialect,
    sql: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl Scan<'_> {
    fn peek(&self, ahead: usize) -> Option<u8> {
        self.bytes.get(self.at + ahead).copied()
    }

    /// Whether the byte before the current one continues a word (so `$` or `E'` here is part of
    /// an identifier, not a quote).
    fn after_word(&self) -> bool {
        self.at > 0 && {
            let before = self.bytes[self.at - 1];
            before.is_ascii_alphanumeric() || matches!(before, b'_' | b'$') || before >= 0x80
        }
    }

    /// Skips one blank or one comment; `false` when the text here is neither.
    fn skip_blank_or_comment(&mut self) -> Result<bool, String> {
        let Some(c) = self.peek(0) else {
            return Ok(false);
        };
        if c.is_ascii_whitespace() {
            self.at += 1;
            return Ok(true);
        }
        let line_comment = match (c, self.peek(1)) {
            // MySQL's `--` starts a comment only when a blank or a control character follows
            // (`5--1` is 5 - -1).
            (b'-', Some(b'-')) if self.dialect == Dialect::MySql => {
                self.peek(2).is_none_or(|next| next <= b' ')
            }
            (b'-', Some(b'-')) => true,
            (b'#', _) => self.dialect == Dialect::MySql,
            _ => false,
        };
        if line_comment {
            self.at = self.sql[self.at..]
                .find('\n')
                .map_or(self.sql.len(), |newline| self.at + newline + 1);
            return Ok(true);
        }
        if (c, self.peek(1)) != (b'/', Some(b'*')) {
            return Ok(false);
        }
        // MySQL and MariaDB run the text of `/*! .. */` and `/*M! .. */` as SQL: it is scanned
        // as such, its opening and closing marks as blanks.
        if self.dialect == Dialect::MySql {
            let opening = match (self.peek(2), self.peek(3)) {
                (Some(b'!'), _) => Some(3),
                (Some(b'M'), Some(b'!')) => Some(4),
                _ => None,
            };
            if let Some(opening) = opening {
                self.at += opening;
                return Ok(true);
            }
        }
        // PostgreSQL's block comments nest; MySQL's and SQLite's end at the first `*/`.
        let nests = self.dialect == Dialect::Postgres;
        let start = self.at;
        let mut depth = 0usize;
        loop {
            match (self.peek(0), self.peek(1)) {
                (None, _) => {
                    return Err(format!(
                        "an unterminated comment at byte {start}: `{}`",
                        excerpt(&self.sql[start..])
                    ));
                }
                (Some(b'/'), Some(b'*')) if depth == 0 || nests => {
                    depth += 1;
                    self.at += 2;
                }
                (Some(b'*'), Some(b'/')) => {
                    depth -= 1;
                    self.at += 2;
                    if depth == 0 {
                        return Ok(true);
                    }
                }
                _ => self.at += 1,
            }
        }
    }

    /// Skips one token that is not a blank, a comment, `;` or a marker, beginning with the byte
    /// `c` here: a string, a quoted identifier, or a byte of anything else. A `*/` left by a
    /// MySQL `/*! .. */` is a blank.
    fn skip_token(&mut self, c: u8) -> Result<(), String> {
        let mysql = self.dialect == Dialect::MySql;
        match c {
            b'\'' => self.quoted(b'\'', mysql),
            // PostgreSQL's and SQLite's identifiers; MySQL's strings (or identifiers, with
            // ANSI_QUOTES).
            b'"' => self.quoted(b'"', mysql),
            b'`' if self.dialect != Dialect::Postgres => self.quoted(b'`', false),
            b'[' if self.dialect == Dialect::Sqlite => self.closed_by(b']'),
            b'E' | b'e'
                if self.dialect == Dialect::Postgres
                    && self.peek(1) == Some(b'\'')
                    && !self.after_word() =>
            {
                self.at += 1;
                self.quoted(b'\'', true)
            }
            b'$' if self.dialect == Dialect::Postgres && !self.after_word() => self.dollar_quoted(),
            b'*' if mysql && self.peek(1) == Some(b'/') => {
                self.at += 2;
                Ok(())
            }
            _ => {
                self.at += 1;
                Ok(())
            }
        }
    }

    /// Skips a string or identifier quoted with `quote`, in which a doubled quote stands for
    /// itself, and a backslash escapes the next character where `backslash`.
    fn quoted(&mut self, quote: u8, backslash: bool) -> Result<(), String> {
        let start = self.at;
        self.at += 1;
        loop {
            match self.peek(0) {
                None => {
                    return Err(format!(
                        "an unterminated {} at byte {start}: `{}`",
                        if quote == b'\'' {
                            "string"
                        } else {
                            "quoted name"
                        },
                        excerpt(&self.sql[start..])
                    ));
                }
                Some(b'\\') if backslash => self.at += 2,
                Some(c) if c == quote && self.peek(1) == Some(quote) => self.at += 2,
                Some(c) if c == quote => {
                    self.at += 1;
                    return Ok(());
                }
                Some(_) => self.at += 1,
            }
        }
    }

    /// Skips SQLite's `[name]`.
    fn closed_by(&mut self, close: u8) -> Result<(), String> {
        let start = self.at;
        match self.sql[start + 1..].find(char::from(close)) {
            Some(offset) => {
                self.at = start + 1 + offset + 1;
                Ok(())
            }
            None => Err(format!(
                "an unterminated quoted name at byte {start}: `{}`",
                excerpt(&self.sql[start..])
            )),
        }
    }

    /// Skips PostgreSQL's `$tag$ .. $tag$` (the tag may be empty); a `$` that opens none (`$1`)
    /// is one byte.
    fn dollar_quoted(&mut self) -> Result<(), String> {
        let start = self.at;
        let tag_len = self.sql[start + 1..]
            .bytes()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c >= 0x80)
            .count();
        let first = self.bytes.get(start + 1).copied();
        let closes = self.bytes.get(start + 1 + tag_len) == Some(&b'$');
        if !closes || first.is_some_and(|c| c.is_ascii_digit()) {
            self.at += 1;
            return Ok(());
        }
        let tag = &self.sql[start..start + tag_len + 2];
        let body = start + tag.len();
        match self.sql[body..].find(tag) {
            Some(offset) => {
                self.at = body + offset + tag.len();
                Ok(())
            }
            None => Err(format!(
                "an unterminated {tag} string at byte {start}: `{}`",
                excerpt(&self.sql[start..])
            )),
        }
    }
}

#[cfg(test)]
mod tests;
