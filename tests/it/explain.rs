// The guide's index (`docs/guide/table.md`) serves the claim and the depth gauges' count: EXPLAIN on a 100,000-row
// table where most rows are processed or delayed.

use sqlx_queue::{Job, Table};

use crate::support::{Bind, Ctx, TestDb, TestRow as _};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(explain<$db>:
            the_claim_and_the_depth_use_the_readme_index_on_a_large_table,
        );
    };
}
pub(crate) use tests;

pub(crate) async fn the_claim_and_the_depth_use_the_readme_index_on_a_large_table<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let name = format!("explain_{}", crate::support::unique());
    let readme = include_str!("../../docs/guide/table.md");
    let marker = match DB::LABEL {
        "postgres" => "-- PostgreSQL",
        "mysql" => "-- MySQL",
        _ => "-- SQLite",
    };
    let block = &readme[readme.find(marker).expect("the guide's schema")..];
    let schema = block[..block.find("```").expect("the block ends")].replace("signup_jobs", &name);
    ctx.exec(&schema).await;

    // 100,000 rows: 90 % processed, 5 % delayed, the rest ready, in two groups.
    let table = Table::new(&name).group("queue").retry_after("retry_after");
    let payloads: Vec<String> = (0..10_000).map(|i| i.to_string()).collect();
    let hour = std::time::Duration::from_secs(3600);
    for round in 0..10 {
        let batch: Vec<Job<'_>> = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let job = Job::new(p).group(if i % 2 == 0 { "signups" } else { "other" });
                if round == 0 && i % 2 == 0 {
                    job.delay(hour)
                } else {
                    job
                }
            })
            .collect();
        DB::enqueue_many(&ctx.pool, &table, &batch).await.unwrap();
    }
    // Each finished row at a time of its own, as a queue's are: MariaDB estimates the rows of
    // one group and `processed_at IS NULL` from the distinct values of (queue, processed_at), and
    // with one time shared by 85,000 rows it takes half the table for them, and counts the
    // ready rows by a scan.
    ctx.exec(&match DB::LABEL {
        "postgres" => format!(
            "UPDATE {name} SET processed_at = now() - id * interval '1 second' \
             WHERE id > 10000 AND id <= 95000"
        ),
        "mysql" => format!(
            "UPDATE {name} SET processed_at = NOW(6) - INTERVAL id SECOND \
             WHERE id > 10000 AND id <= 95000"
        ),
        _ => format!(
            "UPDATE {name} SET processed_at = strftime('%Y-%m-%dT%H:%M:%f', 'now', -id || ' seconds') \
             WHERE id > 10000 AND id <= 95000"
        ),
    })
    .await;
    ctx.exec(&match DB::LABEL {
        "postgres" => format!("ANALYZE {name}"),
        "mysql" => format!("ANALYZE TABLE {name}"),
        _ => "ANALYZE".to_owned(),
    })
    .await;

    let table = table.processed_at("processed_at").created_at("created_at");
    use sqlx_queue::internals::{Database, Param, lease_claim, queue_depth};
    let database = match DB::LABEL {
        "postgres" => Database::Postgres,
        "mysql" => Database::MySql,
        _ => Database::Sqlite,
    };
    let claim = lease_claim(database, &table, Some("signups"), Some("attempt")).unwrap();
    // The depth gauges' statement (and `counts`' ready rows) reads through the same index.
    let depth = queue_depth(database, &table, Some("signups")).unwrap();
    for (what, statement) in [("claim", claim), ("depth", depth)] {
        let explain = match DB::LABEL {
            "sqlite" => format!("EXPLAIN QUERY PLAN {}", statement.sql),
            _ => format!("EXPLAIN {}", statement.sql),
        };
        let now = chrono::Utc::now();
        let binds: Vec<Bind<'_>> = statement
            .params
            .iter()
            .map(|param| match param {
                Param::Group => Bind::Text("signups"),
                Param::Limit => Bind::Int(8_i64),
                Param::Floor => Bind::Int(i64::MIN),
                _ => Bind::Time(now),
            })
            .collect();
        let rows = DB::rows(&ctx.pool, &explain, &binds).await.unwrap();
        let plan: Vec<String> = rows
            .iter()
            .map(|row| match DB::LABEL {
                "postgres" => row.text_at(0).unwrap(),
                "mysql" => row.text_or_null("key").unwrap().unwrap_or_default(),
                _ => row.text("detail").unwrap(),
            })
            .collect();
        let index = format!("{name}_claim");
        crate::support::report(&format!(
            "{}: the {what}'s plan on 100,000 rows: {}",
            DB::LABEL,
            plan.join(" | ")
        ));
        // MariaDB 10.11 plans the depth's count by the index or by a scan from one run to the
        // next here (7.5 % of the rows are one group's unfinished ones, near its crossover):
        // reported, not asserted.
        if what == "claim" || DB::LABEL != "mysql" {
            assert!(
                plan.iter().any(|line| line.contains(&index)),
                "the {what} uses {index}: {plan:#?}"
            );
        }
    }
    ctx.exec(&format!("DROP TABLE {name}")).await;
    ctx.drop_tables().await;
}
