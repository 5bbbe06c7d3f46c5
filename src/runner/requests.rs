//! Cancel requests for the deliveries in work of a queue whose table has their table
//! ([`Table::cancel_requests`](crate::Table::cancel_requests)): the row lock and advisory lock
//! forms hold their rows where a cancellation cannot touch them, so it records a request, which
//! the runner reads every poll interval for its deliveries in work — and on PostgreSQL is
//! notified of at once (the table's channel, relayed by `notify`). A lease queue listening on
//! its table's channel is notified of its jobs cancelled in work too (their leases taken away).
//! A requested delivery's [`cancelled`](crate::Delivery::cancelled) fires — each of a batch's
//! alone; when its handler returns, whatever it returns, its transaction's writes roll back and
//! its row is removed (`deliver`, `batch`), and the request with it; a row claimed ahead that is
//! cancelled before it starts never starts (`ahead`). Requests that name no unfinished row (a
//! runner died between a row's removal and its request's) are swept.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sqlx::Pool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::backend::{self, Backend};
use crate::config::QueueConfig;
use crate::delivery::Cancel;
use crate::dialect::{self, Args, Names, REQUESTED_IDS, RequestSql, SWEPT, Stmt};
use crate::error::{Error, Result};

/// A queue's deliveries in work (and, the lease form, rows claimed ahead of their workers), by
/// row id, and its table's request statements (none when the table has no cancel requests'
/// table: then nothing is read). Kept where requests are read or cancellations notified (a
/// queue listening on its table's channel); elsewhere each entry is its delivery's alone.
#[derive(Debug)]
pub(super) struct Requests {
    table: Box<str>,
    sql: Option<RequestSql>,
    /// Whether deliveries in work are kept here: requests are read, or notified.
    kept: bool,
    in_work: Mutex<HashMap<i64, Arc<InWork>>>,
    /// Told when a notification cancelled an entry (rows claimed ahead are looked over).
    pub(super) changed: Notify,
}

/// One delivery in work: its cancellation, and whether a request caused it.
#[derive(Debug)]
pub(super) struct InWork {
    pub(super) token: Cancel,
    requested: AtomicBool,
}

impl InWork {
    /// Whether the delivery's job was cancelled by a request (or, the lease form, a notified
    /// cancellation).
    pub(super) fn requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    fn request(&self) {
        self.requested.store(true, Ordering::Release);
        self.token.cancel();
    }
}

/// The queues notified of requests in this process, by table name as their config gives it.
static NOTIFIED: Mutex<Vec<(Box<str>, Weak<Requests>)>> = Mutex::new(Vec::new());

impl Requests {
    /// The requests of a queue of `config`; registered for notifications where it reads them or
    /// listens on its table's channel.
    pub(super) fn new<DB: Backend>(config: &QueueConfig) -> Arc<Self> {
        let sql = Names::of_queue(DB::DIALECT, config)
            .ok()
            .and_then(|names| dialect::cancel_requests(&names));
        let kept = sql.is_some() || config.listen_notify;
        let requests = Arc::new(Requests {
            table: config.table.name.as_str().into(),
            sql,
            kept,
            in_work: Mutex::new(HashMap::new()),
            changed: Notify::new(),
        });
        if kept {
            let mut notified = NOTIFIED.lock().unwrap_or_else(|e| e.into_inner());
            notified.retain(|(_, queue)| queue.strong_count() > 0);
            notified.push((requests.table.clone(), Arc::downgrade(&requests)));
        }
        requests
    }

    /// Whether the queue reads requests.
    pub(super) fn read(&self) -> bool {
        self.sql.is_some()
    }

    /// Enters row `id` in work until the guard is dropped (where the queue keeps its deliveries:
    /// elsewhere the entry is the delivery's alone).
    pub(super) fn enter(self: &Arc<Self>, id: i64) -> Entered {
        self.enter_with(id, Cancel::default())
    }

    /// [`enter`](Self::enter), with the delivery's cancellation made by the caller (a batch's
    /// deliveries share one allocation).
    pub(super) fn enter_with(self: &Arc<Self>, id: i64, token: Cancel) -> Entered {
        let work = InWork {
            token,
            requested: AtomicBool::new(false),
        };
        let entry = match self.kept {
            true => {
                let entry = Arc::new(work);
                self.lock().insert(id, Arc::clone(&entry));
                Entry::Kept(entry, Arc::clone(self))
            }
            // The delivery's alone: no allocation of its own.
            false => Entry::Own(work),
        };
        Entered { id, entry }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Arc<InWork>>> {
        self.in_work.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Cancels delivery `id` by request, if it is in work here.
    fn requested(&self, id: i64) {
        if let Some(entry) = self.lock().get(&id) {
            tracing::info!(id, "cancel requested for a delivery in work");
            entry.request();
            self.changed.notify_one();
        }
    }

    /// Removes the request of row `id` once its delivery ended.
    pub(super) async fn forget<DB: Backend>(&self, pool: &Pool<DB>, id: i64) {
        let Some(sql) = &self.sql else { return };
        let args = Args {
            id,
            ..Args::default()
        };
        let forgot = async {
            let mut conn = pool.acquire().await?;
            DB::execute(&mut conn, bound::<DB>(&sql.forget, &args)).await
        };
        if let Err(error) = forgot.await {
            tracing::warn!(%error, id, "could not remove a cancel request");
        }
    }
}

/// A row's entry in its queue's deliveries in work, until dropped.
#[derive(Debug)]
pub(super) struct Entered {
    id: i64,
    pub(super) entry: Entry,
}

/// An entry in work: shared with the queue's map where the queue keeps its deliveries (with the
/// map, to leave it when dropped), else the delivery's own.
#[derive(Debug)]
pub(super) enum Entry {
    Kept(Arc<InWork>, Arc<Requests>),
    Own(InWork),
}

impl std::ops::Deref for Entry {
    type Target = InWork;

    fn deref(&self) -> &InWork {
        match self {
            Entry::Kept(entry, _) => entry,
            Entry::Own(entry) => entry,
        }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Entry::Kept(kept, requests) = &self.entry {
            let mut in_work = requests.lock();
            // A later claim of the row (settled, then claimed again) may have entered it anew.
            if in_work
                .get(&self.id)
                .is_some_and(|entry| Arc::ptr_eq(entry, kept))
            {
                in_work.remove(&self.id);
            }
        }
    }
}

/// A notification on a table's channel: `true` when it was a cancel request (relayed to the
/// queues of `table` in this process), `false` for a wake-up.
pub(super) fn notified(table: &str, payload: &str) -> bool {
    let Some(id) = payload.strip_prefix(dialect::CANCEL_NOTICE) else {
        return false;
    };
    let Ok(id) = id.parse::<i64>() else {
        return true;
    };
    let notified = NOTIFIED.lock().unwrap_or_else(|e| e.into_inner());
    for (name, queue) in notified.iter() {
        if **name == *table
            && let Some(queue) = queue.upgrade()
        {
            queue.requested(id);
        }
    }
    true
}

/// Reads the requests for the queue's deliveries in work every `every` until `stop`; sweeps the
/// requests that name no unfinished row at start and every [`SWEEP_EVERY`] reads.
pub(super) async fn watch<DB: Backend>(
    requests: Arc<Requests>,
    pool: Pool<DB>,
    every: Duration,
    stop: CancellationToken,
) {
    let Some(sql) = &requests.sql else { return };
    let mut reads = 0_u32;
    loop {
        if reads.is_multiple_of(SWEEP_EVERY) {
            sweep::<DB>(&pool, sql).await;
        }
        reads = reads.wrapping_add(1);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let ids: Vec<i64> = requests.lock().keys().copied().collect();
        for chunk in ids.chunks(usize::from(REQUESTED_IDS)) {
            match read::<DB>(&pool, &sql.requested, chunk).await {
                Ok(found) => found.into_iter().for_each(|id| requests.requested(id)),
                Err(error) => tracing::warn!(%error, "could not read cancel requests"),
            }
        }
    }
}

/// How many reads of requests (poll intervals) apart the sweeps of requests naming no row are.
const SWEEP_EVERY: u32 = 60;

/// At most this many sweeps in a row, while each removes as many as one may.
const SWEEPS: u32 = 10;

/// Removes the requests that name no unfinished row: a runner that died between a row's removal
/// and its request's left them. One statement per [`SWEPT`] requests (MySQL/MariaDB: a read,
/// then removals by id), a few at most.
async fn sweep<DB: Backend>(pool: &Pool<DB>, sql: &RequestSql) {
    for _ in 0..SWEEPS {
        let swept = async {
            let mut conn = pool.acquire().await?;
            let Some(by_ids) = &sql.sweep_ids else {
                return DB::execute(&mut conn, bound::<DB>(&sql.sweep, &Args::default())).await;
            };
            let query = bound::<DB>(&sql.sweep, &Args::default());
            let ids = backend::fetch_i64s::<DB>(&mut conn, query).await?;
            for chunk in ids.chunks(usize::from(REQUESTED_IDS)) {
                let args = Args {
                    ids: chunk,
                    ..Args::default()
                };
                DB::execute(&mut conn, bound::<DB>(by_ids, &args)).await?;
            }
            Ok(ids.len() as u64)
        };
        match swept.await {
            Ok(swept) if swept > 0 => {
                tracing::info!(swept, "removed cancel requests that name no unfinished row");
                if swept < SWEPT {
                    return;
                }
            }
            Ok(_) => return,
            Err(error) => {
                tracing::warn!(%error, "could not sweep cancel requests naming no row");
                return;
            }
        }
    }
}

/// Refuses a queue whose cancel requests' table cannot be read, before any claim.
pub(super) async fn check<DB: Backend>(pool: &Pool<DB>, config: &QueueConfig) -> Result<()> {
    let Some(sql) = Names::of_queue(DB::DIALECT, config)
        .ok()
        .and_then(|names| dialect::cancel_requests(&names))
    else {
        return Ok(());
    };
    read::<DB>(pool, &sql.requested, &[0])
        .await
        .map(drop)
        .map_err(|error| {
            let table = config.table.cancel_requests.as_deref().unwrap_or_default();
            Error::schema(
                config.label(),
                table,
                Some("id"),
                format!("the cancel requests' table cannot be read: {error}"),
            )
            .with_fix(
                dialect::schema::requests_table(DB::DIALECT, table)
                    .ok()
                    .map(|sql| format!("{sql};")),
            )
        })
}

async fn read<DB: Backend>(pool: &Pool<DB>, stmt: &Stmt, ids: &[i64]) -> sqlx::Result<Vec<i64>> {
    let args = Args {
        ids,
        ..Args::default()
    };
    let mut conn = pool.acquire().await?;
    backend::fetch_i64s::<DB>(&mut conn, bound::<DB>(stmt, &args)).await
}

fn bound<DB: Backend>(stmt: &Stmt, args: &Args<'_>) -> backend::Q<DB> {
    backend::query::<DB>(stmt.sql(), stmt.values(args)).persistent(!stmt.unprepared)
}
