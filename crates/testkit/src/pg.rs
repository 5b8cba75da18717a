//! A PostgreSQL schema of its own for one test: the store tests run on PostgreSQL as on SQLite,
//! in parallel, each in a schema made for it and dropped after it.
//!
//! The server is `$TOOLWARDEN_TEST_POSTGRES_URL`, else the one `scripts/setup-test-deps.sh`
//! found or started (it writes its URL to `.test-deps/postgres-url`), else
//! `postgres://postgres@127.0.0.1:5432/test`. A test that cannot reach it fails, saying so:
//! nothing is skipped.

use std::sync::atomic::{AtomicU32, Ordering};

use postgres::{Client, NoTls};

/// The variable naming the test server.
pub const POSTGRES_URL_ENV: &str = "TOOLWARDEN_TEST_POSTGRES_URL";
/// The test server when the variable is not set.
pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The test server's URL: the variable, else what `scripts/setup-test-deps.sh` wrote to
/// `.test-deps/postgres-url`, else the default.
pub fn postgres_url() -> String {
    let written = || {
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.test-deps/postgres-url");
        std::fs::read_to_string(file)
            .ok()
            .map(|u| u.trim().to_owned())
    };
    std::env::var(POSTGRES_URL_ENV)
        .ok()
        .or_else(written)
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| DEFAULT_POSTGRES_URL.to_owned())
}

/// Runs `f` on a thread of its own (the blocking client must not run on an async runtime).
fn blocking<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("the PostgreSQL helper panicked"))
}

/// A connection to the test server (in no schema of a test's).
pub fn connect() -> Client {
    let url = postgres_url();
    blocking(|| Client::connect(&url, NoTls)).unwrap_or_else(|e| {
        panic!(
            "the PostgreSQL test server at {url} does not answer ({e}); run \
             scripts/setup-test-deps.sh, which starts one, and export the {POSTGRES_URL_ENV} it prints"
        )
    })
}

/// A schema made for one test and dropped (with everything in it) when this is dropped.
#[derive(Debug)]
pub struct TestSchema {
    name: String,
    url: String,
}

impl TestSchema {
    /// Makes a new, empty schema.
    pub fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        #[allow(
            clippy::disallowed_methods,
            reason = "the wall clock only makes the name unlike an earlier run's, not a timing"
        )]
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!(
            "tw_test_{}_{}_{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let base = postgres_url();
        let mut client = connect();
        blocking(|| client.batch_execute(&format!("CREATE SCHEMA {name}")))
            .expect("cannot create a test schema");
        blocking(move || drop(client));
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-csearch_path%3D{name}");
        TestSchema { name, url }
    }

    /// The URL of the test server with this schema first on the search path: what
    /// `store.url` is set to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `sql` in this schema and answers the first column of every row as text.
    pub fn query(&self, sql: &str) -> Vec<Option<String>> {
        let url = self.url.clone();
        blocking(|| {
            let mut client =
                Client::connect(&url, NoTls).expect("cannot connect to the test schema");
            let rows = client
                .simple_query(sql)
                .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
            rows.iter()
                .filter_map(|m| match m {
                    postgres::SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_owned)),
                    _ => None,
                })
                .collect()
        })
    }
}

impl Default for TestSchema {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let name = self.name.clone();
        let url = postgres_url();
        blocking(move || {
            if let Ok(mut client) = Client::connect(&url, NoTls) {
                let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"));
            }
        });
    }
}
