use sqlx::{PgPool, Sqlite};
use sqlx_queue::{Delivery, Outcome, Queue, Runner, Table};

async fn handle(_: Delivery<Sqlite>) -> Outcome {
    Outcome::ack()
}

fn mount(pool: PgPool) {
    let queue = Queue::table(Table::new("jobs")).lease("locked_until").handler(handle);
    let _ = Runner::new(pool).mount(queue);
}

fn main() {}
