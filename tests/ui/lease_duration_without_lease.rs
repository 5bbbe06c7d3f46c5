use std::time::Duration;

use sqlx_queue::{Queue, Table};

fn main() {
    let _ = Queue::table(Table::new("jobs"))
        .row_lock()
        .lease_duration(Duration::from_secs(60));
}
