use super::*;

/// The guide's declaration (`docs/guide/table.md`): every role, a lease, an attempt count.
fn readme() -> Table {
    Table::new("signup_jobs")
        .group("queue")
        .retry_after("retry_after")
        .processed_at("processed_at")
        .created_at("created_at")
        .lease("locked_until")
}

fn render(dialect: Dialect, plan: &Plan) -> Vec<String> {
    plan.render(dialect)
        .unwrap()
        .into_iter()
        .map(|c| c.sql)
        .collect()
}

fn one(
    dialect: Dialect,
    table: &Table,
    attempt: Option<&str>,
    dead: Option<&DeadLetter>,
) -> Vec<String> {
    let mut plan = Plan::default();
    plan.queue(table, attempt, dead).unwrap();
    render(dialect, &plan)
}

#[test]
fn the_readme_table_on_postgres() {
    assert_eq!(
        one(Dialect::Postgres, &readme(), Some("attempt"), None),
        [
            "CREATE TABLE IF NOT EXISTS \"signup_jobs\" (\n    \"id\"           BIGSERIAL PRIMARY KEY,\n    \"queue\"        TEXT NOT NULL,\n    \"payload\"      BYTEA NOT NULL,\n    \"attempt\"      INT NOT NULL DEFAULT 1,\n    \"locked_until\" TIMESTAMPTZ,\n    \"retry_after\"  TIMESTAMPTZ,\n    \"processed_at\" TIMESTAMPTZ,\n    \"created_at\"   TIMESTAMPTZ NOT NULL DEFAULT now()\n)",
            "CREATE INDEX IF NOT EXISTS \"signup_jobs_claim\" ON \"signup_jobs\" (\"queue\", \"id\") WHERE \"processed_at\" IS NULL",
        ]
    );
}

#[test]
fn the_readme_table_on_mysql() {
    assert_eq!(
        one(Dialect::MySql, &readme(), Some("attempt"), None),
        [
            "CREATE TABLE IF NOT EXISTS `signup_jobs` (\n    `id`           BIGINT AUTO_INCREMENT PRIMARY KEY,\n    `queue`        VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,\n    `payload`      LONGBLOB NOT NULL,\n    `attempt`      INT NOT NULL DEFAULT 1,\n    `locked_until` DATETIME(6),\n    `retry_after`  DATETIME(6),\n    `processed_at` DATETIME(6),\n    `created_at`   DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),\n    INDEX `signup_jobs_claim` (`queue`, `processed_at`, `id`)\n) DEFAULT CHARSET=utf8mb4"
        ]
    );
}

#[test]
fn the_readme_table_on_sqlite() {
    assert_eq!(
        one(Dialect::Sqlite, &readme(), Some("attempt"), None),
        [
            "CREATE TABLE IF NOT EXISTS `signup_jobs` (\n    `id`           INTEGER PRIMARY KEY AUTOINCREMENT,\n    `queue`        TEXT NOT NULL,\n    `payload`      BLOB NOT NULL,\n    `attempt`      INTEGER NOT NULL DEFAULT 1,\n    `locked_until` TEXT,\n    `retry_after`  TEXT,\n    `processed_at` TEXT,\n    `created_at`   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))\n)",
            "CREATE INDEX IF NOT EXISTS `signup_jobs_claim` ON `signup_jobs` (`queue`, `id`) WHERE `processed_at` IS NULL",
        ]
    );
}

#[test]
fn a_bare_table_has_no_index_beyond_its_key() {
    let sql = one(Dialect::Postgres, &Table::new("jobs"), None, None);
    assert_eq!(
        sql,
        [
            "CREATE TABLE IF NOT EXISTS \"jobs\" (\n    \"id\"      BIGSERIAL PRIMARY KEY,\n    \"payload\" BYTEA NOT NULL\n)"
        ]
    );
}

#[test]
fn payload_types_per_database() {
    let cases = [
        (
            PayloadType::Text,
            ["TEXT NOT NULL", "LONGTEXT NOT NULL", "TEXT NOT NULL"],
        ),
        (
            PayloadType::Json,
            ["JSON NOT NULL", "JSON NOT NULL", "TEXT NOT NULL"],
        ),
        (
            PayloadType::Jsonb,
            ["JSONB NOT NULL", "JSON NOT NULL", "TEXT NOT NULL"],
        ),
    ];
    for (ty, defs) in cases {
        let table = Table::new("jobs").payload("body").payload_type(ty);
        for (dialect, def) in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite]
            .into_iter()
            .zip(defs)
        {
            let sql = one(dialect, &table, None, None).remove(0);
            assert!(
                sql.contains(&format!(
                    "body{} {def}\n",
                    if dialect == Dialect::Postgres {
                        "\""
                    } else {
                        "`"
                    }
                )),
                "{sql}"
            );
        }
    }
}

#[test]
fn unique_key_priority_headers_and_the_claim_index() {
    let table = Table::new("jobs")
        .group("queue")
        .priority("priority")
        .retry_after("retry_after")
        .processed_at("done_at")
        .headers("headers")
        .unique_key("dedupe");
    assert_eq!(
        one(Dialect::Postgres, &table, None, None),
        [
            "CREATE TABLE IF NOT EXISTS \"jobs\" (\n    \"id\"          BIGSERIAL PRIMARY KEY,\n    \"queue\"       TEXT NOT NULL,\n    \"payload\"     BYTEA NOT NULL,\n    \"priority\"    BIGINT NOT NULL DEFAULT 0,\n    \"retry_after\" TIMESTAMPTZ,\n    \"done_at\"     TIMESTAMPTZ,\n    \"headers\"     JSONB,\n    \"dedupe\"      TEXT\n)",
            "CREATE INDEX IF NOT EXISTS \"jobs_claim\" ON \"jobs\" (\"queue\", \"priority\", \"retry_after\", \"id\") WHERE \"done_at\" IS NULL",
            "CREATE UNIQUE INDEX IF NOT EXISTS \"jobs_dedupe\" ON \"jobs\" (\"dedupe\") WHERE \"done_at\" IS NULL",
        ]
    );
    assert_eq!(
        one(Dialect::MySql, &table, None, None),
        [
            "CREATE TABLE IF NOT EXISTS `jobs` (\n    `id`          BIGINT AUTO_INCREMENT PRIMARY KEY,\n    `queue`       VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,\n    `payload`     LONGBLOB NOT NULL,\n    `priority`    BIGINT NOT NULL DEFAULT 0,\n    `retry_after` DATETIME(6),\n    `done_at`     DATETIME(6),\n    `headers`     JSON,\n    `dedupe`      VARCHAR(255) COLLATE utf8mb4_bin NULL,\n    INDEX `jobs_claim` (`queue`, `done_at`, `priority`, `retry_after`, `id`),\n    UNIQUE INDEX `jobs_dedupe` (`dedupe`)\n) DEFAULT CHARSET=utf8mb4"
        ]
    );
    let sqlite = one(
        Dialect::Sqlite,
        &Table::new("jobs").unique_key("dedupe"),
        None,
        None,
    );
    assert_eq!(
        sqlite[1],
        "CREATE UNIQUE INDEX IF NOT EXISTS `jobs_dedupe` ON `jobs` (`dedupe`)"
    );
}

#[test]
fn qualified_names_index_the_bare_name() {
    let table = Table::new("work.jobs").group("queue");
    let pg = one(Dialect::Postgres, &table, None, None);
    assert!(
        pg[0].starts_with("CREATE TABLE IF NOT EXISTS \"work\".\"jobs\" ("),
        "{}",
        pg[0]
    );
    assert_eq!(
        pg[1],
        "CREATE INDEX IF NOT EXISTS \"jobs_claim\" ON \"work\".\"jobs\" (\"queue\", \"id\")"
    );
    let lite = one(
        Dialect::Sqlite,
        &Table::new("main.jobs").group("queue"),
        None,
        None,
    );
    assert_eq!(
        lite[1],
        "CREATE INDEX IF NOT EXISTS `main`.`jobs_claim` ON `jobs` (`queue`, `id`)"
    );
}

#[test]
fn dead_letters_requests_limits_and_schedules() {
    let table = Table::new("jobs")
        .retry_after("retry_after")
        .cancel_requests("job_cancels")
        .limits("job_limits")
        .lease("locked_until");
    let dead = DeadLetter::table("jobs_dead");
    let mut plan = Plan::default();
    plan.queue(&table, Some("attempt"), Some(&dead)).unwrap();
    plan.schedules("sqlx_queue_schedules").unwrap();
    let sql = render(Dialect::Sqlite, &plan);
    assert_eq!(
        sql,
        [
            "CREATE TABLE IF NOT EXISTS `jobs` (\n    `id`           INTEGER PRIMARY KEY AUTOINCREMENT,\n    `payload`      BLOB NOT NULL,\n    `attempt`      INTEGER NOT NULL DEFAULT 1,\n    `locked_until` TEXT,\n    `retry_after`  TEXT\n)",
            "CREATE TABLE IF NOT EXISTS `jobs_dead` (\n    `id`           INTEGER PRIMARY KEY AUTOINCREMENT,\n    `payload`      BLOB NOT NULL,\n    `attempt`      INTEGER NOT NULL DEFAULT 1,\n    `locked_until` TEXT,\n    `retry_after`  TEXT\n)",
            "CREATE TABLE IF NOT EXISTS `job_cancels` (\n    `id` INTEGER PRIMARY KEY\n)",
            "CREATE TABLE IF NOT EXISTS `job_limits` (\n    `name`        TEXT PRIMARY KEY,\n    `tokens`      REAL NOT NULL,\n    `refilled_at` REAL NOT NULL,\n    `granted`     INTEGER NOT NULL\n)",
            "CREATE TABLE IF NOT EXISTS `sqlx_queue_schedules` (\n    `name`      TEXT PRIMARY KEY,\n    `last_tick` TEXT NOT NULL\n)",
        ]
    );
    assert_eq!(
        limits_table(Dialect::Postgres, "job_limits").unwrap(),
        "CREATE TABLE IF NOT EXISTS \"job_limits\" (\n    \"name\"        TEXT PRIMARY KEY,\n    \"tokens\"      DOUBLE PRECISION NOT NULL,\n    \"refilled_at\" DOUBLE PRECISION NOT NULL,\n    \"granted\"     BIGINT NOT NULL\n)"
    );
    assert_eq!(
        schedules_table(Dialect::MySql, "s").unwrap(),
        "CREATE TABLE IF NOT EXISTS `s` (\n    `name`      VARCHAR(255) COLLATE utf8mb4_bin PRIMARY KEY,\n    `last_tick` DATETIME(6) NOT NULL\n) DEFAULT CHARSET=utf8mb4"
    );
    assert_eq!(
        requests_table(Dialect::Postgres, "c").unwrap(),
        "CREATE TABLE IF NOT EXISTS \"c\" (\n    \"id\" BIGINT PRIMARY KEY\n)"
    );
}

#[test]
fn two_queues_on_one_table_make_one_table_of_their_roles() {
    let mut plan = Plan::default();
    let base = Table::new("jobs").group("queue");
    plan.queue(
        &base.clone().retry_after("retry_after"),
        None,
        Some(&DeadLetter::group("dead")),
    )
    .unwrap();
    plan.queue(&base.clone().lease("locked_until"), Some("attempt"), None)
        .unwrap();
    let sql = render(Dialect::Postgres, &plan);
    assert_eq!(sql.len(), 2, "{sql:?}");
    assert_eq!(
        sql[0],
        "CREATE TABLE IF NOT EXISTS \"jobs\" (\n    \"id\"           BIGSERIAL PRIMARY KEY,\n    \"queue\"        TEXT NOT NULL,\n    \"payload\"      BYTEA NOT NULL,\n    \"attempt\"      INT NOT NULL DEFAULT 1,\n    \"locked_until\" TIMESTAMPTZ,\n    \"retry_after\"  TIMESTAMPTZ\n)"
    );
    // A column in two roles of different types cannot be one column.
    let clash = Table::new("jobs").group("queue").priority("queue");
    assert!(matches!(
        Plan::default().queue(&clash, None, None),
        Err(Error::Declaration { .. })
    ));
}

#[test]
fn bad_names_are_identifier_errors() {
    let mut plan = Plan::default();
    assert!(matches!(
        plan.queue(&Table::new("jobs; DROP TABLE x"), None, None),
        Err(Error::Identifier { .. })
    ));
    let mut plan = Plan::default();
    plan.queue(&Table::new("jobs").group("a\"b"), None, None)
        .unwrap();
    assert!(matches!(
        plan.render(Dialect::Postgres),
        Err(Error::Identifier { .. })
    ));
}

#[test]
fn fixes_for_a_missing_table_column_and_index() {
    let mut plan = Plan::default();
    plan.queue(&readme(), Some("attempt"), None).unwrap();
    let fix = fix_for(Dialect::Postgres, &plan, "signup_jobs").unwrap();
    assert!(
        fix.starts_with("CREATE TABLE IF NOT EXISTS \"signup_jobs\" ("),
        "{fix}"
    );
    assert!(fix.ends_with("WHERE \"processed_at\" IS NULL;"), "{fix}");
    assert_eq!(
        add_column(Dialect::MySql, &plan, "signup_jobs", "ATTEMPT").unwrap(),
        "ALTER TABLE `signup_jobs` ADD COLUMN `attempt` INT NOT NULL DEFAULT 1;"
    );
    assert_eq!(
        add_column(Dialect::Sqlite, &plan, "signup_jobs", "created_at"),
        None
    );
    let table = readme().unique_key("dedupe");
    assert_eq!(
        unique_index(Dialect::Postgres, &table).unwrap(),
        "CREATE UNIQUE INDEX IF NOT EXISTS \"signup_jobs_dedupe\" ON \"signup_jobs\" (\"dedupe\") WHERE \"processed_at\" IS NULL;"
    );
    assert_eq!(
        unique_index(Dialect::MySql, &table).unwrap(),
        "ALTER TABLE `signup_jobs` ADD UNIQUE INDEX `signup_jobs_dedupe` (`dedupe`);"
    );
}
