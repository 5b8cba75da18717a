//! `pg`: the audit trail on PostgreSQL beside SQLite and no store — store off, SQLite with
//! `before_execution`, PostgreSQL with `before_execution` and with `async` — measured side by side
//! as `speed` measures (see [`crate::speed::compare`]). PostgreSQL is
//! `$TOOLWARDEN_TEST_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`); the run
//! makes a schema of its own there and drops it at the end.

use std::path::Path;

use anyhow::{Context, Result, bail};
use tokio::process::Command;

use crate::speed::compare;

pub(crate) async fn pg(dir: &Path, tmp: &Path, rounds: usize, calls: usize) -> Result<()> {
    let base = std::env::var("TOOLWARDEN_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!("tw_bench_{}", std::process::id());
    psql(&base, &format!("CREATE SCHEMA {schema}")).await?;
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-csearch_path%3D{schema}");
    let modes: Vec<(String, String)> = vec![
        ("store off".into(), "enabled = false".into()),
        (
            "SQLite, before_execution".into(),
            format!(
                "path = {:?}\ndurability = \"before_execution\"",
                tmp.join("before.db").display().to_string()
            ),
        ),
        (
            "PostgreSQL, before_execution".into(),
            format!("url = {url:?}\ndurability = \"before_execution\""),
        ),
        (
            "PostgreSQL, async".into(),
            format!("url = {url:?}\ndurability = \"async\""),
        ),
    ];
    let result = compare(dir, tmp, &modes, rounds, calls).await;
    let dropped = psql(&base, &format!("DROP SCHEMA {schema} CASCADE")).await;
    result.and(dropped.map(drop))
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
