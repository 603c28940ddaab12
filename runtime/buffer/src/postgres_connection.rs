//! One PostgreSQL connection per buffer, reconnected on failure, with every operation retried a few times when
//! the failure is transient.
//!
//! Why retrying is safe: an operation is one transaction, so a failure before the commit left nothing behind,
//! and a failure after it (the commit's answer lost with the connection) is harmless because every write is
//! idempotent (unique keys with `ON CONFLICT DO NOTHING`, a claim for a step returns the step's rows again).
//!
//! URLs are SQLAlchemy's, as Trinity-RFT configs write them: `postgresql://user:password@host:port/database`,
//! also `postgres://` and `postgresql+psycopg2://` (any `+driver`). Error messages show the URL with the
//! password replaced by `***`. TLS is not supported: the buffer is meant for loopback or a private network.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};

use crate::error::{BufferError, Result};

/// Attempts of one operation, the first included.
const ATTEMPTS: u32 = 6;
/// Wait before the second attempt; doubled each time after (0.2 + 0.4 + … + 3.2 s ≈ 6 s in all).
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// Whether `url` names a PostgreSQL database.
pub(crate) fn is_postgres_url(url: &str) -> bool {
    normalize(url).is_some()
}

/// The URL in the form tokio-postgres reads (`postgresql://…`), without a SQLAlchemy `+driver`.
fn normalize(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let base = scheme.split_once('+').map_or(scheme, |(base, _driver)| base);
    matches!(base, "postgresql" | "postgres").then(|| format!("postgresql://{rest}"))
}

/// The URL with its password hidden, for messages.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let (authority, tail) = rest.split_once('/').map_or((rest, None), |(a, t)| (a, Some(t)));
    let shown = match authority.rsplit_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    match tail {
        Some(tail) => format!("{scheme}://{shown}/{tail}"),
        None => format!("{scheme}://{shown}"),
    }
}

/// `name` as a quoted SQL identifier.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Runs `$body`, an `async { }` block using `$client: &mut Client` and evaluating to
/// `Result<T, tokio_postgres::Error>`, as one operation on `$conn` (a [`PgConnection`]): connecting first if
/// needed, and on a transient failure (lost connection, server restart, serialization failure, deadlock) logging
/// it, reconnecting and running the block again with back-off, up to [`ATTEMPTS`] in all. Any other failure is
/// returned at once. `$what` names the operation in log lines. Evaluates to `crate::Result<T>`.
///
/// A macro rather than a method taking an async closure: the future of a higher-ranked async closure is not
/// provably `Send` (a rustc limitation), and the buffer's futures must be, so that callers can spawn them.
macro_rules! pg_run {
    ($conn:expr, $what:expr, |$client:ident| $body:expr) => {{
        let conn: &$crate::postgres_connection::PgConnection = $conn;
        let mut attempt = 1;
        loop {
            let mut slot = conn.lock().await;
            let outcome = match conn.ready(&mut slot).await {
                Ok($client) => $body.await,
                Err(e) => Err(e),
            };
            if let Some(result) = conn.settle($what, outcome, &mut attempt, slot).await {
                break result;
            }
        }
    }};
}
pub(crate) use pg_run;

/// A connection to one buffer's schema.
#[derive(Debug)]
pub(crate) struct PgConnection {
    /// Normalised URL, password included; never printed.
    url: String,
    /// The URL for messages.
    shown: String,
    /// The buffer's schema, quoted.
    schema: String,
    client: tokio::sync::Mutex<Option<Client>>,
}

impl PgConnection {
    /// A handle that connects on first use; `name` is the buffer's name, which is its schema in the database.
    pub(crate) fn new(url: &str, name: &str) -> Option<PgConnection> {
        Some(PgConnection {
            url: normalize(url)?,
            shown: redact(url),
            schema: quote_ident(name),
            client: tokio::sync::Mutex::new(None),
        })
    }

    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    pub(crate) fn schema(&self) -> &str {
        &self.schema
    }

    pub(crate) fn err(&self, source: tokio_postgres::Error) -> BufferError {
        BufferError::Postgres { url: self.shown.clone(), source }
    }

    /// The connection, for [`pg_run!`]: one operation at a time.
    pub(crate) async fn lock(&self) -> tokio::sync::MutexGuard<'_, Option<Client>> {
        self.client.lock().await
    }

    /// The client in `slot`, connecting first if there is none or it was closed.
    pub(crate) async fn ready<'s>(
        &self,
        slot: &'s mut Option<Client>,
    ) -> Result<&'s mut Client, tokio_postgres::Error> {
        let client = match slot.take().filter(|client| !client.is_closed()) {
            Some(client) => client,
            None => self.connect().await?,
        };
        Ok(slot.insert(client))
    }

    /// After one attempt of an operation: its result, or `None` when it failed transiently and should run again
    /// (the failure is logged, the connection dropped and the back-off slept here).
    pub(crate) async fn settle<T>(
        &self,
        what: &str,
        outcome: Result<T, tokio_postgres::Error>,
        attempt: &mut u32,
        mut slot: tokio::sync::MutexGuard<'_, Option<Client>>,
    ) -> Option<Result<T>> {
        match outcome {
            Ok(value) => Some(Ok(value)),
            Err(e) if *attempt < ATTEMPTS && is_transient(&e) => {
                let backoff = FIRST_BACKOFF * 2u32.pow(*attempt - 1);
                tracing::warn!(
                    "PostgreSQL buffer {}: {what} failed ({e}); reconnecting and retrying in {:.1} s \
                     (attempt {attempt} of {ATTEMPTS})",
                    self.shown,
                    backoff.as_secs_f64()
                );
                // A fresh connection for the retry: the old one may be half-closed, or hold an aborted transaction.
                *slot = None;
                drop(slot);
                tokio::time::sleep(backoff).await;
                *attempt += 1;
                None
            }
            Err(e) => Some(Err(self.err(e))),
        }
    }

    async fn connect(&self) -> Result<Client, tokio_postgres::Error> {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await?;
        let shown = self.shown.clone();
        // The connection object performs the I/O; it ends when the client is dropped or the socket closes.
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("PostgreSQL buffer {shown}: connection ended: {e}");
            }
        });
        // Unqualified table names are the buffer's own: several buffers can share one database.
        client.batch_execute(&format!("SET search_path TO {}", self.schema)).await?;
        Ok(client)
    }
}

/// Failures worth a retry on a new connection: the connection is gone or the server asks to try again.
fn is_transient(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        return code.code().starts_with("08")
            || [
                SqlState::T_R_SERIALIZATION_FAILURE,
                SqlState::T_R_DEADLOCK_DETECTED,
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::TOO_MANY_CONNECTIONS,
            ]
            .contains(code);
    }
    // No SQLSTATE: an I/O error (refused, reset, timed out) is transient; a type or encoding error is a bug.
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        if inner.is::<std::io::Error>() {
            return true;
        }
        source = inner.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlalchemy_urls_are_accepted_and_passwords_hidden() {
        for url in ["postgresql://u:p@h:5/db", "postgres://u:p@h:5/db", "postgresql+psycopg2://u:p@h:5/db"] {
            assert!(is_postgres_url(url), "{url}");
            assert_eq!(normalize(url).unwrap(), "postgresql://u:p@h:5/db");
            assert!(!redact(url).contains(":p@"), "{}", redact(url));
            assert!(redact(url).ends_with("u:***@h:5/db"), "{}", redact(url));
        }
        assert!(!is_postgres_url("sqlite:///x.db"));
        assert!(!is_postgres_url("mysql://u:p@h/db"));
        assert_eq!(redact("postgresql://u@h/db"), "postgresql://u@h/db");
        assert_eq!(redact("postgresql://u:p@h"), "postgresql://u:***@h");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
