use sqlx::Sqlite;
use sqlx_queue::{Delivery, Outcome, Queue, Table};

async fn handle(batch: Vec<Delivery<Sqlite>>) -> Vec<Outcome> {
    batch.iter().map(|_| Outcome::ack()).collect()
}

fn main() {
    let _ = Queue::table(Table::new("jobs"))
        .lease("locked_until")
        .transactional()
        .batch_handler(handle);
}
