//! The price of the `metrics` feature: drains without a recorder and with one, alternately.

use metrics_exporter_prometheus::PrometheusBuilder;
use sqlx_queue::{Delivery, Outcome, Queue, Runner, Table};

use crate::drain::{BenchDb, QUEUE, cpu_ticks, drain, fill, table_name, url};
use crate::{Options, median_best};

pub(crate) async fn run(options: &Options) {
    if !cfg!(feature = "metrics") {
        eprintln!("cost: built without the `metrics` feature: the runner records nothing");
    }
    println!(
        "| database | side | jobs/s median (best) | ÷ plain median (best) | client CPU ms per \
         1,000 jobs (median) |"
    );
    println!("|---|---|---:|---:|---:|");
    for db in &options.dbs {
        match db.as_str() {
            "postgres" | "pg" => database::<sqlx::Postgres>(options).await,
            "sqlite" => database::<sqlx::Sqlite>(options).await,
            other => eprintln!("cost: unknown database {other}: skipped"),
        }
    }
}

async fn database<DB: BenchDb>(options: &Options) {
    let Some(url) = url::<DB>() else { return };
    let size = u32::try_from(options.workers + 2).expect("a pool size");
    let pool = DB::connect(&url, size).await.expect("a pool");
    let name = table_name();
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let mut rates: Vec<(String, Vec<f64>)> = options
        .sides
        .iter()
        .map(|s| (s.clone(), Vec::new()))
        .collect();
    let mut cpu_ms: std::collections::HashMap<String, Vec<f64>> = Default::default();
    for round in 1..=options.rounds {
        // A B, then B A: a drift of the machine's load over a round weighs on both sides alike.
        let order: Vec<usize> = match round % 2 {
            1 => (0..rates.len()).collect(),
            _ => (0..rates.len()).rev().collect(),
        };
        for i in order {
            let (side, samples) = &mut rates[i];
            // `created`: the creation time read, no recorder; `metered`: the recorder, no
            // creation time; `recorded`: both.
            let created = side == "recorded" || side == "created";
            let recorded = side == "recorded" || side == "metered";
            fill::<DB>(&pool, &name, 100, options.rows)
                .await
                .expect("a filled table");
            let mut table = Table::new(name.as_str()).group("queue");
            if created {
                table = table.created_at("created_at");
            }
            let queue = Queue::table(table)
                .named(QUEUE)
                .lease("locked_until")
                .attempt("attempt")
                .workers(options.workers)
                .handler(|_: Delivery<DB>| std::future::ready(Outcome::ack()));
            let runner = Runner::new(pool.clone()).mount(queue);
            let with = recorded.then_some(&recorder as &dyn metrics::Recorder);
            let cpu = cpu_ticks();
            match drain(&pool, &name, runner, options.rows, options.cap, with).await {
                Ok(rate) => {
                    // Client CPU per 1,000 jobs (ticks of 10 ms), steadier than the rate on a
                    // shared machine.
                    let ms = cpu.zip(cpu_ticks()).map_or(f64::NAN, |(a, b)| {
                        (b - a) as f64 * 10.0 * 1000.0 / options.rows as f64
                    });
                    eprintln!(
                        "cost {} round {round} {side}: {rate:.0} jobs/s, {ms:.1} ms CPU per 1,000",
                        DB::ID
                    );
                    samples.push(rate);
                    cpu_ms.entry(side.clone()).or_default().push(ms);
                }
                Err(e) => eprintln!("cost {} round {round} {side}: FAILED {e}", DB::ID),
            }
        }
    }
    let plain = rates
        .iter()
        .find(|(side, _)| side == "plain")
        .map(|(_, samples)| median_best(samples));
    let plain_samples = rates
        .iter()
        .find(|(side, _)| side == "plain")
        .map(|(_, samples)| samples.clone());
    for (side, samples) in &rates {
        let (median, best) = median_best(samples);
        // The median of each round's own ratio (its two drains ran side by side), and best ÷
        // best.
        let ratio = match (plain, &plain_samples) {
            (Some((_, pb)), Some(base)) if base.len() == samples.len() => {
                let each: Vec<f64> = samples.iter().zip(base).map(|(s, b)| s / b).collect();
                format!("{:.3}x ({:.3}x)", median_best(&each).0, best / pb)
            }
            _ => "—".to_owned(),
        };
        let cpu = cpu_ms.get(side).map_or(f64::NAN, |ms| median_best(ms).0);
        println!(
            "| {} | {side} | {median:.0} ({best:.0}) | {ratio} | {cpu:.1} |",
            DB::ID
        );
    }
    let text = handle.render();
    let started = text
        .lines()
        .find(|l| l.starts_with("sqlx_queue_deliveries_started_total"))
        .unwrap_or("sqlx_queue_deliveries_started_total: none recorded");
    eprintln!("cost {}: the recorder read {started}", DB::ID);
    let _ = DB::exec(&pool, format!("DROP TABLE IF EXISTS {name}")).await;
    pool.close().await;
    if DB::URL_VAR.is_none() {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{url}{suffix}"));
        }
    }
}
