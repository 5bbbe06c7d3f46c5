//! A job's headers, and the text they are stored as: a flat JSON object of strings, written and
//! read here without a JSON library (`serde_json` is optional). The database may keep the text
//! its own way (`JSONB` orders keys and respaces, MySQL's `JSON` too), so it is parsed, never
//! compared as text.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The headers a job carried: string keys and values, byte for byte as enqueued
/// ([`Job::header`](crate::Job::header)), read from the table's
/// [`headers`](crate::Table::headers) column.
///
/// Iterates in key order (byte order of the keys), each key once. Empty when the job carried
/// none, or the queue's table has no headers column.
///
/// # Examples
///
/// ```
/// # fn see(d: &sqlx_queue::Delivery<sqlx::Sqlite>) {
/// if let Some(traceparent) = d.header("traceparent") {
///     println!("continuing trace {traceparent}");
/// }
/// for (key, value) in d.headers() {
///     println!("{key}: {value}");
/// }
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(BTreeMap<String, String>);

impl Headers {
    /// The value of header `key`, if the job carried it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// The headers as `(key, value)` pairs, in key order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// How many headers there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Reads the stored text: a JSON object whose values are all strings (a key twice: the last
    /// wins, as PostgreSQL's `JSONB` keeps it). Empty text (a NULL column) is no headers.
    pub(crate) fn decode(text: &[u8]) -> Result<Headers, String> {
        if text.is_empty() {
            return Ok(Headers::default());
        }
        let text = std::str::from_utf8(text).map_err(|_| "the headers are not UTF-8".to_owned())?;
        Parser { text, at: 0 }
            .object()
            .map(Headers)
            .map_err(|why| format!("the headers are not a JSON object of strings: {why}"))
    }
}

impl<'a> IntoIterator for &'a Headers {
    type Item = (&'a str, &'a str);
    type IntoIter = Box<dyn ExactSizeIterator<Item = (&'a str, &'a str)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

/// The text of `headers` as a JSON object of strings, or `None` for no headers (stored as NULL).
/// Keys and values are written as they are, but `"`, `\` and control characters, escaped.
pub(crate) fn encode<'h>(mut headers: impl Iterator<Item = (&'h str, &'h str)>) -> Option<String> {
    let first = headers.next()?;
    let mut out = String::with_capacity(64);
    out.push('{');
    for (i, (key, value)) in std::iter::once(first).chain(headers).enumerate() {
        if i > 0 {
            out.push(',');
        }
        quote(&mut out, key);
        out.push(':');
        quote(&mut out, value);
    }
    out.push('}');
    Some(out)
}

fn quote(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A reader of one JSON object of strings (RFC 8259's grammar for those).
struct Parser<'t> {
    text: &'t str,
    at: usize,
}

impl Parser<'_> {
    fn object(mut self) -> Result<BTreeMap<String, String>, String> {
        let mut map = BTreeMap::new();
        self.space();
        self.expect(b'{')?;
        self.space();
        if self.peek() == Some(b'}') {
            self.at += 1;
        } else {
            loop {
                self.space();
                let key = self.string()?;
                self.space();
                self.expect(b':')?;
                self.space();
                let value = self.string()?;
                map.insert(key, value);
                self.space();
                match self.next() {
                    Some(b',') => {}
                    Some(b'}') => break,
                    _ => return Err(self.error("`,` or `}`")),
                }
            }
        }
        self.space();
        match self.at == self.text.len() {
            true => Ok(map),
            false => Err(self.error("the end")),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            let rest = &self.text[self.at..];
            let plain = rest
                .find(|c: char| c == '"' || c == '\\' || u32::from(c) < 0x20)
                .ok_or_else(|| self.error("a closing `\"`"))?;
            out.push_str(&rest[..plain]);
            self.at += plain;
            match self.next() {
                Some(b'"') => return Ok(out),
                Some(b'\\') => out.push(self.escape()?),
                _ => return Err(self.error("an escaped control character")),
            }
        }
    }

    fn escape(&mut self) -> Result<char, String> {
        Ok(match self.next() {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                let high = self.hex4()?;
                if (0xD800..0xDC00).contains(&high) {
                    if self.next() != Some(b'\\') || self.next() != Some(b'u') {
                        return Err(self.error("the low half of a surrogate pair"));
                    }
                    let low = self.hex4()?;
                    if !(0xDC00..0xE000).contains(&low) {
                        return Err(self.error("the low half of a surrogate pair"));
                    }
                    let c = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
                    char::from_u32(c).ok_or_else(|| self.error("a character"))?
                } else {
                    char::from_u32(high)
                        .ok_or_else(|| self.error("a character, not a lone surrogate"))?
                }
            }
            _ => return Err(self.error("an escape")),
        })
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self
            .text
            .get(self.at..self.at + 4)
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| self.error("four hex digits"))?;
        self.at += 4;
        u32::from_str_radix(digits, 16).map_err(|_| self.error("four hex digits"))
    }

    fn space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn expect(&mut self, b: u8) -> Result<(), String> {
        match self.next() == Some(b) {
            true => Ok(()),
            false => Err(self.error(&format!("`{}`", char::from(b)))),
        }
    }

    fn error(&self, wanted: &str) -> String {
        format!("expected {wanted} at byte {}", self.at.min(self.text.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(pairs: &[(&str, &str)]) {
        let text = encode(pairs.iter().copied()).unwrap_or_default();
        let read = Headers::decode(text.as_bytes()).unwrap();
        let expected: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(read.0, expected, "{text}");
    }

    #[test]
    fn keys_and_values_round_trip_byte_for_byte() {
        round_trip(&[]);
        round_trip(&[("", "")]);
        round_trip(&[(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )]);
        round_trip(&[
            ("quote\"", "back\\slash"),
            ("/", "\u{1}\u{1f}\u{7f}\n\r\t\u{8}\u{c}"),
        ]);
        round_trip(&[("ключ", "値 🦀 \u{2028}\u{fffd}"), ("é", "e\u{301}")]);
        let many: Vec<(String, String)> =
            (0..300).map(|i| (format!("k{i}"), "v".repeat(i))).collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        round_trip(&many);
    }

    #[test]
    fn control_characters_are_escaped_as_json_requires() {
        let text = encode([("a\"", "\u{1}\\\n")].into_iter()).unwrap();
        assert_eq!(text, r#"{"a\"":"\u0001\\\n"}"#);
        assert_eq!(encode(std::iter::empty()), None);
    }

    #[test]
    fn text_the_database_rewrote_is_read() {
        // PostgreSQL's JSONB: keys ordered, a space after `:` and `,`; escapes of any kind.
        let read = Headers::decode(br#" { "b" : "2" , "a": "\u00e9\ud83e\udd80\/" } "#).unwrap();
        assert_eq!(read.get("a"), Some("é🦀/"));
        assert_eq!(read.get("b"), Some("2"));
        assert_eq!(read.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["a", "b"]);
        // A key twice: the last wins.
        let read = Headers::decode(br#"{"k":"1","k":"2"}"#).unwrap();
        assert_eq!((read.len(), read.get("k")), (1, Some("2")));
        assert!(Headers::decode(b"").unwrap().is_empty());
        assert!(Headers::decode(b"{}").unwrap().is_empty());
    }

    #[test]
    fn anything_but_an_object_of_strings_is_refused() {
        for bad in [
            &b"null"[..],
            b"[]",
            b"\"s\"",
            br#"{"a":1}"#,
            br#"{"a":null}"#,
            br#"{"a":{"b":"c"}}"#,
            br#"{"a":"b",}"#,
            br#"{"a":"b"} x"#,
            br#"{"a":"b""#,
            br#"{"a":"\x"}"#,
            br#"{"a":"\ud800"}"#,
            br#"{"a":"\u12"}"#,
            b"{\"a\":\"\n\"}",
            b"{\"a\":\"\xff\"}",
            br#"{a:"b"}"#,
        ] {
            let read = Headers::decode(bad);
            assert!(
                read.is_err(),
                "{:?} read as {read:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let why = Headers::decode(br#"{"a":1}"#).unwrap_err();
        assert!(why.contains("not a JSON object of strings"), "{why}");
    }
}
