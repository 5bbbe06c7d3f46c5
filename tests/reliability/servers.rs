//! Dedicated database servers that the restart scenario may stop and start: the shared servers
//! on 5432 and 3306 serve other tests at the same time and are never restarted.
//!
//! - PostgreSQL: the cluster `sqlxq_restart` of the installed major version, on port 5433, with
//!   trust authentication (`pg_createcluster .. -- --auth=trust`; `pg_ctlcluster` starts and
//!   stops it). Its log is `/var/log/postgresql/postgresql-<version>-sqlxq_restart.log`.
//! - MariaDB: a second `mariadbd` with its own data directory (`/var/lib/sqlxq_restart_mariadb`,
//!   made by `mariadb-install-db`), on port 3307 and the socket
//!   `/tmp/sqlxq_restart_mariadb.sock`, run as root; its log is `error.log` in the data directory.
//!
//! Each is created and started when missing (this needs root, as CI and the development machine
//! run), and left running for the next run.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use sqlx::Connection as _;
use tokio::time::Instant;

const PG_CLUSTER: &str = "sqlxq_restart";
const PG_PORT: u16 = 5433;
const MARIADB_DIR: &str = "/var/lib/sqlxq_restart_mariadb";
const MARIADB_SOCKET: &str = "/tmp/sqlxq_restart_mariadb.sock";
const MARIADB_PORT: u16 = 3307;
const MARIADBD: &str = "/usr/sbin/mariadbd";

/// A server of our own.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dedicated {
    Postgres,
    MariaDb,
}

impl Dedicated {
    pub(crate) fn url(self) -> String {
        match self {
            Dedicated::Postgres => format!("postgres://postgres@127.0.0.1:{PG_PORT}/postgres"),
            Dedicated::MariaDb => format!("mysql://root@127.0.0.1:{MARIADB_PORT}/test"),
        }
    }

    /// Creates the server if it does not exist and starts it if it is down; `Err` says why it
    /// cannot be done on this machine.
    pub(crate) async fn ensure_up(self) -> Result<(), String> {
        match self {
            Dedicated::Postgres => {
                let version = pg_version()?;
                if !Path::new(&format!("/etc/postgresql/{version}/{PG_CLUSTER}")).exists() {
                    let port = PG_PORT.to_string();
                    run(
                        "pg_createcluster",
                        &[&version, PG_CLUSTER, "--port", &port, "--", "--auth=trust"],
                    )?;
                }
            }
            Dedicated::MariaDb => {
                if !Path::new(MARIADBD).exists() {
                    return Err(format!("{MARIADBD} is not installed"));
                }
                if !Path::new(MARIADB_DIR).join("mysql").exists() {
                    let datadir = format!("--datadir={MARIADB_DIR}");
                    run(
                        "mariadb-install-db",
                        &[
                            "--no-defaults",
                            &datadir,
                            "--auth-root-authentication-method=normal",
                            "--user=root",
                            "--skip-test-db",
                        ],
                    )?;
                }
            }
        }
        if !self.answers().await {
            self.start().await?;
        }
        if let Dedicated::MariaDb = self {
            let root = format!("mysql://root@127.0.0.1:{MARIADB_PORT}/mysql");
            let mut conn = sqlx::MySqlConnection::connect(&root)
                .await
                .map_err(|e| format!("MariaDB on {MARIADB_PORT}: {e}"))?;
            sqlx::raw_sql("CREATE DATABASE IF NOT EXISTS test")
                .execute(&mut conn)
                .await
                .map_err(|e| format!("MariaDB on {MARIADB_PORT}: {e}"))?;
        }
        Ok(())
    }

    /// Whether the server accepts a connection and answers a query now.
    async fn answers(self) -> bool {
        let ping = async {
            match self {
                Dedicated::Postgres => {
                    let mut conn = sqlx::PgConnection::connect(&self.url()).await?;
                    sqlx::raw_sql("SELECT 1").execute(&mut conn).await?;
                    conn.close().await
                }
                Dedicated::MariaDb => {
                    let url = format!("mysql://root@127.0.0.1:{MARIADB_PORT}/mysql");
                    let mut conn = sqlx::MySqlConnection::connect(&url).await?;
                    sqlx::raw_sql("SELECT 1").execute(&mut conn).await?;
                    conn.close().await
                }
            }
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(5), ping).await,
            Ok(Ok(()))
        )
    }

    /// Stops the server and waits until it is down.
    pub(crate) async fn stop(self) -> Result<(), String> {
        match self {
            Dedicated::Postgres => {
                let version = pg_version()?;
                // Fast shutdown: sessions are ended, their transactions rolled back.
                run_async(
                    "pg_ctlcluster",
                    &["--skip-systemctl-redirect", &version, PG_CLUSTER, "stop"],
                )
                .await
            }
            Dedicated::MariaDb => {
                let port = MARIADB_PORT.to_string();
                run_async(
                    "mariadb-admin",
                    &["-h", "127.0.0.1", "-P", &port, "-u", "root", "shutdown"],
                )
                .await?;
                // `shutdown` returns at once; the server removes its pid file when it is down.
                let pid_file = Path::new(MARIADB_DIR).join("mariadbd.pid");
                let deadline = Instant::now() + Duration::from_secs(60);
                while pid_file.exists() {
                    if Instant::now() > deadline {
                        return Err("MariaDB on 3307 did not stop within 60 s".to_owned());
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(())
            }
        }
    }

    /// Starts the server and waits (at most 60 s) until it answers.
    pub(crate) async fn start(self) -> Result<(), String> {
        let (program, args) = self.launcher()?;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_async(program, &args).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.answers().await {
            if Instant::now() > deadline {
                return Err(format!("{self:?} did not come up within 60 s"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// The command that starts the server (and returns once it started, or forked).
    fn launcher(self) -> Result<(&'static str, Vec<String>), String> {
        Ok(match self {
            Dedicated::Postgres => (
                "pg_ctlcluster",
                vec![
                    "--skip-systemctl-redirect".to_owned(),
                    pg_version()?,
                    PG_CLUSTER.to_owned(),
                    "start".to_owned(),
                ],
            ),
            // `setsid -f`: the server is nobody's child here, so it outlives the test run and
            // never lingers as a zombie of it.
            Dedicated::MariaDb => (
                "setsid",
                vec![
                    "-f".to_owned(),
                    MARIADBD.to_owned(),
                    "--no-defaults".to_owned(),
                    format!("--datadir={MARIADB_DIR}"),
                    format!("--port={MARIADB_PORT}"),
                    format!("--socket={MARIADB_SOCKET}"),
                    "--bind-address=127.0.0.1".to_owned(),
                    "--user=root".to_owned(),
                    format!("--pid-file={MARIADB_DIR}/mariadbd.pid"),
                    format!("--log-error={MARIADB_DIR}/error.log"),
                    "--innodb-buffer-pool-size=64M".to_owned(),
                ],
            ),
        })
    }
}

/// Keeps a stopped server's promise to come back: starts it again when dropped, unless
/// `restored` was called (a test that fails while the server is down still restores it).
pub(crate) struct Restore(Option<Dedicated>);

impl Restore {
    pub(crate) fn new(server: Dedicated) -> Self {
        Restore(Some(server))
    }

    pub(crate) fn restored(mut self) {
        self.0 = None;
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        let Some(server) = self.0.take() else { return };
        let started = server.launcher().and_then(|(program, args)| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run(program, &args)
        });
        if let Err(error) = started {
            eprintln!("could not start {server:?} again: {error}");
        }
    }
}

/// The installed PostgreSQL major version (the first under `/etc/postgresql`).
fn pg_version() -> Result<String, String> {
    let mut versions: Vec<String> = std::fs::read_dir("/etc/postgresql")
        .map_err(|e| format!("no PostgreSQL installation in /etc/postgresql: {e}"))?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .collect();
    versions.sort();
    versions
        .into_iter()
        .next()
        .ok_or_else(|| "no PostgreSQL version under /etc/postgresql".to_owned())
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}\n{}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

async fn run_async(program: &str, args: &[&str]) -> Result<(), String> {
    let output = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("{program}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}
