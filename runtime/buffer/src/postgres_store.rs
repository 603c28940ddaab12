//! PostgreSQL persistence of experiences, for explorers and trainers on different machines (`storage_type: sql`
//! or `queue` with `path: postgresql://user:password@host:port/database`). The claim rules are in
//! [`crate::store`], the schema in `postgres_schema.rs`, connection handling and retries in
//! `postgres_connection.rs`.
//!
//! Concurrency: a claim selects with `FOR UPDATE SKIP LOCKED` and marks the rows in the same transaction, so
//! consumers claiming at once get disjoint rows without waiting on each other. Timestamps of heartbeats come
//! from the database's clock (`now()`), so leases do not depend on the machines' clocks agreeing.
//!
//! A lease only protects against a consumer that is gone: a consumer that is alive but silent for longer than
//! the lease (a very long train step) can have its claims taken, and those rows may then be trained twice. Keep
//! the lease above the longest train step, or call [`crate::ExperienceBuffer::heartbeat`] during it.

use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::types::ToSql;

use crate::error::{BufferError, Result};
use crate::experience::Experience;
use crate::payload;
use crate::postgres_connection::{PgConnection, pg_run};
use crate::postgres_schema;
use crate::store::{CLAIMED, ExploreStep, ProducerState, ProducerStatus, STALE, batch_uids, db_int, from_db_int};

/// The database's clock in Unix seconds.
const NOW: &str = "EXTRACT(EPOCH FROM now())::float8";

/// One buffer in a PostgreSQL database.
#[derive(Debug)]
pub struct PgStore {
    conn: PgConnection,
    #[cfg(test)]
    pub(crate) fault: std::sync::Mutex<Option<Fault>>,
}

/// Failures a test injects into the next `put_step`.
#[cfg(test)]
#[derive(Debug)]
pub(crate) enum Fault {
    /// Report the connection's backend pid, then wait before committing (the test kills the backend meanwhile).
    PauseBeforeCommit { pid: tokio::sync::oneshot::Sender<i32>, resume: tokio::sync::oneshot::Receiver<()> },
    /// Terminate the connection right after the commit, so the caller never hears that it succeeded.
    DieAfterCommit,
}

/// The outcome of one claiming transaction.
enum Claim {
    Rows(Vec<(i64, Vec<u8>)>),
    NotEnough,
    Mismatch { held: usize },
}

impl PgStore {
    /// Connects to the database at `url` and opens (creating or migrating) the buffer `name` in it.
    pub async fn connect(url: &str, name: &str) -> Result<PgStore> {
        let conn = PgConnection::new(url, name)
            .ok_or_else(|| BufferError::UnsupportedUrl { name: name.to_owned(), url: url.to_owned() })?;
        let schema = conn.schema().to_owned();
        let migration =
            pg_run!(&conn, "create the schema", |client| async { postgres_schema::migrate(client, &schema).await })?;
        migration.accept(|| format!("PostgreSQL buffer `{}` ({name})", conn.shown()), postgres_schema::VERSION)?;
        Ok(PgStore {
            conn,
            #[cfg(test)]
            fault: std::sync::Mutex::new(None),
        })
    }

    /// The URL, password hidden.
    pub fn url(&self) -> &str {
        self.conn.shown()
    }

    /// Stores explore step `step` of `producer` with its record in one transaction. Returns how many
    /// experiences were stored, or `None` when the step was stored before (nothing changes).
    pub async fn put_step(
        &self,
        producer: &str,
        step: u64,
        batch: &[Experience],
        state: &str,
    ) -> Result<Option<usize>> {
        let mut payloads = Vec::with_capacity(batch.len());
        for exp in batch {
            exp.validate()?;
            payloads.push(payload::encode(exp)?);
        }
        let uids = batch_uids(batch);
        let groups: Vec<&str> = batch.iter().map(|e| e.group_id.as_str()).collect();
        let versions: Vec<i64> = batch.iter().map(|e| db_int(e.model_version)).collect();
        let rewards: Vec<f64> = batch.iter().map(|e| e.reward).collect();
        let step = db_int(step);
        let stored = pg_run!(&self.conn, "store an explore step", |client| async {
            let tx = client.transaction().await?;
            let record = "INSERT INTO explore_steps (producer, step, count, state) VALUES ($1, $2, 0, $3)
                              ON CONFLICT DO NOTHING";
            if tx.execute(record, &[&producer, &step, &state]).await? == 0 {
                return Ok(None);
            }
            let stored = tx
                .execute(
                    "INSERT INTO experiences (producer, uid, group_id, model_version, reward, experience)
                         SELECT $1, u, g, v, r, p
                         FROM UNNEST($2::text[], $3::text[], $4::int8[], $5::float8[], $6::bytea[])
                             WITH ORDINALITY AS t (u, g, v, r, p, o)
                         ORDER BY o
                         ON CONFLICT DO NOTHING",
                    &[&producer, &uids, &groups, &versions, &rewards, &payloads],
                )
                .await?;
            let update = "UPDATE explore_steps SET count = $3 WHERE producer = $1 AND step = $2";
            tx.execute(update, &[&producer, &step, &(stored as i64)]).await?;
            tx.execute(
                &format!(
                    "INSERT INTO producers (name, state, last_seen) VALUES ($1, $2, {NOW})
                         ON CONFLICT (name) DO UPDATE SET last_seen = excluded.last_seen"
                ),
                &[&producer, &ProducerState::Running.as_str()],
            )
            .await?;
            #[cfg(test)]
            let fault = self.take_fault(&tx).await?;
            tx.commit().await?;
            #[cfg(test)]
            if let Some(Fault::DieAfterCommit) = fault {
                client.batch_execute("SELECT pg_terminate_backend(pg_backend_pid())").await?;
            }
            Ok(Some(stored as usize))
        })?;
        if let Some(stored) = stored.filter(|&n| n < batch.len()) {
            tracing::warn!(
                "PostgreSQL buffer {}: {} experiences of {producer} step {step} were stored before; kept once",
                self.url(),
                batch.len() - stored
            );
        }
        Ok(stored)
    }

    /// Whether `producer` has stored explore step `step`.
    pub async fn has_step(&self, producer: &str, step: u64) -> Result<bool> {
        let step = db_int(step);
        let sql = "SELECT 1 FROM explore_steps WHERE producer = $1 AND step = $2";
        let rows =
            pg_run!(&self.conn, "look up an explore step", |c| async { c.query(sql, &[&producer, &step]).await })?;
        Ok(!rows.is_empty())
    }

    /// `producer`'s explore steps after `step`, in order.
    pub async fn explored_after(&self, producer: &str, step: u64) -> Result<Vec<ExploreStep>> {
        let sql = "SELECT producer, step, count, state FROM explore_steps WHERE producer = $1 AND step > $2
                   ORDER BY step";
        self.steps(sql, &[&producer, &db_int(step)]).await
    }

    /// `producer`'s latest explore step.
    pub async fn last_explored(&self, producer: &str) -> Result<Option<ExploreStep>> {
        let sql = "SELECT producer, step, count, state FROM explore_steps WHERE producer = $1
                   ORDER BY step DESC LIMIT 1";
        Ok(self.steps(sql, &[&producer]).await?.pop())
    }

    async fn steps(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<Vec<ExploreStep>> {
        let rows = pg_run!(&self.conn, "read explore steps", |client| async { client.query(sql, args).await })?;
        Ok(rows
            .iter()
            .map(|row| ExploreStep {
                producer: row.get(0),
                step: from_db_int(row.get(1)),
                count: from_db_int(row.get(2)) as usize,
                state: row.get(3),
            })
            .collect())
    }

    /// Claims the `n` oldest waiting rows with model_version ≥ `min_model_version` for `consumer`'s train step
    /// `step`; `None`, with nothing claimed, when fewer than `n` can be had now.
    pub async fn try_take(
        &self,
        consumer: &str,
        lease: Duration,
        step: u64,
        n: usize,
        min_model_version: Option<u64>,
    ) -> Result<Option<Vec<Experience>>> {
        let min = db_int(min_model_version.unwrap_or(0));
        let claim = pg_run!(&self.conn, "claim experiences", |c| async {
            claim(c, consumer, lease, db_int(step), n, min).await
        })?;
        match claim {
            Claim::NotEnough => Ok(None),
            Claim::Mismatch { held } => Err(BufferError::StepClaimMismatch {
                name: self.url().to_owned(),
                consumer: consumer.to_owned(),
                step,
                held,
                wanted: n,
            }),
            Claim::Rows(rows) => rows
                .into_iter()
                .map(|(id, bytes)| {
                    payload::decode(&bytes).map_err(|problem| BufferError::CorruptRow {
                        store: format!("PostgreSQL buffer `{}`", self.url()),
                        id,
                        problem,
                    })
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
        }
    }

    /// Hands back `consumer`'s claims of train steps after `step` that are not final; returns how many rows.
    pub async fn release_after(&self, consumer: &str, step: u64) -> Result<usize> {
        let step = db_int(step);
        let released = pg_run!(&self.conn, "release claims", |client| async {
            let tx = client.transaction().await?;
            touch_consumer(&tx, consumer).await?;
            let released = tx
                .execute(
                    "UPDATE experiences SET consumed = 0, consumer = NULL, train_step = NULL
                         WHERE consumer = $1 AND train_step > $2 AND consumed IN (1, 2) AND NOT committed",
                    &[&consumer, &step],
                )
                .await?;
            tx.commit().await?;
            Ok(released)
        })?;
        Ok(released as usize)
    }

    /// Makes `consumer`'s claims of train steps ≤ `step` final and records `step` as its committed step.
    pub async fn commit_through(&self, consumer: &str, step: u64) -> Result<()> {
        let step = db_int(step);
        pg_run!(&self.conn, "commit claims", |client| async {
            let tx = client.transaction().await?;
            touch_consumer(&tx, consumer).await?;
            tx.execute(
                "UPDATE experiences SET committed = true
                     WHERE consumer = $1 AND train_step <= $2 AND consumed IN (1, 2) AND NOT committed",
                &[&consumer, &step],
            )
            .await?;
            tx.execute(
                "UPDATE consumers SET committed_step = GREATEST(COALESCE(committed_step, $2), $2) WHERE name = $1",
                &[&consumer, &step],
            )
            .await?;
            tx.commit().await
        })
    }

    /// The last step `consumer` committed through.
    pub async fn committed_step(&self, consumer: &str) -> Result<Option<u64>> {
        let sql = "SELECT committed_step FROM consumers WHERE name = $1";
        let rows = pg_run!(&self.conn, "read the committed step", |c| async { c.query(sql, &[&consumer]).await })?;
        Ok(rows.first().and_then(|row| row.get::<_, Option<i64>>(0)).map(from_db_int))
    }

    /// Records that `consumer` is alive.
    pub async fn heartbeat(&self, consumer: &str) -> Result<()> {
        pg_run!(&self.conn, "heartbeat", |client| async { touch_consumer(client, consumer).await })
    }

    /// Records `producer`'s state, now (the database's clock).
    pub async fn set_producer(&self, producer: &str, state: ProducerState) -> Result<()> {
        let sql = format!(
            "INSERT INTO producers (name, state, last_seen) VALUES ($1, $2, {NOW})
             ON CONFLICT (name) DO UPDATE SET state = excluded.state, last_seen = excluded.last_seen"
        );
        let state = state.as_str();
        pg_run!(&self.conn, "record a producer's state", |c| async { c.execute(&sql, &[&producer, &state]).await })?;
        Ok(())
    }

    /// Every producer that stored a step or reported its state, by name.
    pub async fn producers(&self) -> Result<Vec<ProducerStatus>> {
        let sql = "SELECT p.name, p.state, p.last_seen,
                       (SELECT COUNT(*) FROM explore_steps s WHERE s.producer = p.name)
                   FROM producers p ORDER BY p.name";
        let rows = pg_run!(&self.conn, "read producers", |client| async { client.query(sql, &[]).await })?;
        rows.iter()
            .map(|row| {
                let (name, state): (String, String) = (row.get(0), row.get(1));
                let state = ProducerState::parse(&state).ok_or_else(|| BufferError::CorruptRecord {
                    store: format!("PostgreSQL buffer `{}`", self.url()),
                    problem: format!("producer `{name}` has unknown state `{state}`"),
                })?;
                let last_seen: f64 = row.get(2);
                Ok(ProducerStatus { name, state, last_seen: last_seen.max(0.0) as u64, steps: from_db_int(row.get(3)) })
            })
            .collect()
    }

    /// Rows waiting to be claimed.
    pub async fn waiting_count(&self) -> Result<usize> {
        self.count("SELECT COUNT(*) FROM experiences WHERE consumed = 0").await
    }

    /// Every row ever stored.
    pub async fn total_count(&self) -> Result<usize> {
        self.count("SELECT COUNT(*) FROM experiences").await
    }

    async fn count(&self, sql: &str) -> Result<usize> {
        let row = pg_run!(&self.conn, "count experiences", |client| async { client.query_one(sql, &[]).await })?;
        Ok(from_db_int(row.get(0)) as usize)
    }

    #[cfg(test)]
    async fn take_fault(&self, tx: &tokio_postgres::Transaction<'_>) -> Result<Option<Fault>, tokio_postgres::Error> {
        let fault = self.fault.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        match fault {
            Some(Fault::PauseBeforeCommit { pid, resume }) => {
                let backend: i32 = tx.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
                let _ = pid.send(backend);
                let _ = resume.await;
                Ok(None)
            }
            other => Ok(other),
        }
    }
}

/// One claiming transaction (see [`crate::store`]): a retried claim gets its rows again; stale rows are marked;
/// then the oldest waiting rows and lapsed claims of silent consumers are locked, skipping rows other claims
/// hold, and marked as this consumer's.
async fn claim(
    client: &mut Client,
    consumer: &str,
    lease: Duration,
    step: i64,
    n: usize,
    min: i64,
) -> Result<Claim, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    touch_consumer(&tx, consumer).await?;
    let held = tx
        .query(
            "SELECT id, experience FROM experiences WHERE consumer = $1 AND train_step = $2 AND consumed = 1 ORDER BY id",
            &[&consumer, &step],
        )
        .await?;
    if !held.is_empty() {
        if held.len() != n {
            return Ok(Claim::Mismatch { held: held.len() });
        }
        tx.commit().await?;
        return Ok(Claim::Rows(held.iter().map(|row| (row.get(0), row.get(1))).collect()));
    }
    tx.execute(
        "UPDATE experiences SET consumed = $1, consumer = $2, train_step = $3 WHERE id IN (
             SELECT id FROM experiences WHERE consumed = 0 AND model_version < $4 FOR UPDATE SKIP LOCKED)",
        &[&(STALE as i16), &consumer, &step, &min],
    )
    .await?;
    let limit = n as i64;
    let mut rows: Vec<(i64, Vec<u8>)> = tx
        .query(
            "SELECT id, experience FROM experiences WHERE consumed = 0 AND model_version >= $1
             ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED",
            &[&min, &limit],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let lapsed: Vec<String> = tx
        .query(
            &format!("SELECT name FROM consumers WHERE name <> $1 AND last_seen < {NOW} - $2"),
            &[&consumer, &lease.as_secs_f64()],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    if !lapsed.is_empty() {
        let stolen = tx
            .query(
                "SELECT id, experience FROM experiences
                 WHERE consumed = 1 AND NOT committed AND consumer = ANY($1) AND model_version >= $2
                 ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED",
                &[&lapsed, &min, &limit],
            )
            .await?;
        if !stolen.is_empty() {
            tracing::warn!("consumer {consumer} takes {} rows claimed by silent consumers {lapsed:?}", stolen.len());
            rows.extend(stolen.iter().map(|row| (row.get(0), row.get(1))));
            rows.sort_by_key(|(id, _)| *id);
        }
    }
    if rows.len() < n {
        // Keep the stale marks; the locks on the rows found go with the commit.
        tx.commit().await?;
        return Ok(Claim::NotEnough);
    }
    rows.truncate(n);
    let ids: Vec<i64> = rows.iter().map(|(id, _)| *id).collect();
    tx.execute(
        "UPDATE experiences SET consumed = $1, consumer = $2, train_step = $3 WHERE id = ANY($4)",
        &[&(CLAIMED as i16), &consumer, &step, &ids],
    )
    .await?;
    tx.commit().await?;
    Ok(Claim::Rows(rows))
}

/// Records that `consumer` is alive (a claim, release or commit is a heartbeat too).
async fn touch_consumer(
    client: &impl tokio_postgres::GenericClient,
    consumer: &str,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            &format!(
                "INSERT INTO consumers (name, last_seen) VALUES ($1, {NOW})
                 ON CONFLICT (name) DO UPDATE SET last_seen = excluded.last_seen"
            ),
            &[&consumer],
        )
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::oneshot;

    use super::*;
    use crate::experience::Eid;
    use crate::testing::PgServer;

    const LEASE: Duration = Duration::from_secs(60);

    fn batch(step: u64, n: u64) -> Vec<Experience> {
        (0..n)
            .map(|task| {
                Experience::single_turn(Eid { batch: step, task, ..Eid::default() }, vec![1, 2, 3], 1, vec![0.0; 2])
            })
            .collect()
    }

    /// A second connection, as another process (or an administrator) would have.
    async fn admin(server: &PgServer) -> Client {
        let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }

    async fn count(admin: &Client, sql: &str) -> i64 {
        admin.query_one(sql, &[]).await.unwrap().get(0)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_claims_get_disjoint_rows() {
        let server = PgServer::shared().unwrap();
        let store = PgStore::connect(&server.url(), "concurrent_claims").await.unwrap();
        for step in 1..=40 {
            store.put_step("explorer", step, &batch(step, 5), "{}").await.unwrap();
        }
        let claimers = ["trainer-a", "trainer-b"].map(|consumer| {
            let url = server.url();
            tokio::spawn(async move {
                let store = PgStore::connect(&url, "concurrent_claims").await.unwrap();
                let mut taken = Vec::new();
                let mut step = 0;
                loop {
                    match store.try_take(consumer, LEASE, step + 1, 5, None).await.unwrap() {
                        Some(rows) => {
                            taken.extend(rows.into_iter().map(|e| (e.eid.batch, e.eid.task)));
                            step += 1;
                        }
                        None if store.waiting_count().await.unwrap() == 0 => return (taken, step),
                        None => tokio::task::yield_now().await,
                    }
                }
            })
        });
        let mut all = Vec::new();
        for claimer in claimers {
            let (taken, steps) = claimer.await.unwrap();
            assert!(steps > 0, "both claimers take some rows");
            all.extend(taken);
        }
        let claimed = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), claimed, "no row claimed twice");
        assert_eq!(claimed, 200, "every row claimed");
    }

    #[tokio::test]
    async fn a_connection_killed_mid_transaction_leaves_nothing_and_the_retry_stores_once() {
        let server = PgServer::shared().unwrap();
        let admin = admin(&server).await;
        let store = Arc::new(PgStore::connect(&server.url(), "killed_mid_transaction").await.unwrap());
        let (pid_tx, pid_rx) = oneshot::channel();
        let (resume_tx, resume_rx) = oneshot::channel();
        *store.fault.lock().unwrap() = Some(Fault::PauseBeforeCommit { pid: pid_tx, resume: resume_rx });
        let writer = {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.put_step("explorer", 1, &batch(1, 8), "{\"pos\":1}").await })
        };
        // The transaction has inserted the record and all 8 rows and waits to commit: kill its connection.
        let pid = pid_rx.await.unwrap();
        let killed: bool = admin.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap().get(0);
        assert!(killed);
        assert_eq!(count(&admin, "SELECT COUNT(*) FROM killed_mid_transaction.experiences").await, 0);
        assert_eq!(count(&admin, "SELECT COUNT(*) FROM killed_mid_transaction.explore_steps").await, 0);
        resume_tx.send(()).unwrap();
        // The commit fails with the connection; the store reconnects and runs the transaction again.
        assert_eq!(writer.await.unwrap().unwrap(), Some(8));
        assert_eq!(count(&admin, "SELECT COUNT(*) FROM killed_mid_transaction.experiences").await, 8);
        assert_eq!(store.explored_after("explorer", 0).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_write_whose_commit_went_unheard_is_not_repeated() {
        let server = PgServer::shared().unwrap();
        let store = PgStore::connect(&server.url(), "unheard_commit").await.unwrap();
        *store.fault.lock().unwrap() = Some(Fault::DieAfterCommit);
        // The first attempt commits, then loses its connection; the retry finds the step stored.
        assert_eq!(store.put_step("explorer", 1, &batch(1, 4), "{}").await.unwrap(), None);
        assert_eq!(store.total_count().await.unwrap(), 4);
        assert_eq!(store.explored_after("explorer", 0).await.unwrap()[0].count, 4);
    }

    #[tokio::test]
    async fn a_dropped_connection_is_reopened() {
        // A server of its own: this test terminates every other connection to it.
        let server = PgServer::start().unwrap();
        let admin = admin(&server).await;
        let store = PgStore::connect(&server.url(), "dropped_connection").await.unwrap();
        store.put_step("explorer", 1, &batch(1, 2), "{}").await.unwrap();
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid()
                 AND backend_type = 'client backend'",
                &[],
            )
            .await
            .unwrap();
        // Give the client's connection task a moment to notice.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(store.waiting_count().await.unwrap(), 2);
        assert_eq!(store.try_take("trainer", LEASE, 1, 2, None).await.unwrap().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_newer_schema_is_refused() {
        let server = PgServer::shared().unwrap();
        let admin = admin(&server).await;
        drop(PgStore::connect(&server.url(), "newer_schema").await.unwrap());
        admin.execute("INSERT INTO newer_schema.schema_migrations (version) VALUES (99)", &[]).await.unwrap();
        let err = PgStore::connect(&server.url(), "newer_schema").await.unwrap_err();
        assert!(matches!(err, BufferError::SchemaTooNew { found: 99, .. }), "{err}");
        // Passwords never appear in messages (here: a role the server does not know, refused at once).
        let url = format!("postgresql://nobody:secret@127.0.0.1:{}/postgres", server.port());
        let err = PgStore::connect(&url, "y").await.unwrap_err();
        let shown = format!("nobody:***@127.0.0.1:{}/postgres", server.port());
        assert!(err.to_string().contains(&shown), "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
    }
}
