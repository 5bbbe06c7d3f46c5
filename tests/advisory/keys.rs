//! The keys of a table's rows held on the server, and the sessions holding them.

use std::time::Duration;

use crate::support::{Ctx, TestDb, wait_for};

/// The 32-bit FNV-1a hash, the high half of a PostgreSQL key (docs/guide/claim_forms.md).
fn fnv1a_32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |hash: u32, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// The lock name of row `id` of table `t` (MySQL/MariaDB, SQL): `sqlxq:` and the MD5 of the
/// name when it is longer than 64 characters (docs/guide/claim_forms.md).
fn lock_name(t: &str) -> String {
    let name = format!("CONCAT(DATABASE(), '.', '{t}', ':', id)");
    format!("IF(CHAR_LENGTH({name}) > 64, CONCAT('sqlxq:', MD5({name})), {name})")
}

/// How many keys of table `t`'s rows, deleted ones among them, some session holds (SQLite: none
/// on a server).
pub(crate) async fn held<DB: TestDb>(ctx: &Ctx<DB>, t: &str) -> i64 {
    let sql = match DB::LABEL {
        "postgres" => format!(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND objsubid = 1 AND classid::bigint = {}",
            fnv1a_32(t)
        ),
        // Every id the table gave out, its deleted rows' too: a key left held after a drain
        // is a deleted row's.
        "mysql" => format!(
            "WITH RECURSIVE n (id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM n WHERE id < \
             (SELECT AUTO_INCREMENT - 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = \
             DATABASE() AND TABLE_NAME = '{t}')) SELECT COUNT(*) FROM n WHERE IS_USED_LOCK({}) \
             IS NOT NULL",
            lock_name(t)
        ),
        _ => return 0,
    };
    DB::count(&ctx.pool, &sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Ends, on the server, every session holding a key of table `t`'s rows: how many it ended.
pub(crate) async fn end_sessions<DB: TestDb>(ctx: &Ctx<DB>, t: &str) -> i64 {
    match DB::LABEL {
        "postgres" => {
            let sql = format!(
                "SELECT COUNT(pg_terminate_backend(p.pid)) FROM (SELECT DISTINCT pid \
                 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
                 AND classid::bigint = {}) AS p",
                fnv1a_32(t)
            );
            DB::count(&ctx.pool, &sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        }
        "mysql" => {
            let sql = format!(
                "SELECT COALESCE(MIN(IS_USED_LOCK({})), 0) FROM {t}",
                lock_name(t)
            );
            let holder = async || {
                DB::count(&ctx.pool, &sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
            };
            let mut ended = Vec::new();
            loop {
                let session = holder().await;
                if session == 0 {
                    return i64::try_from(ended.len()).unwrap();
                }
                if ended.contains(&session) {
                    // Killed, its locks not released yet.
                    wait_for(
                        "a killed session's locks released",
                        Duration::from_secs(10),
                        || async { holder().await != session },
                    )
                    .await;
                    continue;
                }
                ctx.exec(&format!("KILL {session}")).await;
                ended.push(session);
            }
        }
        _ => 0,
    }
}
