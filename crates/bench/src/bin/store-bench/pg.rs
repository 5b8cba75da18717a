//! `pg`: the audit trail on PostgreSQL beside SQLite and no store — store off, SQLite with
//! `before_execution`, PostgreSQL with `before_execution` (as toolwarden sets its writer's
//! session up, and with `synchronous_commit = on` forced through the URL: every commit flushed to
//! disk) and with `async` — measured side by side as `speed` measures (see
//! [`crate::speed::compare`]). PostgreSQL is `$TOOLWARDEN_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); each PostgreSQL configuration gets a schema of its
//! own there, new as a new deployment's trail, dropped at the end. With `$STORE_BENCH_BASELINE` naming a `toolwarden` binary of another build, its
//! PostgreSQL `before_execution` is measured in the same rounds (a before/after comparison).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use tokio::process::Command;

use crate::speed::{Mode, compare};

/// A schema of the run's own in the test database, and the URL that writes there.
pub(crate) struct PgSchema {
    base: String,
    schema: String,
    pub(crate) url: String,
}

impl PgSchema {
    /// A schema of the run's own, made now.
    pub(crate) async fn create() -> Result<PgSchema> {
        let schema = PgSchema::named(&format!("tw_bench_{}", std::process::id()));
        schema.make().await?;
        Ok(schema)
    }

    /// The schema `name` (not made yet: [`PgSchema::make`]).
    fn named(name: &str) -> PgSchema {
        let base = std::env::var("TOOLWARDEN_TEST_POSTGRES_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-csearch_path%3D{name}");
        PgSchema {
            base,
            schema: name.to_owned(),
            url,
        }
    }

    async fn make(&self) -> Result<()> {
        psql(&self.base, &format!("CREATE SCHEMA {}", self.schema))
            .await
            .map(drop)
    }

    pub(crate) async fn drop(self) -> Result<()> {
        psql(&self.base, &format!("DROP SCHEMA {} CASCADE", self.schema))
            .await
            .map(drop)
    }
}

pub(crate) async fn pg(dir: &Path, tmp: &Path, rounds: usize, calls: usize) -> Result<()> {
    // Each PostgreSQL configuration has a trail of its own, new as a new deployment's.
    let mut schemas = Vec::new();
    let mut trail = || -> Result<String> {
        let n = schemas.len();
        schemas.push(PgSchema::named(&format!(
            "tw_bench_{}_{n}",
            std::process::id()
        )));
        Ok(schemas[n].url.clone())
    };
    let before = |url: String| format!("url = {url:?}\ndurability = \"before_execution\"");
    let mut modes: Vec<Mode> = vec![
        Mode::new("store off", "enabled = false".into()),
        Mode::new(
            "SQLite, before_execution",
            format!(
                "path = {:?}\ndurability = \"before_execution\"",
                tmp.join("before.db").display().to_string()
            ),
        ),
        Mode::new("PostgreSQL, before_execution", before(trail()?)),
        Mode::new(
            "PostgreSQL, before_execution, every commit flushed",
            before(format!("{}%20-csynchronous_commit%3Don", trail()?)),
        ),
        Mode::new(
            "PostgreSQL, async",
            format!("url = {:?}\ndurability = \"async\"", trail()?),
        ),
    ];
    if let Some(baseline) = std::env::var_os("STORE_BENCH_BASELINE") {
        let mut mode = Mode::new(
            "baseline build: PostgreSQL, before_execution",
            before(trail()?),
        );
        mode.binary = Some(PathBuf::from(baseline));
        modes.push(mode);
    }
    let mut made = Ok(());
    for schema in &schemas {
        made = made.and(schema.make().await);
    }
    let result = match made {
        Ok(()) => compare(dir, tmp, &modes, rounds, calls).await,
        Err(e) => Err(e),
    };
    let mut dropped = Ok(());
    for schema in schemas {
        dropped = dropped.and(schema.drop().await);
    }
    result.and(dropped)
}

/// Runs `sql` with `psql` against `url`; its output.
async fn psql(url: &str, sql: &str) -> Result<String> {
    let out = Command::new("psql")
        .arg(url)
        .arg("-Atqc")
        .arg(sql)
        .output()
        .await
        .context("psql")?;
    if !out.status.success() {
        bail!("psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
