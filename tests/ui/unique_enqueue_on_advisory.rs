use sqlx::SqlitePool;
use sqlx_queue::{Job, Queue, Table};

async fn enqueue(pool: SqlitePool) {
    let jobs = Queue::table(Table::new("jobs").unique_key("dedupe")).advisory_lock();
    let _ = jobs.enqueue_unique(&pool, Job::new("x").unique("k").replace()).await;
}

fn main() {}
