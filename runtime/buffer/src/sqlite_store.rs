//! SQLite persistence of experiences, shared by explorer and trainer processes on one machine (`storage_type:
//! sql`, or a queue's `sqlite:///` path). The claim rules are in [`crate::store`]; the schema and its
//! migrations in `sqlite_schema.rs`.
//!
//! Crash safety, and why it holds:
//! * WAL journal with `synchronous=FULL`: a commit is durable when the call returns, and a process killed at
//!   any moment (kill -9) leaves the database at its last commit.
//! * One transaction per explore step (`BEGIN IMMEDIATE`): a step's experiences and its record are all there
//!   or not at all; readers never see half a step.
//! * A claim selects rows and marks them in the same transaction, so a trainer killed mid-read either claimed
//!   the rows (its commit happened) or left them for the next reader; no row is claimed twice or lost.
//! * `busy_timeout` lets processes take turns instead of failing with "database is locked".
//!
//! Calls run on the calling task: each is a short local transaction, though under contention from another
//! process it may wait (up to the 30 s busy timeout) for the lock.
//!
//! Rows are read oldest first (by id); Trinity-RFT reads newest first, which starves old rows when the
//! explorer runs ahead.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params};

use crate::error::{BufferError, Result};
use crate::experience::Experience;
use crate::payload;
use crate::sqlite_schema;
use crate::store::{
    CLAIMED, ExploreStep, ProducerState, ProducerStatus, STALE, batch_uids, db_int, from_db_int, unix_now,
};

/// One SQLite database file of experiences.
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    conn: Mutex<Connection>,
}

/// How long a connection waits for another one's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `setup` again while it fails with `SQLITE_BUSY`, for at most [`BUSY_TIMEOUT`]. Two processes opening a
/// new database at once contend for the lock that switching it to WAL needs, and SQLite answers that contention
/// with an immediate `SQLITE_BUSY` instead of calling the busy handler (it would risk a deadlock), so the
/// connection's `busy_timeout` does not cover it.
fn retry_while_busy<T>(mut setup: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        match setup() {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// Turns `sqlite:///abs/path.db` (SQLAlchemy style, as in Trinity configs) into a path.
pub fn sqlite_url_path(url: &str) -> Result<PathBuf> {
    url.strip_prefix("sqlite:///")
        .filter(|rest| !rest.is_empty())
        .map(|rest| {
            // `sqlite:////abs` and `sqlite:///abs` both occur in the wild; a relative rest stays relative.
            PathBuf::from(rest)
        })
        .ok_or_else(|| BufferError::NotSqliteUrl { url: url.to_owned() })
}

impl SqliteStore {
    /// Opens (creating or migrating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<SqliteStore> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| BufferError::Io { path: parent.to_owned(), source })?;
        }
        let err = |source| BufferError::Sqlite { path: path.display().to_string(), source };
        let mut conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(err)?;
        let migration = retry_while_busy(|| {
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "FULL")?;
            sqlite_schema::migrate(&mut conn)
        })
        .map_err(err)?;
        migration.accept(|| format!("SQLite store `{}`", path.display()), sqlite_schema::VERSION)?;
        Ok(SqliteStore { path: path.to_owned(), conn: Mutex::new(conn) })
    }

    /// Opens the database named by a `sqlite:///` URL.
    pub fn open_url(url: &str) -> Result<SqliteStore> {
        SqliteStore::open(&sqlite_url_path(url)?)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stores explore step `step` of `producer` with its record in one transaction, durable on return. Returns
    /// how many experiences were stored, or `None` when the step was stored before (nothing changes).
    pub fn put_step(&self, producer: &str, step: u64, batch: &[Experience], state: &str) -> Result<Option<usize>> {
        let mut encoded = Vec::with_capacity(batch.len());
        for exp in batch {
            exp.validate()?;
            encoded.push(payload::encode(exp)?);
        }
        let uids = batch_uids(batch);
        let now = unix_now();
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| self.err(e))?;
        let sql = "INSERT INTO explore_steps (producer, step, count, state, created_at) VALUES (?1, ?2, 0, ?3, ?4)
                   ON CONFLICT DO NOTHING";
        if tx.execute(sql, params![producer, db_int(step), state, now]).map_err(|e| self.err(e))? == 0 {
            return Ok(None);
        }
        let mut stored = 0;
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO experiences (producer, uid, group_id, model_version, reward, created_at, experience)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT DO NOTHING",
                )
                .map_err(|e| self.err(e))?;
            for ((exp, uid), bytes) in batch.iter().zip(&uids).zip(&encoded) {
                let row = params![producer, uid, exp.group_id, db_int(exp.model_version), exp.reward, now, bytes];
                stored += insert.execute(row).map_err(|e| self.err(e))?;
            }
        }
        if stored < batch.len() {
            tracing::warn!(
                "SQLite store {}: {} experiences of {producer} step {step} were stored before; kept once",
                self.path.display(),
                batch.len() - stored
            );
        }
        let sql = "UPDATE explore_steps SET count = ?3 WHERE producer = ?1 AND step = ?2";
        tx.execute(sql, params![producer, db_int(step), stored as i64]).map_err(|e| self.err(e))?;
        touch_producer(&tx, producer, now).map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))?;
        Ok(Some(stored))
    }

    /// Whether `producer` has stored explore step `step`.
    pub fn has_step(&self, producer: &str, step: u64) -> Result<bool> {
        let conn = self.lock();
        let mut query = conn
            .prepare_cached("SELECT 1 FROM explore_steps WHERE producer = ?1 AND step = ?2")
            .map_err(|e| self.err(e))?;
        query.exists(params![producer, db_int(step)]).map_err(|e| self.err(e))
    }

    /// `producer`'s explore steps after `step`, in order (the ones a run resumed from train step `step` must not
    /// explore again).
    pub fn explored_after(&self, producer: &str, step: u64) -> Result<Vec<ExploreStep>> {
        self.steps(
            "SELECT producer, step, count, state FROM explore_steps WHERE producer = ?1 AND step > ?2 ORDER BY step",
            params![producer, db_int(step)],
        )
    }

    /// `producer`'s latest explore step.
    pub fn last_explored(&self, producer: &str) -> Result<Option<ExploreStep>> {
        let sql =
            "SELECT producer, step, count, state FROM explore_steps WHERE producer = ?1 ORDER BY step DESC LIMIT 1";
        Ok(self.steps(sql, params![producer])?.pop())
    }

    fn steps(&self, sql: &str, args: impl rusqlite::Params) -> Result<Vec<ExploreStep>> {
        let conn = self.lock();
        let mut select = conn.prepare_cached(sql).map_err(|e| self.err(e))?;
        let rows = select
            .query_map(args, |row| {
                Ok(ExploreStep {
                    producer: row.get(0)?,
                    step: from_db_int(row.get(1)?),
                    count: from_db_int(row.get(2)?) as usize,
                    state: row.get(3)?,
                })
            })
            .map_err(|e| self.err(e))?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }

    /// Claims the `n` oldest waiting rows with model_version ≥ `min_model_version` for `consumer`'s train step
    /// `step` (see [`crate::store`] for retried claims, stale rows and leases); `None`, with nothing claimed,
    /// when fewer than `n` are there.
    pub fn try_take(
        &self,
        consumer: &str,
        lease: Duration,
        step: u64,
        n: usize,
        min_model_version: Option<u64>,
    ) -> Result<Option<Vec<Experience>>> {
        let now = unix_now();
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| self.err(e))?;
        touch_consumer(&tx, consumer, now).map_err(|e| self.err(e))?;
        let held = self.rows(
            &tx,
            "SELECT id, experience FROM experiences WHERE consumer = ?1 AND train_step = ?2 AND consumed = 1
             ORDER BY id",
            params![consumer, db_int(step)],
        )?;
        if !held.is_empty() {
            if held.len() != n {
                return Err(BufferError::StepClaimMismatch {
                    name: self.path.display().to_string(),
                    consumer: consumer.to_owned(),
                    step,
                    held: held.len(),
                    wanted: n,
                });
            }
            tx.commit().map_err(|e| self.err(e))?;
            return Ok(Some(held.into_iter().map(|(_, exp)| exp).collect()));
        }
        let min = db_int(min_model_version.unwrap_or(0));
        tx.execute(
            "UPDATE experiences SET consumed = ?1, consumer = ?2, train_step = ?3 WHERE consumed = 0 AND model_version < ?4",
            params![STALE, consumer, db_int(step), min],
        )
        .map_err(|e| self.err(e))?;
        let limit = n as i64;
        let mut rows = self.rows(
            &tx,
            "SELECT id, experience FROM experiences WHERE consumed = 0 AND model_version >= ?1 ORDER BY id LIMIT ?2",
            params![min, limit],
        )?;
        let lapsed = now - lease.as_secs_f64();
        let stolen = self.rows(
            &tx,
            "SELECT id, experience FROM experiences WHERE consumed = 1 AND committed = 0 AND consumer != ?1
             AND model_version >= ?2
             AND consumer IN (SELECT name FROM consumers WHERE last_seen < ?3) ORDER BY id LIMIT ?4",
            params![consumer, min, lapsed, limit],
        )?;
        if !stolen.is_empty() {
            rows.extend(stolen);
            rows.sort_by_key(|(id, _)| *id);
        }
        if rows.len() < n {
            // Keep the stale marks: they hold whatever happens next.
            tx.commit().map_err(|e| self.err(e))?;
            return Ok(None);
        }
        rows.truncate(n);
        {
            let mut mark = tx
                .prepare_cached("UPDATE experiences SET consumed = ?2, consumer = ?3, train_step = ?4 WHERE id = ?1")
                .map_err(|e| self.err(e))?;
            for (id, _) in &rows {
                mark.execute(params![id, CLAIMED, consumer, db_int(step)]).map_err(|e| self.err(e))?;
            }
        }
        tx.commit().map_err(|e| self.err(e))?;
        Ok(Some(rows.into_iter().map(|(_, exp)| exp).collect()))
    }

    /// Hands back `consumer`'s claims of train steps after `step` that are not final; returns how many rows.
    pub fn release_after(&self, consumer: &str, step: u64) -> Result<usize> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| self.err(e))?;
        touch_consumer(&tx, consumer, unix_now()).map_err(|e| self.err(e))?;
        let released = tx
            .execute(
                "UPDATE experiences SET consumed = 0, consumer = NULL, train_step = NULL
                 WHERE consumer = ?1 AND train_step > ?2 AND consumed IN (1, 2) AND committed = 0",
                params![consumer, db_int(step)],
            )
            .map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))?;
        Ok(released)
    }

    /// Makes `consumer`'s claims of train steps ≤ `step` final and records `step` as its committed step.
    pub fn commit_through(&self, consumer: &str, step: u64) -> Result<()> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| self.err(e))?;
        touch_consumer(&tx, consumer, unix_now()).map_err(|e| self.err(e))?;
        tx.execute(
            "UPDATE experiences SET committed = 1
             WHERE consumer = ?1 AND train_step <= ?2 AND consumed IN (1, 2) AND committed = 0",
            params![consumer, db_int(step)],
        )
        .map_err(|e| self.err(e))?;
        tx.execute(
            "UPDATE consumers SET committed_step = MAX(COALESCE(committed_step, ?2), ?2) WHERE name = ?1",
            params![consumer, db_int(step)],
        )
        .map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))
    }

    /// The last step `consumer` committed through.
    pub fn committed_step(&self, consumer: &str) -> Result<Option<u64>> {
        let conn = self.lock();
        let step: Option<Option<i64>> = conn
            .query_row("SELECT committed_step FROM consumers WHERE name = ?1", params![consumer], |row| row.get(0))
            .optional()
            .map_err(|e| self.err(e))?;
        Ok(step.flatten().map(from_db_int))
    }

    /// Records that `consumer` is alive (every claim, release and commit does too).
    pub fn heartbeat(&self, consumer: &str) -> Result<()> {
        touch_consumer(&self.lock(), consumer, unix_now()).map_err(|e| self.err(e))
    }

    /// Records `producer`'s state, now.
    pub fn set_producer(&self, producer: &str, state: ProducerState) -> Result<()> {
        let conn = self.lock();
        conn.execute(
            "INSERT INTO producers (name, state, last_seen) VALUES (?1, ?2, ?3)
             ON CONFLICT (name) DO UPDATE SET state = excluded.state, last_seen = excluded.last_seen",
            params![producer, state.as_str(), unix_now()],
        )
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Every producer that stored a step or reported its state, by name.
    pub fn producers(&self) -> Result<Vec<ProducerStatus>> {
        let conn = self.lock();
        let mut select = conn
            .prepare_cached(
                "SELECT p.name, p.state, p.last_seen, (SELECT COUNT(*) FROM explore_steps s WHERE s.producer = p.name)
                 FROM producers p ORDER BY p.name",
            )
            .map_err(|e| self.err(e))?;
        let rows: Vec<(String, String, f64, i64)> = select
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))
            .map_err(|e| self.err(e))?
            .collect::<rusqlite::Result<_>>()
            .map_err(|e| self.err(e))?;
        rows.into_iter()
            .map(|(name, state, last_seen, steps)| {
                let state = ProducerState::parse(&state).ok_or_else(|| BufferError::CorruptRecord {
                    store: self.describe(),
                    problem: format!("producer `{name}` has unknown state `{state}`"),
                })?;
                Ok(ProducerStatus { name, state, last_seen: last_seen.max(0.0) as u64, steps: from_db_int(steps) })
            })
            .collect()
    }

    /// Rows waiting to be claimed.
    pub fn waiting_count(&self) -> Result<usize> {
        self.count("SELECT COUNT(*) FROM experiences WHERE consumed = 0")
    }

    /// Every row ever stored.
    pub fn total_count(&self) -> Result<usize> {
        self.count("SELECT COUNT(*) FROM experiences")
    }

    /// Every waiting row, oldest first, without claiming it (inspection and tests).
    pub fn waiting(&self) -> Result<Vec<(i64, Experience)>> {
        let conn = self.lock();
        self.rows(&conn, "SELECT id, experience FROM experiences WHERE consumed = 0 ORDER BY id", [])
    }

    fn count(&self, sql: &str) -> Result<usize> {
        let conn = self.lock();
        let n: i64 = conn.query_row(sql, [], |row| row.get(0)).map_err(|e| self.err(e))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Runs a query of `(id, experience)` and decodes each payload.
    fn rows(&self, conn: &Connection, sql: &str, args: impl rusqlite::Params) -> Result<Vec<(i64, Experience)>> {
        let mut select = conn.prepare_cached(sql).map_err(|e| self.err(e))?;
        let raw: Vec<(i64, Vec<u8>)> = select
            .query_map(args, |row| Ok((row.get(0)?, payload_bytes(row, 1)?)))
            .map_err(|e| self.err(e))?
            .collect::<rusqlite::Result<_>>()
            .map_err(|e| self.err(e))?;
        raw.into_iter()
            .map(|(id, bytes)| {
                payload::decode(&bytes).map(|exp| (id, exp)).map_err(|problem| BufferError::CorruptRow {
                    store: self.describe(),
                    id,
                    problem,
                })
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // Poisoning would only mean a panic elsewhere; SQLite rolls back any transaction left open when its
        // `Transaction` guard dropped during that panic, so the connection is still consistent.
        self.conn.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn describe(&self) -> String {
        format!("SQLite store `{}`", self.path.display())
    }

    fn err(&self, source: rusqlite::Error) -> BufferError {
        BufferError::Sqlite { path: self.path.display().to_string(), source }
    }
}

/// A payload column: zstd BLOBs, or JSON text in rows written before compression.
fn payload_bytes(row: &Row<'_>, index: usize) -> rusqlite::Result<Vec<u8>> {
    match row.get_ref(index)? {
        ValueRef::Blob(bytes) | ValueRef::Text(bytes) => Ok(bytes.to_vec()),
        other => Err(rusqlite::Error::InvalidColumnType(index, "experience".into(), other.data_type())),
    }
}

/// A stored step is a sign of life: the producer is created as running if new, its `last_seen` moves on.
fn touch_producer(tx: &Transaction<'_>, producer: &str, now: f64) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO producers (name, state, last_seen) VALUES (?1, ?2, ?3)
         ON CONFLICT (name) DO UPDATE SET last_seen = excluded.last_seen",
        params![producer, ProducerState::Running.as_str(), now],
    )
    .map(drop)
}

fn touch_consumer(conn: &Connection, consumer: &str, now: f64) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO consumers (name, last_seen) VALUES (?1, ?2)
         ON CONFLICT (name) DO UPDATE SET last_seen = excluded.last_seen",
        params![consumer, now],
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experience::Eid;
    use crate::sqlite_schema::LEGACY_SCHEMA;

    const LEASE: Duration = Duration::from_secs(60);

    fn exp(batch: u64, task: u64) -> Experience {
        let mut e = Experience::single_turn(Eid { batch, task, run: 0, step: 0 }, vec![5, 6, 7], 1, vec![-0.5, -0.25]);
        e.reward = task as f64;
        e
    }

    /// Processes of a decoupled run start together and open the new database at once; none may fail with
    /// "database is locked".
    #[test]
    fn many_connections_opening_a_new_database_at_once_all_succeed() {
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("new.db");
            let start = std::sync::Arc::new(std::sync::Barrier::new(8));
            let opened: Vec<_> = (0..8)
                .map(|_| {
                    let (path, start) = (path.clone(), std::sync::Arc::clone(&start));
                    std::thread::spawn(move || {
                        start.wait();
                        SqliteStore::open(&path).map(|_| ())
                    })
                })
                .collect();
            for thread in opened {
                thread.join().unwrap().unwrap();
            }
        }
    }

    #[test]
    fn url_paths() {
        assert_eq!(sqlite_url_path("sqlite:////tmp/x.db").unwrap(), PathBuf::from("/tmp/x.db"));
        assert_eq!(sqlite_url_path("sqlite:///buffer/x.db").unwrap(), PathBuf::from("buffer/x.db"));
        assert!(sqlite_url_path("postgres://x").is_err());
    }

    #[test]
    fn payloads_are_zstd_blobs_and_plain_json_rows_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("b.db")).unwrap();
        store.put_step("e", 1, &[exp(1, 0)], "{}").unwrap();
        let text = serde_json::to_string(&exp(0, 9)).unwrap();
        {
            let conn = store.lock();
            let kind: String = conn.query_row("SELECT typeof(experience) FROM experiences", [], |r| r.get(0)).unwrap();
            assert_eq!(kind, "blob");
            conn.execute(
                "INSERT INTO experiences (producer, uid, group_id, model_version, reward, created_at, experience)
                 VALUES ('old', 'x', 'g', 0, 0.0, 0.0, ?1)",
                [&text],
            )
            .unwrap();
        }
        let waiting: Vec<u64> = store.waiting().unwrap().iter().map(|(_, e)| e.eid.task).collect();
        assert_eq!(waiting, [0, 9]);
    }

    #[test]
    fn an_old_database_migrates_without_losing_a_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(LEGACY_SCHEMA).unwrap();
            let insert = "INSERT INTO experiences (uid, group_id, model_version, reward, consumed, created_at,
                          experience, train_step) VALUES (?1, 'g', 0, 0.0, ?2, 0.0, ?3, ?4)";
            for (task, consumed, train_step) in [(0, 1, Some(1)), (1, 1, Some(2)), (2, 0, None), (3, 1, None)] {
                let text = serde_json::to_string(&exp(1, task)).unwrap();
                conn.execute(insert, params![exp(1, task).eid.uid(), consumed, text, train_step]).unwrap();
            }
            // The same uid twice (a step explored again before explore records existed): both rows stay.
            let text = serde_json::to_string(&exp(1, 2)).unwrap();
            conn.execute(insert, params![exp(1, 2).eid.uid(), 0, text, None::<i64>]).unwrap();
            for step in [1, 2] {
                conn.execute(
                    "INSERT INTO explore_steps VALUES (?1, 2, ?2)",
                    params![step, format!("{{\"s\":{step}}}")],
                )
                .unwrap();
            }
        }
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(store.total_count().unwrap(), 5);
        assert_eq!(store.waiting_count().unwrap(), 2);
        let steps = store.explored_after("explorer", 0).unwrap();
        assert_eq!(
            steps.iter().map(|s| (s.producer.as_str(), s.step)).collect::<Vec<_>>(),
            [("explorer", 1), ("explorer", 2)]
        );
        assert_eq!(steps[1].state, "{\"s\":2}");
        // The old run's claims belong to the default consumer: resuming from train step 1 gets step 2's back,
        // while the row consumed without a step stays consumed.
        assert_eq!(store.release_after("trainer", 1).unwrap(), 1);
        assert_eq!(store.waiting_count().unwrap(), 3);
        // The migrated database takes new steps under the new keys, and reopening it changes nothing.
        assert_eq!(store.put_step("explorer", 3, &[exp(3, 0)], "{}").unwrap(), Some(1));
        drop(store);
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(store.total_count().unwrap(), 6);
        assert_eq!(store.last_explored("explorer").unwrap().unwrap().step, 3);
        let version: i64 = store.lock().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(version, sqlite_schema::VERSION);
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.db");
        Connection::open(&path).unwrap().pragma_update(None, "user_version", 99).unwrap();
        let err = SqliteStore::open(&path).unwrap_err();
        assert!(matches!(err, BufferError::SchemaTooNew { found: 99, .. }), "{err}");
    }

    #[test]
    fn invalid_batches_are_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("exp.db")).unwrap();
        let mut bad = exp(1, 1);
        bad.action_mask.push(true);
        assert!(store.put_step("e", 1, &[exp(1, 0), bad], "{}").is_err());
        assert_eq!(store.total_count().unwrap(), 0);
        assert!(!store.has_step("e", 1).unwrap());
    }

    #[test]
    fn repeated_experiences_of_one_step_are_all_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("exp.db")).unwrap();
        assert_eq!(store.put_step("e", 1, &[exp(1, 0), exp(1, 0), exp(1, 1)], "{}").unwrap(), Some(3));
        assert_eq!(store.put_step("e", 1, &[exp(1, 0), exp(1, 0), exp(1, 1)], "{}").unwrap(), None);
        assert_eq!(store.total_count().unwrap(), 3);
    }

    #[test]
    fn an_uncommitted_transaction_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exp.db");
        let store = SqliteStore::open(&path).unwrap();
        store.put_step("e", 1, &[exp(1, 0)], "{}").unwrap();
        {
            // A writer that dies between insert and commit: its transaction is dropped, never committed.
            let mut conn = Connection::open(&path).unwrap();
            let tx = conn.transaction().unwrap();
            tx.execute(
                "INSERT INTO experiences (producer, uid, group_id, model_version, reward, created_at, experience)
                 VALUES ('e', 'x', 'g', 0, 0.0, 0.0, x'00')",
                [],
            )
            .unwrap();
            tx.execute("INSERT INTO explore_steps VALUES ('e', 2, 1, '{}', 0.0)", []).unwrap();
        }
        assert_eq!(store.total_count().unwrap(), 1);
        assert!(!store.has_step("e", 2).unwrap());
        assert_eq!(store.try_take("t", LEASE, 1, 1, None).unwrap().unwrap().len(), 1);
    }
}
