//! The PostgreSQL buffer's schema: one PostgreSQL schema (namespace) per buffer, named after the buffer, holding
//! the same tables as the SQLite store, and a `schema_migrations` table that lists the migrations applied.
//!
//! Opening runs every migration newer than the last one applied, in one transaction that first takes an
//! advisory lock on the buffer's name, so explorers and trainers starting together create the tables once.
//! A database with a migration newer than this code knows is refused rather than misread.

use tokio_postgres::Client;

use crate::store::Migration;

/// Migrations in order; the version of the n-th (1-based) is n. Append only: a released migration never changes.
const MIGRATIONS: &[&str] = &["
CREATE TABLE experiences (
    id bigserial PRIMARY KEY,
    producer text NOT NULL,
    uid text NOT NULL,
    group_id text NOT NULL,
    model_version bigint NOT NULL,
    reward double precision NOT NULL,
    consumed smallint NOT NULL DEFAULT 0,
    created_at double precision NOT NULL DEFAULT EXTRACT(EPOCH FROM now())::float8,
    train_step bigint,
    consumer text,
    committed boolean NOT NULL DEFAULT false,
    experience bytea NOT NULL,
    UNIQUE (producer, uid)
);
CREATE INDEX experiences_waiting ON experiences (id) WHERE consumed = 0;
CREATE INDEX experiences_open_claims ON experiences (id) WHERE consumed = 1 AND NOT committed;
CREATE INDEX experiences_by_claim ON experiences (consumer, train_step);
CREATE TABLE explore_steps (
    producer text NOT NULL,
    step bigint NOT NULL,
    count bigint NOT NULL,
    state text NOT NULL,
    created_at double precision NOT NULL DEFAULT EXTRACT(EPOCH FROM now())::float8,
    PRIMARY KEY (producer, step)
);
CREATE TABLE producers (
    name text PRIMARY KEY,
    state text NOT NULL,
    last_seen double precision NOT NULL
);
CREATE TABLE consumers (
    name text PRIMARY KEY,
    last_seen double precision NOT NULL,
    committed_step bigint
);
"];

/// The schema version this code writes.
pub(crate) const VERSION: i64 = MIGRATIONS.len() as i64;

/// Creates the buffer's schema (`schema`, quoted) if missing and applies the migrations it lacks.
pub(crate) async fn migrate(client: &mut Client, schema: &str) -> Result<Migration, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&format!("trinity-buffer {schema}")]).await?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         SET LOCAL search_path TO {schema};
         CREATE TABLE IF NOT EXISTS schema_migrations (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         );"
    ))
    .await?;
    let found: i64 = tx.query_one("SELECT COALESCE(MAX(version), 0)::int8 FROM schema_migrations", &[]).await?.get(0);
    if found > VERSION {
        return Ok(Migration::TooNew { found });
    }
    if found == VERSION {
        return Ok(Migration::Current);
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.batch_execute(sql).await?;
        tx.execute("INSERT INTO schema_migrations (version) VALUES ($1)", &[&(index as i32 + 1)]).await?;
    }
    tx.commit().await?;
    Ok(if found == 0 { Migration::Created } else { Migration::Migrated { from: found } })
}
