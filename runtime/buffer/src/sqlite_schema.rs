//! The SQLite buffer's schema and its migrations, versioned with `PRAGMA user_version`.
//!
//! Version 0 is every database written before the version was recorded: an `experiences` table with JSON text
//! payloads (with or without `train_step`) and an `explore_steps` table keyed by step alone. Migrating it keeps
//! every row: its experiences and steps belong to producer [`LEGACY_PRODUCER`], its claims to
//! [`DEFAULT_CONSUMER`] (the one-process run that made them resumes as that consumer and gets its uncommitted
//! rows back), and a uid repeated in it gets its row id appended so that the new unique key holds. Claims
//! without a train step (consumed before resume existed) can never be released, so they are made final.
//!
//! Each migration runs in one `BEGIN IMMEDIATE` transaction: two processes opening the same old database take
//! turns, and the second finds it migrated.

use rusqlite::{Connection, TransactionBehavior};

use crate::store::{DEFAULT_CONSUMER, LEGACY_PRODUCER, Migration};

/// The schema version this code writes.
pub(crate) const VERSION: i64 = 1;

const TABLES: &str = "
CREATE TABLE IF NOT EXISTS explore_steps (
    producer TEXT NOT NULL,
    step INTEGER NOT NULL,
    count INTEGER NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (producer, step)
);
CREATE TABLE IF NOT EXISTS producers (
    name TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    last_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS consumers (
    name TEXT PRIMARY KEY,
    last_seen REAL NOT NULL,
    committed_step INTEGER
);
";

const EXPERIENCES: &str = "
CREATE TABLE experiences (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    producer TEXT NOT NULL,
    uid TEXT NOT NULL,
    group_id TEXT NOT NULL,
    model_version INTEGER NOT NULL,
    reward REAL NOT NULL,
    consumed INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    train_step INTEGER,
    consumer TEXT,
    committed INTEGER NOT NULL DEFAULT 0,
    experience BLOB NOT NULL
);
";

/// Indexes of version 1: the idempotency key, the waiting rows in order, the open claims, a consumer's claims.
const INDEXES: &str = "
CREATE UNIQUE INDEX IF NOT EXISTS experiences_by_key ON experiences (producer, uid);
CREATE INDEX IF NOT EXISTS experiences_waiting ON experiences (id) WHERE consumed = 0;
CREATE INDEX IF NOT EXISTS experiences_open_claims ON experiences (id) WHERE consumed = 1 AND committed = 0;
CREATE INDEX IF NOT EXISTS experiences_by_claim ON experiences (consumer, train_step);
";

/// Brings the database to [`VERSION`].
pub(crate) fn migrate(conn: &mut Connection) -> rusqlite::Result<Migration> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    if version == VERSION {
        return Ok(Migration::Current);
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Read again under the write lock: another process may have migrated meanwhile.
    let version: i64 = tx.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    let outcome = match version {
        VERSION => return Ok(Migration::Current),
        found if found > VERSION => return Ok(Migration::TooNew { found }),
        _ if !table_exists(&tx, "experiences")? => {
            tx.execute_batch(EXPERIENCES)?;
            Migration::Created
        }
        from => {
            upgrade_legacy(&tx)?;
            Migration::Migrated { from }
        }
    };
    tx.execute_batch(TABLES)?;
    tx.execute_batch(INDEXES)?;
    tx.pragma_update(None, "user_version", VERSION)?;
    tx.commit()?;
    Ok(outcome)
}

/// Version 0 → 1 (see the module docs).
fn upgrade_legacy(tx: &Connection) -> rusqlite::Result<()> {
    if !column_exists(tx, "experiences", "train_step")? {
        tx.execute_batch("ALTER TABLE experiences ADD COLUMN train_step INTEGER")?;
    }
    tx.execute_batch(&format!(
        "ALTER TABLE experiences ADD COLUMN producer TEXT NOT NULL DEFAULT '{LEGACY_PRODUCER}';
         ALTER TABLE experiences ADD COLUMN consumer TEXT;
         ALTER TABLE experiences ADD COLUMN committed INTEGER NOT NULL DEFAULT 0;
         UPDATE experiences SET consumer = '{DEFAULT_CONSUMER}' WHERE consumed != 0;
         UPDATE experiences SET committed = 1 WHERE consumed != 0 AND train_step IS NULL;
         UPDATE experiences SET uid = uid || '#' || id
             WHERE id NOT IN (SELECT MIN(id) FROM experiences GROUP BY uid);
         DROP INDEX IF EXISTS experiences_by_state;"
    ))?;
    if table_exists(tx, "explore_steps")? {
        tx.execute_batch(&format!(
            "ALTER TABLE explore_steps RENAME TO explore_steps_v0;
             {TABLES}
             INSERT INTO explore_steps (producer, step, count, state, created_at)
                 SELECT '{LEGACY_PRODUCER}', step, count, state, 0.0 FROM explore_steps_v0;
             DROP TABLE explore_steps_v0;"
        ))?;
    }
    Ok(())
}

fn table_exists(conn: &Connection, table: &str) -> rusqlite::Result<bool> {
    conn.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1")?.exists([table])
}

fn column_exists(conn: &Connection, table: &str, column: &str) -> rusqlite::Result<bool> {
    conn.prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?.exists([table, column])
}

/// The schema of the last release before versioning, for the migration tests.
#[cfg(test)]
pub(crate) const LEGACY_SCHEMA: &str = "
CREATE TABLE experiences (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uid TEXT NOT NULL,
    group_id TEXT NOT NULL,
    model_version INTEGER NOT NULL,
    reward REAL NOT NULL,
    consumed INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    experience TEXT NOT NULL,
    train_step INTEGER
);
CREATE INDEX experiences_by_state ON experiences (consumed, id);
CREATE TABLE explore_steps (
    step INTEGER PRIMARY KEY,
    count INTEGER NOT NULL,
    state TEXT NOT NULL
);
";
