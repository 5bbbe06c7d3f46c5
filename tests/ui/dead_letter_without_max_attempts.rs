use sqlx_queue::{DeadLetter, Queue, Table};

fn main() {
    let _ = Queue::table(Table::new("jobs"))
        .lease("locked_until")
        .attempt("attempt")
        .dead_letter(DeadLetter::table("jobs_dead"));
}
