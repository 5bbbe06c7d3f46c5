use sqlx::{PgPool, Postgres};
use sqlx_queue::{Delivery, Outcome, Queue, Runner, SqliteMode, Table, Transactional};

async fn handle(_: Delivery<Postgres, Transactional>) -> Outcome {
    Outcome::ack()
}

fn mount(pool: PgPool) {
    let queue = Queue::table(Table::new("jobs"))
        .lease("locked_until")
        .transactional()
        .isolation(SqliteMode::Immediate)
        .handler(handle);
    let _ = Runner::new(pool).mount(queue);
}

fn main() {}
