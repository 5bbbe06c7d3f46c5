use sqlx::SqlitePool;
use sqlx_queue::{Queue, Runner, Table};

fn mount(pool: SqlitePool) {
    let queue = Queue::table(Table::new("jobs")).lease("locked_until");
    let _ = Runner::new(pool).mount(queue);
}

fn main() {}
