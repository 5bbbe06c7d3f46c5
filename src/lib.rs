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
