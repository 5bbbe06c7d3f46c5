use sqlx::Sqlite;
use sqlx_queue::{Delivery, Outcome};

async fn handle(mut d: Delivery<Sqlite>) -> Outcome {
    let _ = sqlx::query("INSERT INTO accounts (email) VALUES ('a')")
        .execute(&mut *d.tx())
        .await;
    Outcome::ack()
}

fn main() {
    let _ = handle;
}
