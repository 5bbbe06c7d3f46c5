use sqlx::Sqlite;
use sqlx_queue::{Delivery, Outcome, Queue, Table};

async fn handle(_: Delivery<Sqlite>) -> Outcome {
    Outcome::ack()
}

fn main() {
    let _ = Queue::table(Table::new("jobs"))
        .lease("locked_until")
        .handler(handle)
        .transactional();
}
