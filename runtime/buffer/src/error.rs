//! The buffer's error type: every variant names the file, row, key or store that failed.

use std::path::PathBuf;

/// What went wrong while reading tasks or storing experiences.
#[derive(Debug, thiserror::Error)]
pub enum BufferError {
    #[error("cannot read `{path}`: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}` line {line}: invalid JSON: {source}")]
    JsonLine {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("`{path}` line {line}: not UTF-8 text (invalid byte at column {column}); JSON text must be UTF-8")]
    NotUtf8Line { path: PathBuf, line: usize, column: usize },
    #[error("`{path}`: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("`{path}` {location}: a task row must be a JSON object, found {found}")]
    NotAnObject { path: PathBuf, location: String, found: &'static str },
    #[error("`{path}`: a JSON taskset must be an array of row objects, found {found}")]
    NotAnArray { path: PathBuf, found: &'static str },
    #[error("`{path}` row {row}: cannot read Parquet: {source}")]
    ParquetRow {
        path: PathBuf,
        row: usize,
        #[source]
        source: parquet::errors::ParquetError,
    },
    #[error("`{path}`: cannot read Parquet: {source}")]
    Parquet {
        path: PathBuf,
        #[source]
        source: parquet::errors::ParquetError,
    },
    #[error("`{path}`: no files for split `{split}`; looked for {looked_for}")]
    NoSplitFiles { path: PathBuf, split: String, looked_for: String },
    #[error("`{path}`: unsupported taskset file type (expected .jsonl, .json, .parquet or a dataset directory)")]
    UnsupportedFile { path: PathBuf },
    #[error("taskset `{taskset}` is empty (`{path}`)")]
    EmptyTaskset { taskset: String, path: PathBuf },
    #[error("taskset `{taskset}`: storage type `{storage}` cannot be read as a taskset here")]
    UnsupportedStorage { taskset: String, storage: String },
    #[error(
        "taskset `{taskset}`: selector `{selector}` is not supported (use sequential, shuffle, random, \
         offline_easy2hard or difficulty_based)"
    )]
    UnsupportedSelector { taskset: String, selector: String },
    #[error("taskset `{taskset}`: data_selector: {problem}")]
    SelectorArgs { taskset: String, problem: String },
    #[error("taskset `{taskset}` row {row}: field `{key}` {problem}")]
    BadField { taskset: String, row: usize, key: String, problem: String },
    #[error("the tasksets hold {rows} rows in all, fewer than batch_size {batch_size}: not one full step")]
    TooFewRows { rows: usize, batch_size: usize },
    #[error("scheduler state does not match the tasksets: {reason}")]
    BadState { reason: String },
    #[error("SQLite store `{path}`: {source}")]
    Sqlite {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("PostgreSQL buffer `{url}`: {source}")]
    Postgres {
        /// The buffer's URL without its password.
        url: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("{store} row {id}: stored experience is unreadable: {problem}")]
    CorruptRow { store: String, id: i64, problem: String },
    #[error("{store}: {problem}")]
    CorruptRecord { store: String, problem: String },
    #[error(
        "{store}: schema version {found} is newer than this trinity understands ({supported}); use a newer trinity"
    )]
    SchemaTooNew { store: String, found: i64, supported: i64 },
    #[error("`{url}` is not a `sqlite:///` URL")]
    NotSqliteUrl { url: String },
    #[error(
        "experience buffer `{name}`: `{url}` is not a buffer URL (expected `sqlite:///path.db` or \
         `postgresql://user:password@host:port/database`)"
    )]
    UnsupportedUrl { name: String, url: String },
    #[error("experience {uid}: cannot serialise: {source}")]
    Encode {
        uid: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("experience {uid}: cannot compress: {source}")]
    Compress {
        uid: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "experience buffer `{name}`: consumer `{consumer}` already holds {held} experiences for train step {step}, \
         not the {wanted} asked for (release them with release_after first)"
    )]
    StepClaimMismatch { name: String, consumer: String, step: u64, held: usize, wanted: usize },
    #[error("experience {uid}: {problem}")]
    InvalidExperience { uid: String, problem: String },
    #[error("experience buffer `{name}` is closed")]
    Closed { name: String },
    #[error(
        "experience buffer `{name}`: timed out after {waited_s:.1} s waiting for {wanted} experiences ({available} available, left in the buffer)"
    )]
    Timeout { name: String, wanted: usize, available: usize, waited_s: f64 },
    #[error(
        "experience buffer `{name}`: waited {waited_s:.1} s (synchronizer.sync_timeout) for room to store \
         {incoming} experiences of explore step {step}: {waiting} wait to be claimed, capacity {capacity}; nothing \
         consumed them in that time (is the trainer running? is capacity at least the experiences of every explore \
         step the explorer may run ahead of the trainer?)"
    )]
    NoRoom { name: String, step: u64, incoming: usize, waiting: usize, capacity: usize, waited_s: f64 },
}

/// Shorthand used throughout the crate.
pub type Result<T, E = BufferError> = std::result::Result<T, E>;

/// The JSON type name used in error messages.
pub(crate) fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
