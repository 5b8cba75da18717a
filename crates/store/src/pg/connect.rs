//! Connecting to PostgreSQL: the parsed URL, this replica's lock, and the rule that the blocking
//! client never runs on an async runtime's thread.

use std::time::Duration;

use postgres::{Client, NoTls};

use super::schema;
use crate::OpenError;

/// How long connecting may take before the attempt fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `f` on a thread of its own: the blocking client must not run on an async runtime's
/// thread.
pub(crate) fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(f)
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// `url` without its password, to name the database in messages: a URL's password (which may
/// itself hold `@`) and its `password` parameter are left out, as is a `password=` pair of a
/// key-value connection string.
pub fn shown_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url
            .split_whitespace()
            .filter(|pair| !pair.starts_with("password="))
            .collect::<Vec<_>>()
            .join(" ");
    };
    let (rest, query) = match rest.rsplit_once('?') {
        Some((rest, query)) if !query.contains('@') => (rest, Some(query)),
        _ => (rest, None),
    };
    let rest = match rest.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split_once(':').map_or(user, |(u, _)| u);
            format!("{user}@{host}")
        }
        None => rest.to_owned(),
    };
    let query: Vec<&str> = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|pair| !pair.starts_with("password="))
        .collect();
    if query.is_empty() {
        format!("{scheme}://{rest}")
    } else {
        format!("{scheme}://{rest}?{}", query.join("&"))
    }
}

/// A PostgreSQL error with its causes: the client's own text for a server's error is only
/// "db error", the server's message is its cause.
pub(crate) fn describe(e: &postgres::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// How to connect, and as which replica.
#[derive(Clone)]
pub(crate) struct Connector {
    config: postgres::Config,
    pub(crate) replica: String,
    pub(crate) shown: String,
}

impl Connector {
    pub(crate) fn parse(url: &str, replica: &str) -> Result<Self, OpenError> {
        let shown = shown_url(url);
        let mut config: postgres::Config = url.parse().map_err(|e| OpenError::Postgres {
            url: shown.clone(),
            detail: format!("not a PostgreSQL URL: {e}"),
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("toolwarden");
        }
        Ok(Connector {
            config,
            replica: replica.to_owned(),
            shown,
        })
    }

    pub(crate) fn connect(&self) -> Result<Client, postgres::Error> {
        self.config.connect(NoTls)
    }

    /// Takes this replica's lock on `client`'s session; `false` when another session holds it.
    pub(crate) fn lock_replica(&self, client: &mut Client) -> Result<bool, postgres::Error> {
        Ok(client
            .query_one(
                "SELECT pg_try_advisory_lock(hashtext('toolwarden.replica:' || current_schema() \
                 || ':' || $1))",
                &[&self.replica],
            )?
            .get(0))
    }

    /// A connection for the writer, holding this replica's lock.
    pub(crate) fn connect_writer(&self) -> Result<Client, String> {
        let mut client = self.connect().map_err(|e| describe(&e))?;
        if self.lock_replica(&mut client).map_err(|e| describe(&e))? {
            Ok(client)
        } else {
            Err(format!(
                "replica id {:?} is in use by another toolwarden process",
                self.replica
            ))
        }
    }

    pub(crate) fn error(&self, e: impl std::fmt::Display) -> OpenError {
        OpenError::Postgres {
            url: self.shown.clone(),
            detail: e.to_string(),
        }
    }

    pub(crate) fn pg_error(&self, e: &postgres::Error) -> OpenError {
        self.error(describe(e))
    }

    pub(crate) fn schema_error(&self, e: schema::PgSchemaError) -> OpenError {
        match e {
            schema::PgSchemaError::Newer(found) => OpenError::PostgresNewer {
                url: self.shown.clone(),
                found,
                supported: schema::LATEST,
            },
            schema::PgSchemaError::Postgres(e) => self.error(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shown_url;

    #[test]
    fn a_shown_url_never_holds_the_password() {
        for (url, shown) in [
            (
                "postgres://u:secret@db:5432/test",
                "postgres://u@db:5432/test",
            ),
            ("postgres://u:p@ss@db/test", "postgres://u@db/test"),
            (
                "postgres://db/test?user=u&password=secret&sslmode=disable",
                "postgres://db/test?user=u&sslmode=disable",
            ),
            (
                "postgres://u@db/test?password=secret",
                "postgres://u@db/test",
            ),
            ("postgres://db/test", "postgres://db/test"),
            (
                "host=db user=u password=secret dbname=test",
                "host=db user=u dbname=test",
            ),
        ] {
            assert_eq!(shown_url(url), shown, "{url}");
            assert!(!shown_url(url).contains("secret") && !shown_url(url).contains("ss@"));
        }
    }
}
