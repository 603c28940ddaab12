//! SQLite persistence of experiences, shared by explorer and trainer processes (`storage_type: sql`, or a
//! queue's `sqlite:///` backup).
//!
//! Crash safety, and why it holds:
//! * WAL journal with `synchronous=FULL`: a commit is durable when `write_batch` returns, and a process
//!   killed at any moment (kill -9) leaves the database at its last commit.
//! * One transaction per batch (`BEGIN IMMEDIATE`): a batch is all there or not at all; readers never see
//!   half a batch.
//! * Reads take rows and set `consumed = 1` in the same transaction, so a trainer killed mid-read either
//!   consumed the rows (its commit happened) or left them for the next reader; no row is read twice or lost.
//! * `busy_timeout` lets two processes take turns instead of failing with "database is locked".
//!
//! * Resume: a row records the train step that consumed it (`train_step`), and every explore step records its
//!   row count and the explorer's position (`explore_steps`, in the batch's transaction). A run restarted from
//!   the checkpoint of step `s` hands rows consumed by steps after `s` back ([`SqliteStore::release_after`]) and
//!   continues exploring after the last recorded explore step, so no experience is lost and none is made twice.
//!
//! Rows are read oldest first (by id); Trinity-RFT reads newest first, which starves old rows when the
//! explorer runs ahead. Rows older than the reader's minimum model version are marked `consumed = 2`
//! (skipped as stale) in the reading transaction, so they stay for inspection but are never trained on.
//! Experiences are stored as JSON text: readable with the `sqlite3` shell and stable across versions.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, TransactionBehavior, params};

use crate::error::{BufferError, Result};
use crate::experience::Experience;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS experiences (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uid TEXT NOT NULL,
    group_id TEXT NOT NULL,
    model_version INTEGER NOT NULL,
    reward REAL NOT NULL,
    consumed INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    experience TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS experiences_by_state ON experiences (consumed, id);
CREATE TABLE IF NOT EXISTS explore_steps (
    step INTEGER PRIMARY KEY,
    count INTEGER NOT NULL,
    state TEXT NOT NULL
);
";

/// A recorded explore step: its number, how many experiences it stored, and the explorer's state after it
/// (opaque JSON chosen by the caller: taskset position, metrics).
#[derive(Debug, Clone, PartialEq)]
pub struct ExploreStep {
    pub step: u64,
    pub count: usize,
    pub state: String,
}

/// Value of `consumed` for rows skipped because their model version was too old.
pub const CONSUMED_STALE: i64 = 2;

/// One SQLite database file of experiences.
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    conn: Mutex<Connection>,
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
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<SqliteStore> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| BufferError::Io { path: parent.to_owned(), source })?;
        }
        let err = |source| BufferError::Sqlite { path: path.display().to_string(), source };
        let conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(Duration::from_secs(30)).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(err)?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(err)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        // Databases written before `train_step` existed get the column (NULL: consumed before any resume point).
        let has_train_step = conn
            .prepare("SELECT 1 FROM pragma_table_info('experiences') WHERE name = 'train_step'")
            .and_then(|mut q| q.exists([]))
            .map_err(err)?;
        if !has_train_step {
            conn.execute_batch("ALTER TABLE experiences ADD COLUMN train_step INTEGER").map_err(err)?;
        }
        Ok(SqliteStore { path: path.to_owned(), conn: Mutex::new(conn) })
    }

    /// Opens the database named by a `sqlite:///` URL.
    pub fn open_url(url: &str) -> Result<SqliteStore> {
        SqliteStore::open(&sqlite_url_path(url)?)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stores a batch in one transaction; durable on return. Returns the new rows' ids.
    pub fn write_batch(&self, batch: &[Experience]) -> Result<Vec<i64>> {
        self.write_step(batch, None)
    }

    /// Stores one explore step's batch and its [`ExploreStep`] record in one transaction: after a crash either
    /// both are there or neither.
    pub fn write_step(&self, batch: &[Experience], step: Option<(u64, &str)>) -> Result<Vec<i64>> {
        let mut encoded = Vec::with_capacity(batch.len());
        for exp in batch {
            exp.validate()?;
            let text =
                serde_json::to_string(exp).map_err(|source| BufferError::Encode { uid: exp.eid.uid(), source })?;
            encoded.push(text);
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| self.err(e))?;
        let mut ids = Vec::with_capacity(batch.len());
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO experiences (uid, group_id, model_version, reward, created_at, experience)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(|e| self.err(e))?;
            for (exp, text) in batch.iter().zip(&encoded) {
                let version = i64::try_from(exp.model_version).unwrap_or(i64::MAX);
                insert
                    .execute(params![exp.eid.uid(), exp.group_id, version, exp.reward, now, text])
                    .map_err(|e| self.err(e))?;
                ids.push(tx.last_insert_rowid());
            }
        }
        if let Some((step, state)) = step {
            tx.execute(
                "INSERT OR REPLACE INTO explore_steps (step, count, state) VALUES (?1, ?2, ?3)",
                params![i64::try_from(step).unwrap_or(i64::MAX), batch.len() as i64, state],
            )
            .map_err(|e| self.err(e))?;
        }
        tx.commit().map_err(|e| self.err(e))?;
        Ok(ids)
    }

    /// Explore steps after `step`, in order (the ones a run resumed from train step `step` must not redo).
    pub fn explored_after(&self, step: u64) -> Result<Vec<ExploreStep>> {
        let conn = self.lock();
        let mut select = conn
            .prepare_cached("SELECT step, count, state FROM explore_steps WHERE step > ?1 ORDER BY step")
            .map_err(|e| self.err(e))?;
        let rows = select
            .query_map(params![i64::try_from(step).unwrap_or(i64::MAX)], |row| {
                let (step, count): (i64, i64) = (row.get(0)?, row.get(1)?);
                Ok(ExploreStep { step: step as u64, count: count as usize, state: row.get(2)? })
            })
            .map_err(|e| self.err(e))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }

    /// Hands back the rows consumed by train steps after `step` (their training died with the process before a
    /// checkpoint); returns how many. Rows consumed without a step number are left alone.
    pub fn release_after(&self, step: u64) -> Result<usize> {
        let conn = self.lock();
        let n = conn
            .execute(
                "UPDATE experiences SET consumed = 0, train_step = NULL WHERE consumed = 1 AND train_step > ?1",
                params![i64::try_from(step).unwrap_or(i64::MAX)],
            )
            .map_err(|e| self.err(e))?;
        Ok(n)
    }

    /// Takes the `n` oldest unconsumed rows with model_version ≥ `min_model_version`, marking them consumed
    /// in the same transaction; `None` (and nothing changed except stale marks) when fewer than `n` exist.
    /// `train_step` is recorded on the taken rows (see [`SqliteStore::release_after`]).
    pub fn take_batch(
        &self,
        n: usize,
        min_model_version: Option<u64>,
        train_step: Option<u64>,
    ) -> Result<Option<Vec<(i64, Experience)>>> {
        let n = n.max(1);
        let min = i64::try_from(min_model_version.unwrap_or(0)).unwrap_or(i64::MAX);
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| self.err(e))?;
        tx.execute(
            "UPDATE experiences SET consumed = ?1 WHERE consumed = 0 AND model_version < ?2",
            params![CONSUMED_STALE, min],
        )
        .map_err(|e| self.err(e))?;
        let rows: Vec<(i64, String)> = {
            let mut select = tx
                .prepare_cached("SELECT id, experience FROM experiences WHERE consumed = 0 ORDER BY id LIMIT ?1")
                .map_err(|e| self.err(e))?;
            let mapped =
                select.query_map(params![n as i64], |row| Ok((row.get(0)?, row.get(1)?))).map_err(|e| self.err(e))?;
            mapped.collect::<std::result::Result<_, _>>().map_err(|e| self.err(e))?
        };
        if rows.len() < n {
            tx.commit().map_err(|e| self.err(e))?;
            return Ok(None);
        }
        let mut batch = Vec::with_capacity(n);
        for (id, text) in rows {
            let exp: Experience = serde_json::from_str(&text).map_err(|source| BufferError::CorruptRow {
                path: self.path.display().to_string(),
                id,
                source,
            })?;
            batch.push((id, exp));
        }
        {
            let mut mark = tx
                .prepare_cached("UPDATE experiences SET consumed = 1, train_step = ?2 WHERE id = ?1")
                .map_err(|e| self.err(e))?;
            let step = train_step.map(|s| i64::try_from(s).unwrap_or(i64::MAX));
            for (id, _) in &batch {
                mark.execute(params![id, step]).map_err(|e| self.err(e))?;
            }
        }
        tx.commit().map_err(|e| self.err(e))?;
        Ok(Some(batch))
    }

    /// Like [`SqliteStore::take_batch`], polling every `poll` until `timeout`; on timeout nothing is consumed.
    /// Each poll is one short query, so running it on an async worker is fine.
    pub async fn read_batch(
        &self,
        n: usize,
        timeout: Duration,
        poll: Duration,
        min_model_version: Option<u64>,
        train_step: Option<u64>,
    ) -> Result<Vec<Experience>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(batch) = self.take_batch(n, min_model_version, train_step)? {
                return Ok(batch.into_iter().map(|(_, e)| e).collect());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(BufferError::Timeout {
                    name: self.path.display().to_string(),
                    wanted: n,
                    available: self.unconsumed_count()?,
                    waited_s: timeout.as_secs_f64(),
                });
            }
            tokio::time::sleep(poll.min(deadline - tokio::time::Instant::now())).await;
        }
    }

    /// Marks rows consumed (a queue backed by this store calls it when the trainer took them).
    pub fn mark_consumed(&self, ids: &[i64]) -> Result<()> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| self.err(e))?;
        {
            let mut mark = tx
                .prepare_cached("UPDATE experiences SET consumed = 1 WHERE id = ?1 AND consumed = 0")
                .map_err(|e| self.err(e))?;
            for id in ids {
                mark.execute(params![id]).map_err(|e| self.err(e))?;
            }
        }
        tx.commit().map_err(|e| self.err(e))
    }

    /// Every unconsumed row, oldest first, without consuming it (refilling a queue after a restart).
    pub fn unconsumed(&self) -> Result<Vec<(i64, Experience)>> {
        let conn = self.lock();
        let mut select = conn
            .prepare_cached("SELECT id, experience FROM experiences WHERE consumed = 0 ORDER BY id")
            .map_err(|e| self.err(e))?;
        let rows: Vec<(i64, String)> = select
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .map_err(|e| self.err(e))?
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| self.err(e))?;
        rows.into_iter()
            .map(|(id, text)| {
                serde_json::from_str(&text).map(|exp| (id, exp)).map_err(|source| BufferError::CorruptRow {
                    path: self.path.display().to_string(),
                    id,
                    source,
                })
            })
            .collect()
    }

    pub fn unconsumed_count(&self) -> Result<usize> {
        self.count("SELECT COUNT(*) FROM experiences WHERE consumed = 0")
    }

    pub fn total_count(&self) -> Result<usize> {
        self.count("SELECT COUNT(*) FROM experiences")
    }

    fn count(&self, sql: &str) -> Result<usize> {
        let conn = self.lock();
        let n: i64 = conn.query_row(sql, [], |row| row.get(0)).map_err(|e| self.err(e))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // Poisoning would only mean a panic elsewhere; SQLite rolls back any transaction left open when its
        // `Transaction` guard dropped during that panic, so the connection is still consistent.
        self.conn.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn err(&self, source: rusqlite::Error) -> BufferError {
        BufferError::Sqlite { path: self.path.display().to_string(), source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experience::Eid;

    fn exp(task: u64, version: u64) -> Experience {
        let mut e =
            Experience::single_turn(Eid { batch: 1, task, run: 0, step: 0 }, vec![5, 6, 7], 1, vec![-0.5, -0.25]);
        e.model_version = version;
        e.reward = task as f64;
        e
    }

    #[test]
    fn url_paths() {
        assert_eq!(sqlite_url_path("sqlite:////tmp/x.db").unwrap(), PathBuf::from("/tmp/x.db"));
        assert_eq!(sqlite_url_path("sqlite:///buffer/x.db").unwrap(), PathBuf::from("buffer/x.db"));
        assert!(sqlite_url_path("postgres://x").is_err());
    }

    #[test]
    fn write_then_take_in_fifo_order_consumes_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("b/exp.db")).unwrap();
        store.write_batch(&[exp(0, 0), exp(1, 0), exp(2, 0)]).unwrap();
        assert!(store.take_batch(4, None, None).unwrap().is_none());
        let batch = store.take_batch(2, None, None).unwrap().unwrap();
        assert_eq!(batch.iter().map(|(_, e)| e.eid.task).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(batch[0].1, exp(0, 0));
        assert_eq!(store.unconsumed_count().unwrap(), 1);
        assert!(store.take_batch(2, None, None).unwrap().is_none());
        assert_eq!(store.total_count().unwrap(), 3);
    }

    #[test]
    fn stale_rows_are_skipped_not_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("exp.db")).unwrap();
        store.write_batch(&[exp(0, 1), exp(1, 5), exp(2, 6)]).unwrap();
        let batch = store.take_batch(2, Some(5), None).unwrap().unwrap();
        assert_eq!(batch.iter().map(|(_, e)| e.eid.task).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(store.total_count().unwrap(), 3);
    }

    #[test]
    fn invalid_batches_are_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("exp.db")).unwrap();
        let mut bad = exp(1, 0);
        bad.action_mask.push(true);
        assert!(store.write_batch(&[exp(0, 0), bad]).is_err());
        assert_eq!(store.total_count().unwrap(), 0);
    }

    #[test]
    fn an_uncommitted_transaction_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exp.db");
        let store = SqliteStore::open(&path).unwrap();
        store.write_batch(&[exp(0, 0)]).unwrap();
        {
            // A writer that dies between insert and commit: its transaction is dropped, never committed.
            let mut conn = Connection::open(&path).unwrap();
            let tx = conn.transaction().unwrap();
            tx.execute(
                "INSERT INTO experiences (uid, group_id, model_version, reward, created_at, experience)
                 VALUES ('x', 'g', 0, 0.0, 0.0, '{half')",
                [],
            )
            .unwrap();
        }
        assert_eq!(store.total_count().unwrap(), 1);
        assert_eq!(store.unconsumed().unwrap().len(), 1);
    }

    #[test]
    fn mark_consumed_and_unconsumed() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("exp.db")).unwrap();
        let ids = store.write_batch(&[exp(0, 0), exp(1, 0), exp(2, 0)]).unwrap();
        store.mark_consumed(&ids[..2]).unwrap();
        let left = store.unconsumed().unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].0, ids[2]);
    }

    #[tokio::test]
    async fn read_batch_times_out_without_consuming() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("exp.db")).unwrap();
        store.write_batch(&[exp(0, 0)]).unwrap();
        let err =
            store.read_batch(2, Duration::from_millis(30), Duration::from_millis(5), None, None).await.unwrap_err();
        assert!(matches!(err, BufferError::Timeout { available: 1, .. }), "{err}");
        store.write_batch(&[exp(1, 0)]).unwrap();
        let batch = store.read_batch(2, Duration::from_millis(30), Duration::from_millis(5), None, None).await.unwrap();
        assert_eq!(batch.len(), 2);
    }

    #[test]
    fn release_after_and_explored_after_support_resume() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("b.db")).unwrap();
        store.write_step(&[exp(1, 0), exp(2, 0)], Some((1, "{\"pos\":1}"))).unwrap();
        store.write_step(&[exp(3, 0), exp(4, 0)], Some((2, "{\"pos\":2}"))).unwrap();
        store.write_step(&[exp(5, 0)], Some((3, "{\"pos\":3}"))).unwrap();
        assert_eq!(store.take_batch(2, None, Some(1)).unwrap().unwrap()[0].1.eid.task, 1);
        assert_eq!(store.take_batch(2, None, Some(2)).unwrap().unwrap()[0].1.eid.task, 3);
        // The run died after train step 2 but its last checkpoint is step 1: step 2's rows come back.
        assert_eq!(store.release_after(1).unwrap(), 2);
        assert_eq!(store.unconsumed_count().unwrap(), 3);
        let redo = store.take_batch(2, None, Some(2)).unwrap().unwrap();
        assert_eq!(redo.iter().map(|(_, e)| e.eid.task).collect::<Vec<_>>(), [3, 4]);
        let after = store.explored_after(1).unwrap();
        assert_eq!(after.iter().map(|s| (s.step, s.count)).collect::<Vec<_>>(), [(2, 2), (3, 1)]);
        assert_eq!(after[1].state, "{\"pos\":3}");
        // Reopening keeps it all (and the schema upgrade is idempotent).
        drop(store);
        let store = SqliteStore::open(&dir.path().join("b.db")).unwrap();
        assert_eq!(store.explored_after(0).unwrap().len(), 3);
        assert_eq!(store.unconsumed_count().unwrap(), 1);
    }
}
