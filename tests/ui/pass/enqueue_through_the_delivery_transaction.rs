use sqlx::{Sqlite, SqlitePool};
use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table, Transactional};

async fn write(mut d: Delivery<Sqlite, Transactional>) -> Outcome {
    let written = sqlx::query("INSERT INTO accounts (email) VALUES ('a')")
        .execute(&mut *d.tx())
        .await;
    if written.is_err() {
        return Outcome::retry();
    }
    let welcome = Queue::table(Table::new("welcome_jobs"));
    match welcome.enqueue(&mut *d.tx(), Job::new("a")).await {
        Ok(_) => Outcome::ack(),
        Err(_) => Outcome::retry(),
    }
}

fn mount(pool: SqlitePool) {
    let queue = Queue::table(Table::new("signup_jobs"))
        .lease("locked_until")
        .transactional()
        .handler(write);
    let _ = Runner::new(pool).mount(queue);
}

fn main() {}
