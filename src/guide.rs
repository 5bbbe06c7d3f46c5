//! The guide: one page per question a user of job queues asks, each starting with code.
//!
//! | page | the question |
//! |---|---|
//! | [`table`] | How do I create the queue table? (the roles, the DDL per database) |
//! | [`claim_forms`] | Which claim form should I use? (lease, row lock, advisory lock; declaring a queue) |
//! | [`handlers`] | What can a handler take and return? (JSON payloads, rows, statements of your own) |
//! | [`transactional`] | How do I commit a handler's writes together with its job? |
//! | [`retries`] | What happens when a handler fails or panics, and how do I cap its retries? |
//! | [`enqueueing`] | How do I enqueue a job, in my own transaction? (bulk, delays, priorities) |
//! | [`unique`] | How do I make sure a job is queued once per key? |
//! | [`periodic`] | How do I run a job every minute, or every night at 2:30? |
//! | [`cancellation`] | How do I cancel a job, queued or running? |
//! | [`order`] | How do I run a tenant's jobs in order, or limit how many run at once? (FIFO, per group, per key, rate) |
//! | [`batches`] | How do I handle many jobs in one call? |
//! | [`observability`] | How do I watch a queue, and keep its table small? (metrics, headers, queue age, pruning, PostgreSQL vacuum) |
//! | [`where_it_runs`] | Does it run on my database, behind PgBouncer, on CockroachDB? |
//! | [`guarantees`] | What is guaranteed when a process crashes or the database restarts? |
//!
//! Every page's Rust code is a doctest; the queue table's and the unique key's SQL blocks
//! ([`table`], [`unique`]) are run by the crate's tests on PostgreSQL, MySQL/MariaDB and SQLite. The examples (`examples/`, listed in its `README.md`)
//! run on SQLite without a server: `cargo run --example quickstart`.

#[doc = include_str!("../docs/guide/table.md")]
pub mod table {}

#[doc = include_str!("../docs/guide/claim_forms.md")]
pub mod claim_forms {}

#[doc = include_str!("../docs/guide/handlers.md")]
pub mod handlers {}

#[doc = include_str!("../docs/guide/transactional.md")]
pub mod transactional {}

#[doc = include_str!("../docs/guide/retries.md")]
pub mod retries {}

#[doc = include_str!("../docs/guide/enqueueing.md")]
pub mod enqueueing {}

#[doc = include_str!("../docs/guide/unique.md")]
pub mod unique {}

#[doc = include_str!("../docs/guide/periodic.md")]
pub mod periodic {}

#[doc = include_str!("../docs/guide/cancellation.md")]
pub mod cancellation {}

#[doc = include_str!("../docs/guide/order.md")]
pub mod order {}

#[doc = include_str!("../docs/guide/batches.md")]
pub mod batches {}

#[doc = include_str!("../docs/guide/observability.md")]
pub mod observability {}

#[doc = include_str!("../docs/guide/where_it_runs.md")]
pub mod where_it_runs {}

#[doc = include_str!("../docs/guide/guarantees.md")]
pub mod guarantees {}
