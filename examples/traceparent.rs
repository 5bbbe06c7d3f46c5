//! One trace from the request that enqueues a job to the handler that runs it: the enqueuing
//! span's W3C trace context travels in the job's `traceparent` header (`Job::header`), and the
//! handler's span takes it as its parent (`Delivery::header`), through OpenTelemetry's
//! `TraceContextPropagator` and `tracing-opentelemetry`. On SQLite, no server; it prints both
//! spans' trace ids, checks that they are one, and exits.
//!
//! Run it with `cargo run --example traceparent`. A real service would give the tracer provider
//! an exporter (OTLP, say); this one keeps its spans in the process.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{TraceContextExt as _, TraceId, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx_queue::state::Lease;
use sqlx_queue::{Delivery, Headers, Job, Outcome, Queue, Runner, Table};
use tokio::sync::mpsc;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;

/// A delivery's headers as OpenTelemetry's propagators read them.
struct FromHeaders<'a>(&'a Headers);

impl Extractor for FromHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(key, _)| key).collect()
    }
}

/// The trace the current span belongs to.
fn current_trace() -> TraceId {
    tracing::Span::current()
        .context()
        .span()
        .span_context()
        .trace_id()
}

/// The "request": a span of its own, whose trace context the job carries in its headers.
async fn signup(
    pool: &sqlx::SqlitePool,
    jobs: &Queue<Lease>,
    email: &str,
) -> sqlx_queue::Result<TraceId> {
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&tracing::Span::current().context(), &mut carrier);
    let mut job = Job::new(email);
    for (key, value) in &carrier {
        job = job.header(key.as_str(), value.as_str()); // `traceparent` (and `tracestate`)
    }
    jobs.enqueue(pool, job).await?;
    let trace = current_trace();
    println!("request: enqueued {email} in trace {trace}");
    Ok(trace)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Spans get OpenTelemetry ids (sampled by the default, parent-based always-on sampler).
    let provider = SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("traceparent-example")));
    tracing::subscriber::set_global_default(subscriber)?;

    let file =
        std::env::temp_dir().join(format!("sqlx-queue-traceparent-{}.db", std::process::id()));
    let options = SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    let pool = SqlitePoolOptions::new().connect_with(options).await?;
    // The queue table has a headers column (a JSON object of strings; `TEXT` on SQLite).
    let jobs = Queue::table(Table::new("signup_jobs").headers("headers")).lease("locked_until");
    jobs.schema::<Sqlite>()?.create(&pool).await?;

    let request = tracing::info_span!("POST /signup");
    let enqueued = signup(&pool, &jobs, "alice@example.com")
        .instrument(request)
        .await?;

    // The handler continues the job's trace: its span's parent is the enqueuing span.
    let (tx, mut handled) = mpsc::unbounded_channel();
    let queue = jobs.handler(move |d: Delivery<Sqlite>| {
        let span = tracing::info_span!("welcome email", id = d.id());
        let parent = TraceContextPropagator::new().extract(&FromHeaders(d.headers()));
        if let Err(error) = span.set_parent(parent) {
            eprintln!("the handler's span could not take the job's trace: {error}");
        }
        let tx = tx.clone();
        async move {
            let trace = current_trace();
            println!(
                "handler: row {} (traceparent {:?}) runs in trace {trace}",
                d.id(),
                d.header("traceparent").unwrap_or_default()
            );
            let _ = tx.send(trace);
            Outcome::ack()
        }
        .instrument(span)
    });
    let running = Runner::new(pool.clone()).mount(queue).start().await?;
    let ran = tokio::time::timeout(Duration::from_secs(10), handled.recv())
        .await
        .map_err(|_| "the job was not handled within 10 s")?
        .ok_or("the handler's channel closed")?;
    running.shutdown().await?;
    pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    provider.shutdown()?;

    assert_ne!(enqueued, TraceId::INVALID, "the request span has a trace");
    assert_eq!(ran, enqueued, "the handler runs in the request's trace");
    println!("one trace, request -> job: {enqueued}");
    Ok(())
}
