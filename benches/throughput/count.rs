//! Statements and round trips of a counted drain, on the client.
//!
//! - Statements: sqlx reports each statement it runs as a `tracing` event of target
//!   `sqlx::query`, one per execution; a layer counts them. Pools of a counted drain keep
//!   sqlx's statement logging on, the others turn it off (building the event costs the client
//!   a few microseconds: counted drains are not timed).
//! - Round trips: on PostgreSQL and MySQL/MariaDB, counted on the wire by a proxy the counted
//!   pools connect through (`wire.rs`); on SQLite, which has no wire, the statements.
//!
//! PostgreSQL's `pg_stat_statements` would count on the server, but it needs
//! `shared_preload_libraries`, which a shared server does not get without a restart.

use std::sync::atomic::{AtomicU64, Ordering};

use tracing::Subscriber;

use crate::wire;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::{Context, SubscriberExt as _};

static STATEMENTS: AtomicU64 = AtomicU64::new(0);

/// Counts each event it is given.
#[derive(Debug)]
struct CountStatements;

impl<S: Subscriber> Layer<S> for CountStatements {
    fn on_event(&self, _event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        STATEMENTS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Installs the process's subscriber: the statement count, and with `RUST_LOG` set, the log
/// it asks for (the crate's warnings, for diagnosis) on standard error. Every other callsite
/// stays disabled, so the crate's spans cost what they cost without a subscriber. The log
/// layer is not added at all without `RUST_LOG`: an absent layer (`Option::None`) declares
/// interest in every callsite, which had enabled the crate's `batch` and `delivery` spans in
/// every timed drain — and sqlx enters the current span at each row it reads.
pub(crate) fn install() {
    let counting = CountStatements.with_filter(
        Targets::new().with_target("sqlx::query", tracing::level_filters::LevelFilter::TRACE),
    );
    let registry = tracing_subscriber::registry().with(counting);
    let installed = match std::env::var_os("RUST_LOG") {
        Some(_) => tracing::subscriber::set_global_default(
            registry.with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_filter(EnvFilter::from_default_env()),
            ),
        ),
        None => tracing::subscriber::set_global_default(registry),
    };
    installed.expect("one subscriber");
}

/// What a counted drain sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Counts {
    pub(crate) statements: u64,
    pub(crate) round_trips: u64,
}

/// The statements and round trips sent while it is open (one drain at a time runs in the
/// process).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    statements: u64,
    /// Round trips on the wire so far, when the pool goes through the proxy.
    round_trips: Option<u64>,
}

impl Window {
    /// `on_wire`: the drain's pool connects through the proxy.
    pub(crate) fn open(on_wire: bool) -> Self {
        Window {
            statements: STATEMENTS.load(Ordering::Relaxed),
            round_trips: on_wire.then(wire::round_trips),
        }
    }

    pub(crate) fn close(self) -> Counts {
        let statements = STATEMENTS.load(Ordering::Relaxed) - self.statements;
        Counts {
            statements,
            round_trips: self
                .round_trips
                .map_or(statements, |start| wire::round_trips() - start),
        }
    }
}
