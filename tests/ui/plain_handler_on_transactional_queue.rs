use sqlx::{Sqlite, SqlitePool};
use sqlx_queue::{Delivery, Outcome, Queue, Runner, Table};

async fn handle(_: Delivery<Sqlite>) -> Outcome {
    Outcome::ack()
}

fn mount(pool: SqlitePool) {
    let queue = Queue::table(Table::new("jobs"))
        .lease("locked_until")
        .transactional()
        .handler(handle);
    let _ = Runner::new(pool).mount(queue);
}

fn main() {
    let _ = mount;
}
