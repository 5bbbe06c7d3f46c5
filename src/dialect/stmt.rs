//! A statement as rendered: its text and what each placeholder takes, and the values bound to it.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, SqlSafeStr as _, SqlStr};

use crate::table::{Dialect, Value, ValueKind};

mod inline;

/// What a statement's placeholders take, in the order they appear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// The row's id.
    Id,
    /// The `i`-th id of a list (claims on MySQL/MariaDB update the claimed ids).
    IdAt(u16),
    /// The delivery's current lease token.
    Token,
    /// The `i`-th id a claim passes over (rows held back in this process after a failure of
    /// their own), padded with the first.
    Excluded(u16),
    /// The `i`-th token of a list (acknowledgements of many rows).
    TokenAt(u16),
    /// A new lease token (claim, extension).
    NewToken,
    /// The current time.
    Now,
    /// A later time: `retry_after` of a settlement or an enqueue.
    At,
    /// The queue's group value.
    Group,
    /// How many rows a claim takes.
    Limit,
    /// The smallest id a claim looks at (`i64::MIN`: every id): the claims' floor, past the
    /// entries of rows settled before (`form::floor`).
    Floor,
    /// How many claimable rows a claim looks at to find `Limit` whose keys it gets (the
    /// advisory form's candidates, rows in work elsewhere among them).
    Window,
    /// A job's payload.
    Payload,
    /// A job's headers, as JSON text (NULL for none).
    Headers,
    /// A row's advisory key (PostgreSQL).
    Key,
    /// The table's advisory key class, the high half of its keys (PostgreSQL).
    KeyClass,
    /// The table's lock-name prefix (MySQL/MariaDB).
    KeyPrefix,
    /// The lock name of the `i`-th id of a list, written by the client (MySQL/MariaDB, where
    /// it fits without a hash; see `Keys::lock_names`), padded as `IdAt` is.
    LockNameAt(u16),
    /// The dead-letter group.
    DeadGroup,
    /// A job's priority.
    Priority,
    /// The table's quoted name, whose notification channel the statement computes (PostgreSQL).
    NotifyTable,
    /// A notification's payload: the job's group.
    NotifyPayload,
    /// A unique job's key.
    UniqueKey,
    /// A row's attempt count as its claim read it, before counting (a release that uncounts).
    Attempt,
    /// A schedule's name (periodic jobs).
    Schedule,
    /// A schedule's tick time.
    Tick,
}

impl Slot {
    /// The type of the value the slot takes.
    fn kind(self) -> ValueKind {
        match self {
            Slot::Id
            | Slot::IdAt(_)
            | Slot::Excluded(_)
            | Slot::Limit
            | Slot::Floor
            | Slot::Window
            | Slot::Key
            | Slot::KeyClass
            | Slot::Priority
            | Slot::Attempt => ValueKind::I64,
            Slot::Token | Slot::TokenAt(_) | Slot::NewToken | Slot::Now | Slot::At | Slot::Tick => {
                ValueKind::Time
            }
            Slot::Group
            | Slot::KeyPrefix
            | Slot::LockNameAt(_)
            | Slot::DeadGroup
            | Slot::NotifyTable
            | Slot::NotifyPayload
            | Slot::UniqueKey
            | Slot::Schedule
            | Slot::Headers => ValueKind::Text,
            Slot::Payload => ValueKind::Bytes,
        }
    }
}

/// A statement rendered once per list length `2^k` (`k = 0, 1, ..`): a list of `n` ids takes the
/// smallest that fits, the slots past `n` repeating its last id (and token).
#[derive(Debug, Clone)]
pub(crate) struct BySize(Box<[Stmt]>);

impl BySize {
    /// `render(2^k)` for every `2^k` up to `max` rounded up to a power of two.
    pub(crate) fn new(max: usize, render: impl FnMut(u16) -> Stmt) -> Self {
        let sizes = max.max(1).next_power_of_two().trailing_zeros();
        BySize((0..=sizes).map(|k| 1u16 << k).map(render).collect())
    }

    /// As [`new`](Self::new), for a statement the database may not have (`None` for every size).
    pub(crate) fn maybe(max: usize, mut render: impl FnMut(u16) -> Option<Stmt>) -> Option<Self> {
        let sizes = max.max(1).next_power_of_two().trailing_zeros();
        let all: Option<Box<[Stmt]>> = (0..=sizes).map(|k| render(1u16 << k)).collect();
        all.map(BySize)
    }

    /// The statement for a list of `n` (at most the largest size rendered).
    pub(crate) fn for_len(&self, n: usize) -> &Stmt {
        let k = n.next_power_of_two().trailing_zeros() as usize;
        debug_assert!(
            k < self.0.len(),
            "a list of {n} is longer than its statements"
        );
        &self.0[k.min(self.0.len() - 1)]
    }

    /// Every size's statement, to prepare at start.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, Stmt> {
        self.0.iter()
    }
}

impl<'a> IntoIterator for &'a BySize {
    type Item = &'a Stmt;
    type IntoIter = std::slice::Iter<'a, Stmt>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// A rendered statement: its text, shared (cloning it clones an `Arc`), and its placeholders.
#[derive(Debug, Clone)]
pub(crate) struct Stmt {
    sql: Arc<str>,
    pub(crate) slots: Box<[Slot]>,
    /// Run unprepared, in a transaction (its own outside one): the statement's table is behind
    /// a transaction pooler, whose next transaction may run on another server session.
    pub(crate) unprepared: bool,
    /// The statements of a [`multi`](Stmt::multi) statement, each on its own (checked at start
    /// by preparing them); empty for one statement.
    parts: Box<[Stmt]>,
    /// Where [`inlined`](Stmt::inlined) writes the values.
    marks: Box<[inline::Mark]>,
}

impl Stmt {
    pub(crate) fn text(&self) -> &str {
        &self.sql
    }

    pub(crate) fn sql(&self) -> SqlStr {
        AssertSqlSafe(Arc::clone(&self.sql)).into_sql_str()
    }

    /// The values its placeholders take from `args`, in order.
    pub(crate) fn values<'s, 'a>(
        &'s self,
        args: &'s Args<'a>,
    ) -> impl Iterator<Item = Value<'a>> + 's {
        self.slots.iter().map(|slot| args.value(*slot))
    }

    /// This statement, run unprepared when `unprepared` (see [`Stmt::unprepared`]).
    pub(crate) fn unprepared_if(mut self, unprepared: bool) -> Stmt {
        self.unprepared = unprepared;
        self
    }

    /// Several statements, `; ` between them (MySQL/MariaDB): sent in one round trip as text,
    /// their values written into it ([`inlined`](Stmt::inlined)), never prepared.
    pub(crate) fn multi(&self) -> bool {
        !self.parts.is_empty()
    }

    /// The statements it is made of: itself, or each of a [`multi`](Stmt::multi) statement's.
    pub(crate) fn parts(&self) -> &[Stmt] {
        match self.multi() {
            true => &self.parts,
            false => std::slice::from_ref(self),
        }
    }

    /// Its placeholders' types.
    pub(crate) fn kinds(&self) -> Vec<ValueKind> {
        self.slots.iter().map(|slot| slot.kind()).collect()
    }
}

/// The values a statement's slots are bound from.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Args<'a> {
    pub(crate) id: i64,
    pub(crate) ids: &'a [i64],
    pub(crate) excluded: &'a [i64],
    pub(crate) tokens: &'a [DateTime<Utc>],
    pub(crate) token: Option<DateTime<Utc>>,
    pub(crate) new_token: Option<DateTime<Utc>>,
    pub(crate) now: Option<DateTime<Utc>>,
    pub(crate) at: Option<DateTime<Utc>>,
    pub(crate) group: Option<&'a str>,
    pub(crate) limit: i64,
    /// The claim's floor: `None` looks at every id.
    pub(crate) floor: Option<i64>,
    pub(crate) window: i64,
    pub(crate) payload: &'a [u8],
    pub(crate) headers: Option<&'a str>,
    pub(crate) key: i64,
    pub(crate) key_class: i64,
    pub(crate) key_prefix: Option<&'a str>,
    pub(crate) lock_names: &'a [String],
    pub(crate) dead_group: Option<&'a str>,
    pub(crate) priority: i64,
    pub(crate) notify_table: Option<&'a str>,
    pub(crate) notify_payload: Option<&'a str>,
    pub(crate) unique_key: Option<&'a str>,
    pub(crate) attempt: i64,
    pub(crate) schedule: Option<&'a str>,
    pub(crate) tick: Option<DateTime<Utc>>,
}

impl<'a> Args<'a> {
    pub(crate) fn value(&self, slot: Slot) -> Value<'a> {
        match slot {
            Slot::Id => Value::I64(self.id),
            // A short list is padded with its last id: repeating an id in `IN (..)` is harmless.
            Slot::IdAt(i) => Value::I64(
                self.ids
                    .get(usize::from(i))
                    .or(self.ids.last())
                    .copied()
                    .unwrap_or(self.id),
            ),
            // Padded with the first: repeating an id in `NOT IN (..)` is harmless.
            Slot::Excluded(i) => Value::I64(
                self.excluded
                    .get(usize::from(i))
                    .or(self.excluded.first())
                    .copied()
                    .unwrap_or(i64::MIN),
            ),
            Slot::Token => Value::Time(self.token),
            // Padded as `IdAt` is: the last pair repeated.
            Slot::TokenAt(i) => Value::Time(
                self.tokens
                    .get(usize::from(i))
                    .or(self.tokens.last())
                    .copied(),
            ),
            Slot::NewToken => Value::Time(self.new_token),
            Slot::Now => Value::Time(self.now),
            Slot::At => Value::Time(self.at),
            Slot::Group => Value::Text(self.group),
            Slot::Limit => Value::I64(self.limit),
            Slot::Floor => Value::I64(self.floor.unwrap_or(i64::MIN)),
            Slot::Window => Value::I64(self.window),
            Slot::Payload => Value::Bytes(self.payload),
            Slot::Headers => Value::Text(self.headers),
            Slot::Key => Value::I64(self.key),
            Slot::KeyClass => Value::I64(self.key_class),
            Slot::KeyPrefix => Value::Text(self.key_prefix),
            Slot::LockNameAt(i) => Value::Text(
                self.lock_names
                    .get(usize::from(i))
                    .or(self.lock_names.last())
                    .map(String::as_str),
            ),
            Slot::DeadGroup => Value::Text(self.dead_group),
            Slot::Priority => Value::I64(self.priority),
            Slot::NotifyTable => Value::Text(self.notify_table),
            Slot::NotifyPayload => Value::Text(Some(self.notify_payload.unwrap_or(""))),
            Slot::UniqueKey => Value::Text(self.unique_key),
            Slot::Attempt => Value::I64(self.attempt),
            Slot::Schedule => Value::Text(self.schedule),
            Slot::Tick => Value::Time(self.tick),
        }
    }
}

/// Writes statement text, numbering placeholders in the dialect's way.
#[derive(Debug)]
pub(crate) struct SqlWriter {
    dialect: Dialect,
    sql: String,
    slots: Vec<Slot>,
    unprepared: bool,
    /// The statements ended by [`then`](SqlWriter::then), and where the next one starts (text,
    /// slots).
    parts: Vec<Stmt>,
    part_start: (usize, usize),
}

impl SqlWriter {
    pub(crate) fn new(dialect: Dialect) -> Self {
        SqlWriter {
            dialect,
            sql: String::with_capacity(256),
            slots: Vec::new(),
            unprepared: false,
            parts: Vec::new(),
            part_start: (0, 0),
        }
    }

    /// Marks the statement to run unprepared ([`Stmt::unprepared`]).
    pub(crate) fn unprepared(mut self, unprepared: bool) -> Self {
        self.unprepared = unprepared;
        self
    }

    pub(crate) fn dialect(&self) -> Dialect {
        self.dialect
    }

    pub(crate) fn push(&mut self, text: &str) -> &mut Self {
        self.sql.push_str(text);
        self
    }

    pub(crate) fn param(&mut self, slot: Slot) -> &mut Self {
        self.slots.push(slot);
        match self.dialect {
            Dialect::Postgres => {
                self.sql.push('$');
                self.sql.push_str(&self.slots.len().to_string());
            }
            Dialect::MySql | Dialect::Sqlite => self.sql.push('?'),
        }
        self
    }

    /// ` LIMIT ` and the placeholder of `slot`. SQLite reads a bare `LIMIT ?` as a constant when it
    /// prepares the statement (3.51: `sqlite3ExprIsInteger` looks at the bound value), which
    /// marks the statement to be prepared again each time that parameter is bound anew — every
    /// execution. An expression of it is read when the statement runs.
    pub(crate) fn limit(&mut self, slot: Slot) -> &mut Self {
        self.sql.push_str(" LIMIT ");
        match self.dialect {
            Dialect::Sqlite => {
                self.sql.push_str("CAST(");
                self.param(slot);
                self.sql.push_str(" AS INTEGER)");
            }
            Dialect::Postgres | Dialect::MySql => {
                self.param(slot);
            }
        }
        self
    }

    /// Ends a statement and starts the next, sent together ([`Stmt::multi`]; MySQL/MariaDB).
    pub(crate) fn then(&mut self) -> &mut Self {
        debug_assert_eq!(self.dialect, Dialect::MySql);
        let part = self.part();
        self.parts.push(part);
        self.sql.push_str("; ");
        self.part_start = (self.sql.len(), self.slots.len());
        self
    }

    /// The statement written since the last [`then`](SqlWriter::then).
    fn part(&self) -> Stmt {
        let (text, slots) = self.part_start;
        let (sql, slots) = (&self.sql[text..], &self.slots[slots..]);
        Stmt {
            sql: sql.into(),
            slots: slots.into(),
            unprepared: self.unprepared,
            parts: Box::default(),
            marks: inline::marks(sql, self.dialect, slots.len()),
        }
    }

    /// Appends another writer's text and placeholders (numbered on from this one's).
    pub(crate) fn append(&mut self, other: SqlWriter) -> &mut Self {
        debug_assert!(self.slots.is_empty() || self.dialect != Dialect::Postgres);
        self.sql.push_str(&other.sql);
        self.slots.extend(other.slots);
        self
    }

    pub(crate) fn finish(mut self) -> Stmt {
        if !self.parts.is_empty() {
            let last = self.part();
            self.parts.push(last);
        }
        Stmt {
            marks: inline::marks(&self.sql, self.dialect, self.slots.len()),
            sql: self.sql.into(),
            slots: self.slots.into(),
            unprepared: self.unprepared,
            parts: self.parts.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_on_postgres_only() {
        let mut w = SqlWriter::new(Dialect::Postgres);
        w.push("a = ")
            .param(Slot::Id)
            .push(" AND b = ")
            .param(Slot::Token);
        assert_eq!(w.finish().text(), "a = $1 AND b = $2");
        let mut w = SqlWriter::new(Dialect::MySql);
        w.push("a = ")
            .param(Slot::Id)
            .push(" AND b = ")
            .param(Slot::Token);
        let stmt = w.finish();
        assert_eq!(stmt.text(), "a = ? AND b = ?");
        assert_eq!(&*stmt.slots, &[Slot::Id, Slot::Token]);
        assert_eq!(stmt.kinds(), [ValueKind::I64, ValueKind::Time]);
    }

    #[test]
    fn a_multi_statement_carries_its_values_as_literals() {
        let mut w = SqlWriter::new(Dialect::MySql);
        w.push("SELECT a FROM `t?` WHERE a IN (")
            .param(Slot::IdAt(0))
            .push(", ")
            .param(Slot::IdAt(1))
            .push(") AND b = '?' AND c <= ")
            .param(Slot::Now)
            .then()
            .push("DELETE FROM t WHERE g = ")
            .param(Slot::Group)
            .push(" AND p = ")
            .param(Slot::Payload)
            .push(" AND h = ")
            .param(Slot::Headers)
            .push(" AND f >= ")
            .param(Slot::Floor);
        let stmt = w.finish();
        assert!(stmt.multi());
        let parts: Vec<&str> = stmt.parts().iter().map(Stmt::text).collect();
        assert_eq!(
            parts,
            [
                "SELECT a FROM `t?` WHERE a IN (?, ?) AND b = '?' AND c <= ?",
                "DELETE FROM t WHERE g = ? AND p = ? AND h = ? AND f >= ?"
            ]
        );
        assert_eq!(stmt.parts()[1].slots[0], Slot::Group);
        let now = DateTime::parse_from_rfc3339("2026-12-03T08:01:02.000304Z").unwrap();
        let args = Args {
            ids: &[7, -9],
            now: Some(now.to_utc()),
            group: Some("é'x"),
            payload: &[0, 255],
            ..Args::default()
        };
        assert_eq!(
            stmt.inlined(Dialect::MySql, &args),
            "SELECT a FROM `t?` WHERE a IN (7, -9) AND b = '?' AND c <= \
             CAST('2026-12-03 08:01:02.000304' AS DATETIME(6)); DELETE FROM t WHERE \
             g = _utf8mb4 X'c3a92778' AND p = X'00ff' AND h = NULL AND f >= -9223372036854775808"
        );
    }

    #[test]
    fn short_id_lists_are_padded() {
        let args = Args {
            ids: &[7, 9],
            ..Args::default()
        };
        assert!(matches!(args.value(Slot::IdAt(0)), Value::I64(7)));
        assert!(matches!(args.value(Slot::IdAt(3)), Value::I64(9)));
    }
}
