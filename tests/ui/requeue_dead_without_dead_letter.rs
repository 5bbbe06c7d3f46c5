use sqlx::SqlitePool;
use sqlx_queue::{Queue, Table};

async fn requeue(pool: SqlitePool) {
    let queue = Queue::table(Table::new("jobs")).lease("locked_until").attempt("attempt");
    let _ = queue.requeue_dead(&pool).await;
}

fn main() {}
