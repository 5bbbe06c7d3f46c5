use sqlx_queue::{Queue, Table};

fn main() {
    let _ = Queue::table(Table::new("jobs"))
        .lease("locked_until")
        .transactional()
        .batch(16);
}
