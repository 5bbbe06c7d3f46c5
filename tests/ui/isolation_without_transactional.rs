use sqlx_queue::{Isolation, Queue, Table};

fn main() {
    let _ = Queue::table(Table::new("jobs"))
        .lease("locked_until")
        .isolation(Isolation::RepeatableRead);
}
