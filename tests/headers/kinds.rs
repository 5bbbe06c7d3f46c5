//! Headers reach every kind of delivery (batch, transactional and row mode, on every claim form),
//! and unique jobs carry them (a replace replaces them with the payload).

use std::collections::BTreeMap;

use sqlx_queue::{Delivery, Enqueued, Job, Outcome, Queue, Runner, Table, Transactional};
use tokio::sync::mpsc;

use crate::support::{Ctx, Form, Spec, TestDb, TestRow, recv};
use crate::{Map, awkward, column_types, read, table_with_headers, with};

/// A lease table with headers (of the database's first column type), a job with every awkward
/// header and one without; the table, its description and the headers by id.
async fn two_jobs<DB: TestDb>(ctx: &mut Ctx<DB>) -> (String, Table, BTreeMap<i64, Map>) {
    let t = table_with_headers(ctx, Spec::lease(), column_types::<DB>()[0]).await;
    let jobs = Table::new(&t).headers("headers");
    let all = awkward();
    let mut want = BTreeMap::new();
    let id = DB::enqueue(&ctx.pool, &jobs, with(Job::new("a"), &all))
        .await
        .unwrap();
    want.insert(id, all);
    let id = DB::enqueue(&ctx.pool, &jobs, Job::new("b")).await.unwrap();
    want.insert(id, Map::new());
    (t, jobs, want)
}

async fn collect(seen: &mut mpsc::UnboundedReceiver<(i64, Map)>, n: usize) -> BTreeMap<i64, Map> {
    let mut got = BTreeMap::new();
    for _ in 0..n {
        let (id, headers) = recv(seen, "a delivery", 30).await;
        got.insert(id, headers);
    }
    got
}

pub(crate) async fn batch_deliveries_carry_their_headers<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, jobs, want) = two_jobs(&mut ctx).await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue =
        F::apply(Queue::table(jobs))
            .batch(10)
            .batch_handler(move |ds: Vec<Delivery<DB>>| {
                for d in &ds {
                    let _ = tx.send((d.id(), read(d)));
                }
                let n = ds.len();
                async move { vec![Outcome::ack(); n] }
            });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    let got = collect(&mut seen, want.len()).await;
    running.shutdown().await.unwrap();
    assert_eq!(got, want);
    ctx.wait_none(&t, "1 = 1", 10).await;
    ctx.drop_tables().await;
}

pub(crate) async fn transactional_deliveries_carry_their_headers<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, jobs, want) = two_jobs(&mut ctx).await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(jobs)).transactional().handler(
        move |d: Delivery<DB, Transactional>| {
            let _ = tx.send((d.id(), read(&d)));
            async { Outcome::ack() }
        },
    );
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    let got = collect(&mut seen, want.len()).await;
    running.shutdown().await.unwrap();
    assert_eq!(got, want);
    ctx.wait_none(&t, "1 = 1", 10).await;
    ctx.drop_tables().await;
}

/// The service's own row type, reading the id alone.
struct Row {
    id: i64,
}

impl<R: TestRow> sqlx::FromRow<'_, R> for Row {
    fn from_row(row: &R) -> sqlx::Result<Self> {
        Ok(Row { id: row.int("id")? })
    }
}

pub(crate) async fn row_mode_deliveries_carry_their_headers<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, jobs, want) = two_jobs(&mut ctx).await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(jobs)).row_handler(move |row: Row, d: Delivery<DB>| {
        assert_eq!(row.id, d.id());
        let _ = tx.send((row.id, read(&d)));
        async { Outcome::ack() }
    });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    let got = collect(&mut seen, want.len()).await;
    running.shutdown().await.unwrap();
    assert_eq!(got, want);
    ctx.wait_none(&t, "1 = 1", 10).await;
    ctx.drop_tables().await;
}

pub(crate) async fn unique_jobs_carry_their_headers_and_a_replace_replaces_them<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = table_with_headers(&mut ctx, Spec::lease(), column_types::<DB>()[0]).await;
    ctx.exec(&format!("ALTER TABLE {t} ADD COLUMN dedupe {}", DB::TEXT))
        .await;
    ctx.exec(&format!("CREATE UNIQUE INDEX {t}_dedupe ON {t} (dedupe)"))
        .await;
    let jobs =
        Queue::table(Table::new(&t).headers("headers").unique_key("dedupe")).lease("locked_until");
    let all = awkward();
    let first = jobs
        .enqueue_unique(&ctx.pool, Job::new("1").header("old", "1").unique("k"))
        .await
        .unwrap();
    let Enqueued::New(k) = first else {
        panic!("{first:?}")
    };
    let replaced = jobs
        .enqueue_unique(&ctx.pool, with(Job::new("2"), &all).unique("k").replace())
        .await
        .unwrap();
    assert_eq!(replaced, Enqueued::Replaced(k));
    let many = [
        Job::new("3").header("n", "3").unique("m"),
        Job::new("4").unique("o"),
    ];
    let done = jobs.enqueue_many_unique(&ctx.pool, &many).await.unwrap();
    let [Enqueued::New(m), Enqueued::New(o)] = done[..] else {
        panic!("{done:?}")
    };
    let want: BTreeMap<i64, Map> = [
        (k, all),
        (m, [("n".to_owned(), "3".to_owned())].into()),
        (o, Map::new()),
    ]
    .into();

    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = jobs.handler(move |d: Delivery<DB>| {
        let _ = tx.send((d.id(), read(&d)));
        async { Outcome::ack() }
    });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    let got = collect(&mut seen, want.len()).await;
    running.shutdown().await.unwrap();
    assert_eq!(got, want, "the replace took the new job's headers");
    ctx.drop_tables().await;
}
