use sqlx::SqlitePool;
use sqlx_queue::{Queue, Table};

async fn cancel(pool: SqlitePool) {
    let queue = Queue::table(Table::new("jobs"));
    let _ = queue.cancel(&pool, 1).await;
}

fn main() {}
