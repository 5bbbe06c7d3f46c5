//! Headers round-trip on each claim form and each column type the role takes, through single
//! and bulk enqueues, beside jobs without headers.

use std::collections::BTreeMap;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::sync::mpsc;

use crate::support::{Ctx, Form, Spec, TestDb, TestRow as _, recv};
use crate::{Map, awkward, column_types, read, table_with_headers, with};

pub(crate) async fn headers_round_trip_on_every_column_type<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    for ty in column_types::<DB>() {
        let t = table_with_headers(&mut ctx, Spec::lease(), ty).await;
        let jobs = Table::new(&t).retry_after("retry_after").headers("headers");
        let all = awkward();
        let one: Map = [("k".to_owned(), "v".to_owned())].into();
        let mut want = BTreeMap::new();
        let id = DB::enqueue(&ctx.pool, &jobs, with(Job::new("all"), &all))
            .await
            .unwrap();
        want.insert(id, all.clone());
        let id = DB::enqueue(&ctx.pool, &jobs, Job::new("none"))
            .await
            .unwrap();
        want.insert(id, Map::new());
        // Bulk: a job with headers, one without, one with another set.
        let bulk = [
            with(Job::new("bulk all"), &all),
            Job::new("bulk none"),
            with(Job::new("bulk one"), &one),
        ];
        assert_eq!(DB::enqueue_many(&ctx.pool, &jobs, &bulk).await.unwrap(), 3);
        let ids = DB::rows(&ctx.pool, &format!("SELECT id FROM {t} ORDER BY id"), &[])
            .await
            .unwrap();
        let ids: Vec<i64> = ids.iter().map(|row| row.int("id").unwrap()).collect();
        assert_eq!(ids.len(), 5, "{ty}");
        want.insert(ids[2], all.clone());
        want.insert(ids[3], Map::new());
        want.insert(ids[4], one.clone());

        let (tx, mut seen) = mpsc::unbounded_channel();
        let queue = F::apply(Queue::table(jobs.clone()))
            .attempt("attempt")
            .workers(2)
            .handler(move |d: Delivery<DB>| {
                let _ = tx.send((d.id(), read(&d), d.header("traceparent").map(str::to_owned)));
                async { Outcome::ack() }
            });
        let running = Runner::new(ctx.pool.clone())
            .mount(queue)
            .start()
            .await
            .unwrap_or_else(|e| panic!("{ty}: {e}"));
        let mut got = BTreeMap::new();
        for _ in 0..want.len() {
            let (id, headers, traceparent) = recv(&mut seen, "a delivery", 30).await;
            assert_eq!(
                traceparent.as_deref(),
                headers.get("traceparent").map(String::as_str)
            );
            got.insert(id, headers);
        }
        running.shutdown().await.unwrap();
        for (id, want) in &want {
            assert_eq!(got.get(id), Some(want), "{} {ty}: row {id}", F::NAME);
        }
        assert_eq!(ctx.count(&t, "1 = 1").await, 0, "every row acked");
    }
    ctx.drop_tables().await;
}
