use sqlx_queue::{Queue, Table};

fn main() {
    let _ = Queue::table(Table::new("jobs"))
        .lease("locked_until")
        .max_attempts(5);
}
