//! Identifier validation and quoting: every name a statement uses is checked here, and quoted
//! in its database's way, so a hostile name is an [`Error::Identifier`], never SQL.

use super::Dialect;
use crate::error::{Error, Result};

impl Dialect {
    /// Validates `ident` and quotes it in this database's way.
    pub(crate) fn quote(self, ident: &str) -> Result<String> {
        self.refuse_characters(ident)?;
        validate_ident(ident)?;
        match self {
            Dialect::Postgres if ident.len() > 63 => Err(Error::Identifier {
                name: ident.to_owned(),
                reason: "PostgreSQL identifiers are at most 63 bytes (longer ones would be \
                         silently truncated)",
            }),
            Dialect::MySql if ident.chars().count() > 64 => Err(Error::Identifier {
                name: ident.to_owned(),
                reason: "MySQL/MariaDB identifiers are at most 64 characters",
            }),
            Dialect::Postgres => Ok(format!("\"{ident}\"")),
            Dialect::MySql | Dialect::Sqlite => Ok(format!("`{ident}`")),
        }
    }

    /// Refuses characters this database's identifiers cannot hold (before the checks of every
    /// database, which refuse emoji with a reason of their own).
    fn refuse_characters(self, name: &str) -> Result<()> {
        if self == Dialect::MySql && name.chars().any(|c| c > '\u{FFFF}') {
            return Err(Error::Identifier {
                name: name.to_owned(),
                reason: "MySQL/MariaDB identifiers hold characters of the Basic Multilingual \
                         Plane only (U+0001 to U+FFFF): no emoji, no letters beyond it",
            });
        }
        Ok(())
    }

    /// Validates and quotes a possibly schema-qualified table name.
    pub(crate) fn quote_table(self, name: &str) -> Result<String> {
        self.refuse_characters(name)?;
        match table_parts(name)? {
            (None, table) => self.quote(table),
            (Some(schema), table) => Ok(format!("{}.{}", self.quote(schema)?, self.quote(table)?)),
        }
    }
}

/// Longest identifier accepted on any database (PostgreSQL's own limit is checked when rendering).
const MAX_IDENT_BYTES: usize = 255;

/// Checks that `name` can be an SQL identifier once quoted: letters, digits, `_`, `$`, `-` and
/// inner spaces. Quotes, backslashes, semicolons, control characters and the like are refused
/// outright rather than escaped, so a hostile name never reaches a statement.
pub(crate) fn validate_ident(name: &str) -> Result<()> {
    let refuse = |reason| {
        Err(Error::Identifier {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return refuse("an identifier cannot be empty");
    }
    if name.len() > MAX_IDENT_BYTES {
        return refuse("an identifier is at most 255 bytes long");
    }
    if name.starts_with(' ') || name.ends_with(' ') {
        return refuse("an identifier cannot start or end with a space");
    }
    let allowed = |c: char| c.is_alphanumeric() || matches!(c, '_' | '$' | '-' | ' ');
    if !name.chars().all(allowed) {
        return refuse(
            "only letters, digits, `_`, `$`, `-` and inner spaces are allowed \
             (no quotes, dots, semicolons or control characters)",
        );
    }
    if name.contains("--") {
        return refuse("an identifier cannot contain a comment marker `--`");
    }
    Ok(())
}

/// `part` without one pair of double quotes or backticks around it.
fn unquoted(part: &str) -> &str {
    for quote in ['"', '`'] {
        if let Some(inner) = part.strip_prefix(quote).and_then(|p| p.strip_suffix(quote)) {
            return inner;
        }
    }
    part
}

/// Splits a possibly schema-qualified table name into its validated parts. Each part may be
/// written quoted (`"public"."jobs"`, or with backticks): every name is quoted when a statement is
/// rendered, so `"jobs"` and `jobs` name the same table.
pub(crate) fn table_parts(name: &str) -> Result<(Option<&str>, &str)> {
    match name.split_once('.') {
        None => {
            let table = unquoted(name);
            validate_ident(table)?;
            Ok((None, table))
        }
        Some((schema, table)) => {
            if table.contains('.') {
                return Err(Error::Identifier {
                    name: name.to_owned(),
                    reason: "a table name has at most two parts: `schema.table`",
                });
            }
            let (schema, table) = (unquoted(schema), unquoted(table));
            validate_ident(schema)?;
            validate_ident(table)?;
            Ok((Some(schema), table))
        }
    }
}
