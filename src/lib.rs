//! Job queues in your application's own SQL tables — PostgreSQL, MySQL 8 / MariaDB 10.6+ and
//! SQLite — through [`sqlx`] 0.9 and [`tokio`].
//!
//! A job is a row, inserted with the data it serves, in the same transaction: a signup that writes
//! its account and queues its welcome email commits both or neither. A [`Runner`] in your tokio
//! application claims rows, runs your handler, and settles each delivery by its [`Outcome`] — ack,
//! drop, retry, or retry after a delay — with one statement guarded so that a row is never settled
//! by a delivery that no longer holds it. A queue is declared by a chain of calls: a chain that
//! cannot work on any database does not compile, and one the database it meets cannot serve is
//! an error at start, before anything is claimed.
//!
//! # Quick start
//!
//! ```rust
//! use std::time::Duration;
//! use sqlx::{Sqlite, sqlite::SqlitePoolOptions};
//! use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};
//!
//! async fn send(email: Delivery<Sqlite>) -> Outcome {
//!     println!("sending to {}", String::from_utf8_lossy(email.payload()));
//!     if email.attempt() < 3 { Outcome::ack() } else { Outcome::drop() }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
//! let jobs = Table::new("email_jobs").retry_after("retry_after");
//! let emails = Queue::table(jobs).lease("locked_until").attempt("attempt").workers(4);
//! emails.schema::<Sqlite>()?.create(&pool).await?;              // or print it into a migration
//! emails.enqueue(&pool, Job::new("alice@example.com")).await?;  // or `&mut *tx`
//! let running = Runner::new(pool.clone()).mount(emails.clone().handler(send)).start().await?;
//! while emails.counts(&pool).await?.ready > 0 {
//!     tokio::time::sleep(Duration::from_millis(10)).await;
//! }
//! running.shutdown().await?;
//! # Ok(())
//! # }
//! ```
//!
//! `cargo run --example quickstart` is the same as a program; the [`guide`] has a page per
//! question, from [creating the table](guide::table) to [what is guaranteed](guide::guarantees).
//!
//! # A map of the API
//!
//! **[`Table`] → [`Queue`] → [`Runner`] → [`Delivery`] / [`Outcome`].**
//!
//! - [`Table`] says which column of your table plays which role (payload, group, attempt, lease,
//!   `retry_after`, `processed_at`, `created_at`, headers, unique key, priority) and how it is
//!   reached (its [`PayloadType`], a [`Pooler`] in front of PostgreSQL, `NOTIFY`, the limiter and
//!   cancel requests' tables). Names are validated and quoted.
//! - [`Queue`] is the declaration, built by a chain of calls: the claim form
//!   ([`lease`](Queue::lease), [`row_lock`](Queue::row_lock),
//!   [`advisory_lock`](Queue::advisory_lock)), attempts and their cap, the [`DeadLetter`], the
//!   [`Backoff`], [`transactional`](Queue::transactional) with its [`Isolation`] or
//!   [`SqliteMode`], workers, [`batch`](Queue::batch), `fifo`/`per_group`, [`ByKey`],
//!   [`RateLimit`], statements of your own for an [`Event`]; then the handler
//!   ([`handler`](Queue::handler), `json_handler`, [`row_handler`](Queue::row_handler),
//!   [`batch_handler`](Queue::batch_handler)). A call that needs another first does not compile,
//!   and the error names the missing call; the states are in [`state`].
//! - [`Runner`] mounts queues and [`Schedule`]s on a pool and [`start`](Runner::start)s them,
//!   after checking every table and statement against the database ([`SchemaError`] names the
//!   fix). [`Running`] is the started runner: its [`Stats`], its next ticks, and
//!   [`shutdown`](Running::shutdown) with its [`ShutdownReport`].
//! - [`Delivery`] is one claimed job: payload, id, attempt, [`Headers`], a
//!   [`cancelled`](Delivery::cancelled) future, and on a transactional queue its [`Tx`]
//!   (`Delivery<DB, Transactional>`). The handler returns an [`Outcome`] (or `()`, or a
//!   `Result`).
//!
//! **Jobs and enqueueing.** A [`Job`] is a payload with its options (delay, priority, group,
//! headers, unique key: a [`UniqueJob`]). The queue enqueues it on any executor — a pool, a
//! connection, or `&mut *tx` with your own writes: [`Queue::enqueue`], [`Queue::enqueue_many`],
//! [`Queue::enqueue_unique`] (an [`Enqueued`] says whether it was new, a duplicate, replaced or
//! debounced).
//!
//! **Operations**, on the same declaration: [`Queue::counts`] ([`Counts`]: ready, delayed, in work,
//! dead, the oldest ready job's age), [`Queue::cancel`] and [`Queue::cancel_unique`]
//! ([`Cancellation`]), [`Queue::requeue_dead`], [`Queue::prune`] and [`Queue::prune_dead`]; the DDL
//! from [`Queue::schema`] and [`Runner::schema`] (a [`Schema`]).
//!
//! **Errors.** One [`Error`] enum (and [`Result`]); each variant names the queue, table or
//! statement it concerns. Programmer errors (`workers(0)`) panic at the call, documented under
//! `# Panics`.
//!
//! # The claim forms
//!
//! | | lease | row lock | advisory lock |
//! |---|---|---|---|
//! | PostgreSQL | yes | yes | yes |
//! | MySQL 8.0.1+ / MariaDB 10.6+ | yes | yes | yes |
//! | SQLite | yes | does not compile | within one process |
//! | holds the row | a `locked_until` token, committed at once | the claim's transaction | a session lock on the row's key |
//! | a crashed delivery's row | returns when its lease expires | returns at once | returns at once |
//!
//! How to choose: [the claim forms](guide::claim_forms).
//!
//! # Feature flags
//!
//! | feature | default | what |
//! |---|---|---|
//! | `sqlite` | yes | SQLite ([`sqlx::Sqlite`]) |
//! | `postgres` | | PostgreSQL |
//! | `mysql` | | MySQL 8.0.1+ and MariaDB 10.6+ |
//! | `json` | | `json_handler`, `Job::json`, `Delivery::json` (serde) |
//! | `cron` | | [`Schedule::cron`] and `cron_in` (croner, chrono-tz) |
//! | `metrics` | | the runner's metrics through the `metrics` facade |
//!
//! # The guide
//!
//! [`guide::table`], [`guide::claim_forms`], [`guide::handlers`], [`guide::transactional`],
//! [`guide::retries`], [`guide::enqueueing`], [`guide::unique`], [`guide::periodic`],
//! [`guide::cancellation`], [`guide::order`], [`guide::batches`], [`guide::observability`],
//! [`guide::where_it_runs`], [`guide::guarantees`].

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings), allow(dead_code))))]

mod backend;
mod backoff;
mod config;
mod delivery;
mod dialect;
mod enqueue;
mod error;
mod form;
pub mod guide;
mod handler;
mod inspect;
mod queue;
mod runner;
mod table;

pub use backend::Backend;
pub use backoff::Backoff;
pub use config::{ByKey, Event, Isolation, RateLimit, SqliteMode};
pub use delivery::{Delivery, Outcome, Transactional, Tx};
pub use enqueue::{Cancellation, Enqueued, Job, Schema, UniqueJob};
pub use error::{Error, Result, SchemaError};
pub use inspect::Counts;
pub use queue::{Queue, state};
pub use runner::{Missed, Runner, Running, Schedule, ShutdownReport, Stats};
pub use table::{DeadLetter, Headers, PayloadType, Pooler, Table};

#[cfg(feature = "internals")]
#[doc(hidden)]
pub use dialect::internals;
