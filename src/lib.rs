#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod backoff;
mod delivery;
mod dialect;
mod enqueue;
mod error;
mod form;
mod inspect;
mod queue;
mod runner;
mod table;

#[doc(hidden)]
pub mod private;

pub use backend::Backend;
pub use backoff::{Backoff, backoff};
pub use delivery::{Delivery, IntoOutcome, Outcome, Tx};
pub use enqueue::Job;
pub use error::{Error, Result, SchemaError};
pub use inspect::{Counts, Inspect};
pub use queue::state::{Plain, Transactional};
pub use queue::{DEFAULT_LEASE, Event, Isolation, MAX_WORKERS, Queue, SqliteMode, state};
pub use runner::{
    DEFAULT_POLL_INTERVAL, DEFAULT_SHUTDOWN_TIMEOUT, Runner, Running, ShutdownReport, Stats,
};
pub use table::{DeadLetter, PayloadType, Table};
