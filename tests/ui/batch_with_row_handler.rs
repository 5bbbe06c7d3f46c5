use sqlx::Sqlite;
use sqlx::sqlite::SqliteRow;
use sqlx_queue::{Delivery, Outcome, Queue, Table};

struct Email;

impl sqlx::FromRow<'_, SqliteRow> for Email {
    fn from_row(_: &SqliteRow) -> sqlx::Result<Self> {
        Ok(Email)
    }
}

async fn handle(_: Email, _: Delivery<Sqlite>) -> Outcome {
    Outcome::ack()
}

fn main() {
    // A row handler takes one row at a time: a batched queue takes a batch handler.
    let _ = Queue::table(Table::new("jobs"))
        .lease("locked_until")
        .batch(16)
        .row_handler(handle);
}
