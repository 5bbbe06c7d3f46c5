use sqlx::SqlitePool;
use sqlx_queue::{Job, Queue, Table};

async fn enqueue(pool: SqlitePool) {
    let queue = Queue::table(Table::new("jobs").unique_key("dedupe"));
    let _ = queue.enqueue_unique(&pool, Job::new("a").unique("k")).await;
}

fn main() {}
