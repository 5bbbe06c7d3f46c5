use sqlx::{Sqlite, SqlitePool};
use sqlx_queue::{Delivery, Isolation, Outcome, Queue, Runner, Table, Transactional};

async fn handle(_: Delivery<Sqlite, Transactional>) -> Outcome {
    Outcome::ack()
}

fn mount(pool: SqlitePool) {
    let queue = Queue::table(Table::new("jobs"))
        .lease("locked_until")
        .transactional()
        .isolation(Isolation::Serializable)
        .handler(handle);
    let _ = Runner::new(pool).mount(queue);
}

fn main() {}
