use std::time::Duration;

use sqlx::SqlitePool;
use sqlx_queue::{Queue, Table};

async fn prune(pool: SqlitePool) {
    let queue = Queue::table(Table::new("jobs")).lease("locked_until");
    let _ = queue.prune_dead(&pool, Duration::from_secs(60), 100).await;
}

fn main() {}
