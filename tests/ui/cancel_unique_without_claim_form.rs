use sqlx::SqlitePool;
use sqlx_queue::{Queue, Table};

async fn cancel(pool: SqlitePool) {
    let queue = Queue::table(Table::new("jobs").unique_key("dedupe"));
    let _ = queue.cancel_unique(&pool, "k").await;
}

fn main() {}
