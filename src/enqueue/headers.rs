//! A job's headers: string pairs stored beside its payload, in the table's
//! [headers](Table::headers) column, for what travels with a job but is not its content (a trace
//! context, a tenant, a request id).

use std::borrow::Cow;

use super::Job;
use crate::error::{Error, Result};
use crate::table::{Table, encode_headers};

impl<'a> Job<'a> {
    /// Adds the header `key` with `value`, stored in the table's
    /// [headers](Table::headers) column and read back byte for byte by the handler
    /// ([`Delivery::header`](crate::Delivery::header)). Any number of headers; keys and values are
    /// any text without NUL characters (which PostgreSQL's `JSONB` cannot hold: such a job is
    /// refused at enqueue, on every database). A key given twice keeps its last value.
    ///
    /// # Examples
    ///
    /// ```
    /// use sqlx_queue::Job;
    ///
    /// let job = Job::new("resize 42")
    ///     .header("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    ///     .header("tenant", "acme")
    ///     .header("tenant", "globex"); // the last value wins
    /// assert_eq!(job.headers().collect::<Vec<_>>(), [
    ///     ("tenant", "globex"),
    ///     ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    /// ]);
    /// ```
    pub fn header(mut self, key: impl Into<Cow<'a, str>>, value: impl Into<Cow<'a, str>>) -> Self {
        self.headers.insert(key.into(), value.into());
        self
    }

    /// The job's headers, in key order.
    pub fn headers(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.headers.iter().map(|(k, v)| (&**k, &**v))
    }

    /// The headers' stored text (a JSON object of strings), `None` for no headers.
    pub(super) fn headers_text(&self) -> Option<String> {
        encode_headers(self.headers())
    }
}

impl Table {
    /// Refuses headers this table cannot store: any, without a headers column; a NUL character.
    pub(super) fn check_headers(&self, job: &Job<'_>) -> Result<()> {
        if job.headers.is_empty() {
            return Ok(());
        }
        if self.headers.is_none() {
            return Err(Error::invalid_job(
                &self.name,
                format!(
                    "the job has headers, but table `{}` has no headers column: declare it with \
                     `Table::headers(\"column\")` (a JSON or text column)",
                    self.name
                ),
            ));
        }
        for (key, value) in job.headers() {
            if key.contains('\0') || value.contains('\0') {
                return Err(Error::invalid_job(
                    &self.name,
                    format!(
                        "the header {key:?} holds a NUL character, which the headers column \
                         cannot store (PostgreSQL's JSONB refuses it); encode it first"
                    ),
                ));
            }
        }
        Ok(())
    }
}
