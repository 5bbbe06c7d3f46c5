#![doc = include_str!("../README.md")]
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
mod handler;
mod inspect;
mod queue;
mod runner;
mod table;

pub use backend::Backend;
pub use backoff::{Backoff, backoff};
pub use config::{DEFAULT_LEASE, Event, Isolation, MAX_WORKERS, SqliteMode};
pub use delivery::{Delivery, Mode, Outcome, Plain, Transactional, TransactionalMode, Tx};
pub use enqueue::{Cancellation, Enqueued, Job, OnDuplicate, Schema, UniqueJob};
pub use error::{Error, Result, SchemaError};
#[cfg(feature = "json")]
pub use handler::JsonHandler;
pub use handler::{BatchHandler, Handler, IntoOutcome, Mount, RowHandler};
pub use inspect::Counts;
pub use queue::{Queue, state};
pub use runner::{
    DEFAULT_POLL_INTERVAL, DEFAULT_SCHEDULES_TABLE, DEFAULT_SHUTDOWN_TIMEOUT, Missed, Runner,
    Running, Schedule, ShutdownReport, Stats,
};
pub use table::{DeadLetter, Headers, PayloadType, Pooler, Table};

#[cfg(feature = "internals")]
#[doc(hidden)]
pub use dialect::internals;
