//! The HTTP side: the page and its assets, and the JSON API the page calls.
//!
//! Every handler that touches files runs on a blocking thread, so a slow disk never stalls the others. Files are
//! read through per-file caches ([`MetricsLog`], [`ExperienceIndex`]) that only read what was appended since the
//! last request. A run deleted while viewed answers 404 naming it; the caches drop it. Every request passes the
//! `request_guard` first, which refuses foreign `Host`s and changes from other pages before a body is read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::assets;
use crate::config_api;
use crate::error::StudioError;
use crate::failed_tasks::{FailedFilter, FailedTaskIndex};
use crate::host::Host;
use crate::metrics::{MetricsLog, headline, series};
use crate::query::Query;
use crate::request_guard::{self, RequestGuard};
use crate::rollouts::{ExperienceIndex, Filter};
use crate::run_record::RunRecord;
use crate::runs::{self, RunSummary};
use crate::tail::{IndexEntry, LineIndex};

/// Rows a rollouts page may ask for at once.
const MAX_PAGE: usize = 200;

/// The largest request body read (a config to validate or save, as JSON). Configs are a few KiB; this is far above
/// any, and below axum's 2 MB default, which would apply anyway.
const MAX_BODY: usize = 1 << 20;

/// Everything the handlers share.
pub(crate) struct AppState {
    pub(crate) root: PathBuf,
    /// Where configs are saved and relative paths in them resolve.
    pub(crate) workdir: PathBuf,
    /// Example configs offered as starting points.
    pub(crate) examples: Option<PathBuf>,
    pub(crate) host: Arc<dyn Host>,
    /// `index.html` with this session's token in it.
    page: String,
    metrics: Mutex<HashMap<PathBuf, MetricsLog>>,
    experiences: Mutex<HashMap<PathBuf, ExperienceIndex>>,
    failed: Mutex<HashMap<PathBuf, FailedTaskIndex>>,
    /// Token texts by model path and token id.
    tokens: Mutex<HashMap<PathBuf, HashMap<u32, String>>>,
}

impl AppState {
    pub(crate) fn new(
        root: PathBuf,
        workdir: PathBuf,
        examples: Option<PathBuf>,
        host: Arc<dyn Host>,
        page: String,
    ) -> AppState {
        AppState {
            root,
            workdir,
            examples,
            host,
            page,
            metrics: Mutex::default(),
            experiences: Mutex::default(),
            failed: Mutex::default(),
            tokens: Mutex::default(),
        }
    }
}

/// Locks a cache. A handler that panicked mid-update leaves at worst a stale entry, which the next refresh
/// rereads, so a poisoned lock is taken over.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn router(state: Arc<AppState>, guard: Arc<RequestGuard>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/assets/{file}", get(asset))
        .route("/api/runs", get(list_runs))
        .route("/api/metrics", get(metric_names))
        .route("/api/series", get(metric_series))
        .route("/api/rollouts", get(rollouts))
        .route("/api/groups", get(groups))
        .route("/api/failed", get(failed_tasks))
        .route("/api/plugins", get(plugins))
        .route("/api/schema", get(config_api::schema))
        .route("/api/examples", get(config_api::examples))
        .route("/api/example", get(config_api::example))
        .route("/api/config/validate", post(config_api::validate))
        .route("/api/config/save", post(config_api::save))
        .with_state(state)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        // The outermost layer: a refused request reaches no handler and no body extractor.
        .layer(middleware::from_fn_with_state(guard, request_guard::guard))
}

/// Runs `work` on a blocking thread.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StudioError> + Send + 'static,
) -> Result<T, StudioError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| StudioError::Host(format!("a studio task failed: {e}")))?
}

async fn index(State(state): State<Arc<AppState>>) -> Response {
    // Not cached: the page carries this session's token, and a studio started again has a new one.
    let headers = [(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")];
    (headers, state.page.clone()).into_response()
}

async fn asset(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    match assets::find(&file) {
        Some(asset) => ([(header::CONTENT_TYPE, asset.content_type)], asset.body).into_response(),
        None => (StatusCode::NOT_FOUND, format!("no asset {file}")).into_response(),
    }
}

async fn list_runs(State(state): State<Arc<AppState>>) -> Result<axum::Json<Value>, StudioError> {
    blocking(move || {
        let ids = runs::find_runs(&state.root);
        let summaries: Vec<RunSummary> = ids.iter().map(|id| summarize(&state, id)).collect();
        // Forget the files of runs that are gone, so a long-lived studio does not keep them.
        lock(&state.metrics).retain(|path, _| path.exists());
        lock(&state.experiences).retain(|path, _| path.exists());
        lock(&state.failed).retain(|path, _| path.exists());
        Ok(axum::Json(json!({ "root": state.root.display().to_string(), "runs": summaries })))
    })
    .await
}

/// Refreshes the cached logs of `files` and runs `read` over them (those that could be read).
fn with_metrics<T>(state: &AppState, files: &[PathBuf], read: impl FnOnce(&[&MetricsLog]) -> T) -> T {
    let mut cache = lock(&state.metrics);
    for file in files {
        let log = cache.entry(file.clone()).or_insert_with(|| MetricsLog::new(file));
        if let Err(error) = log.refresh() {
            tracing::debug!("studio: {}: {error}", file.display());
        }
    }
    let logs: Vec<&MetricsLog> = files.iter().filter_map(|file| cache.get(file)).collect();
    read(&logs)
}

fn summarize(state: &AppState, id: &str) -> RunSummary {
    let dir = state.root.join(id);
    let records = RunRecord::read_all(&dir);
    let (status, error) = runs::status_of(&records);
    let (project, group, name) = runs::names_of(id, &records);
    let files = runs::metrics_files(&dir);
    let (steps_done, last_reward, eval) = with_metrics(state, &files, |logs| {
        let steps_done = logs.iter().filter_map(|log| log.max_step()).max();
        let latest = |name: &str| logs.iter().filter_map(|log| log.last(name)).max_by_key(|(step, _)| *step);
        let last_reward = latest("rollout/reward_mean").map(|(_, v)| v);
        let eval = logs
            .iter()
            .flat_map(|log| log.names())
            .filter(|name| name.starts_with("eval/") && name.ends_with("/accuracy"))
            .filter_map(|name| latest(name).map(|(step, value)| (step, value, name.clone())))
            .max_by_key(|(step, _, _)| *step);
        (steps_done, last_reward, eval)
    });
    let updated_at = files.iter().filter_map(|file| runs::modified(file)).max().or_else(|| runs::modified(&dir));
    RunSummary {
        id: id.to_owned(),
        project,
        group,
        name,
        mode: records.first().map(|r| r.mode.clone()),
        status,
        error,
        steps_done,
        total_steps: runs::planned_steps(&dir),
        last_reward,
        eval_accuracy: eval.as_ref().map(|(_, value, _)| *value),
        eval_metric: eval.map(|(_, _, name)| name),
        model: records.first().map(|r| r.model_path.clone()).filter(|m| !m.is_empty()),
        checkpoints: runs::checkpoints(&dir),
        updated_at,
        records,
    }
}

async fn metric_names(
    State(state): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Result<axum::Json<Value>, StudioError> {
    blocking(move || {
        let query = Query::parse(raw.as_deref());
        let id = query.require("run")?;
        let dir = runs::run_dir(&state.root, id)?;
        let files = runs::metrics_files(&dir);
        if files.is_empty() {
            return Err(StudioError::Missing { id: id.to_owned(), what: "metrics (monitor/metrics.jsonl)".into() });
        }
        let body = with_metrics(&state, &files, |logs| {
            let mut names: Vec<&String> = logs.iter().flat_map(|log| log.names()).collect();
            names.sort();
            names.dedup();
            let skipped: Vec<Value> = logs
                .iter()
                .zip(&files)
                .filter(|(log, _)| log.skipped().1 > 0)
                .map(|(log, file)| {
                    let (lines, count) = log.skipped();
                    json!({ "file": relative(&dir, file), "count": count, "lines": lines })
                })
                .collect();
            let preselected = headline(&names);
            json!({ "run": id, "names": names, "preselected": preselected, "skipped": skipped })
        });
        Ok(axum::Json(body))
    })
    .await
}

async fn metric_series(
    State(state): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Result<axum::Json<Value>, StudioError> {
    blocking(move || {
        let query = Query::parse(raw.as_deref());
        let id = query.require("run")?;
        let names = query.all("name");
        if names.is_empty() {
            return Err(StudioError::query("name", "give at least one metric name"));
        }
        let dir = runs::run_dir(&state.root, id)?;
        let files = runs::metrics_files(&dir);
        if files.is_empty() {
            return Err(StudioError::Missing { id: id.to_owned(), what: "metrics (monitor/metrics.jsonl)".into() });
        }
        let series = with_metrics(&state, &files, |logs| series(logs, &names));
        Ok(axum::Json(json!({ "run": id, "steps": series.steps, "values": series.values })))
    })
    .await
}

/// The file of `files` (a run's experiences or failed-task files) a request names (`file=`), or the first; `None`
/// when the run has none. A name the run does not have is refused, so a request never reads outside the run.
fn pick_file(query: &Query, id: &str, files: &[String], what: &str) -> Result<Option<String>, StudioError> {
    match query.get("file") {
        Some(file) if files.iter().any(|f| f == file) => Ok(Some(file.to_owned())),
        Some(file) => Err(StudioError::query("file", format!("run `{id}` has no {what} file `{file}`"))),
        None => Ok(files.first().cloned()),
    }
}

/// A page's `offset` and `limit` (at most [`MAX_PAGE`]).
fn page_bounds(query: &Query) -> Result<(usize, usize), StudioError> {
    let offset = query.parsed::<usize>("offset")?.unwrap_or(0);
    let limit = query.parsed::<usize>("limit")?.unwrap_or(20).min(MAX_PAGE);
    Ok((offset, limit))
}

/// The experiences file a request names (`file=`), or the run's first; only files the run has are accepted.
fn experiences_file(state: &AppState, query: &Query) -> Result<(PathBuf, Vec<String>, String), StudioError> {
    let id = query.require("run")?;
    let dir = runs::run_dir(&state.root, id)?;
    let files = runs::experience_files(&dir);
    let chosen = pick_file(query, id, &files, "experiences")?
        .ok_or_else(|| StudioError::Missing { id: id.to_owned(), what: "experiences (experiences.jsonl)".into() })?;
    Ok((dir.join(&chosen), files, chosen))
}

/// Runs `read` over the refreshed index of `path`, kept in `cache`; an index whose file cannot be read (the run
/// was deleted) is dropped from it.
fn with_index<E: IndexEntry, T>(
    cache: &Mutex<HashMap<PathBuf, LineIndex<E>>>,
    path: &Path,
    read: impl FnOnce(&LineIndex<E>) -> Result<T, StudioError>,
) -> Result<T, StudioError> {
    let mut cache = lock(cache);
    let index = cache.entry(path.to_owned()).or_insert_with(|| LineIndex::new(path));
    if let Err(source) = index.refresh() {
        cache.remove(path);
        return Err(StudioError::Io { path: path.to_owned(), source });
    }
    read(index)
}

async fn rollouts(
    State(state): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Result<axum::Json<Value>, StudioError> {
    blocking(move || {
        let query = Query::parse(raw.as_deref());
        let (path, files, file) = experiences_file(&state, &query)?;
        let filter = Filter {
            step: query.parsed("step")?,
            group: query.get("group").map(str::to_owned),
            reward_min: query.parsed("reward_min")?,
            reward_max: query.parsed("reward_max")?,
            truncated: query.flag("truncated")?,
        };
        let (offset, limit) = page_bounds(&query)?;
        let (steps, total, mut rows, skipped) = with_index(&state.experiences, &path, |index| {
            let (total, rows) = index.page(&filter, offset, limit).map_err(StudioError::io(&path))?;
            Ok((index.steps(), total, rows, index.skipped()))
        })?;
        let id = query.require("run")?;
        let token_error = attach_token_texts(&state, id, &mut rows).err();
        Ok(axum::Json(json!({
            "run": id, "files": files, "file": file, "steps": steps, "total": total, "offset": offset,
            "limit": limit, "rows": rows, "skipped_lines": skipped, "token_texts_error": token_error,
        })))
    })
    .await
}

/// Gives each row `token_texts`, the text of each response token under the run's tokenizer. Rows keep their ids
/// when the tokenizer cannot be had (the error is returned for the page to show).
fn attach_token_texts(state: &AppState, id: &str, rows: &mut [Value]) -> Result<(), String> {
    let records = RunRecord::read_all(&state.root.join(id));
    let Some(model) = records.iter().map(|r| PathBuf::from(&r.model_path)).find(|p| !p.as_os_str().is_empty()) else {
        return Err("the run has no record of its model (status/*.json), so its tokens cannot be decoded".into());
    };
    let ids = |row: &Value| -> Vec<u32> {
        row["response_tokens"].as_array().into_iter().flatten().filter_map(|t| t.as_u64()).map(|t| t as u32).collect()
    };
    let mut cache = lock(&state.tokens);
    let known = cache.entry(model.clone()).or_default();
    let mut missing: Vec<u32> = rows.iter().flat_map(&ids).filter(|t| !known.contains_key(t)).collect();
    missing.sort_unstable();
    missing.dedup();
    if !missing.is_empty() {
        let texts = state.host.token_texts(&model, &missing)?;
        known.extend(missing.into_iter().zip(texts));
    }
    for row in rows {
        let texts: Vec<Value> =
            ids(row).iter().map(|t| known.get(t).map_or(Value::Null, |s| Value::String(s.clone()))).collect();
        row["token_texts"] = Value::Array(texts);
    }
    Ok(())
}

async fn groups(State(state): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> Result<axum::Json<Value>, StudioError> {
    blocking(move || {
        let query = Query::parse(raw.as_deref());
        let (path, _, file) = experiences_file(&state, &query)?;
        let step: u64 = query.parsed("step")?.ok_or_else(|| StudioError::query("step", "missing"))?;
        let k = query.parsed::<usize>("k")?.unwrap_or(3);
        let groups = with_index(&state.experiences, &path, |index| Ok(index.groups(step)))?;
        // With fewer than 2k groups, the best take the upper half and the worst the rest: no group is both.
        let best: Vec<_> = groups.iter().take(k.min(groups.len().div_ceil(2))).collect();
        let worst: Vec<_> = groups.iter().rev().take(k.min(groups.len() - best.len())).collect();
        Ok(axum::Json(json!({ "file": file, "step": step, "groups": groups.len(), "best": best, "worst": worst })))
    })
    .await
}

/// The failed tasks of a run, paged: from the failed-task file a request names (`file=`), or the run's first. A run
/// without failures answers an empty page, not an error: that is the usual case.
async fn failed_tasks(
    State(state): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Result<axum::Json<Value>, StudioError> {
    blocking(move || {
        let query = Query::parse(raw.as_deref());
        let id = query.require("run")?;
        let dir = runs::run_dir(&state.root, id)?;
        let files = runs::failed_task_files(&dir);
        let (offset, limit) = page_bounds(&query)?;
        let Some(file) = pick_file(&query, id, &files, "failed-task")? else {
            return Ok(axum::Json(json!({
                "run": id, "files": files, "file": null, "steps": [], "total": 0, "offset": offset,
                "limit": limit, "rows": [], "skipped_lines": 0,
            })));
        };
        let filter = FailedFilter { step: query.parsed("step")?, phase: query.get("phase").map(str::to_owned) };
        let path = dir.join(&file);
        let (steps, total, rows, skipped) = with_index(&state.failed, &path, |index| {
            let (total, rows) = index.page(&filter, offset, limit).map_err(StudioError::io(&path))?;
            Ok((index.steps(), total, rows, index.skipped()))
        })?;
        Ok(axum::Json(json!({
            "run": id, "files": files, "file": file, "steps": steps, "total": total, "offset": offset,
            "limit": limit, "rows": rows, "skipped_lines": skipped,
        })))
    })
    .await
}

async fn plugins(State(state): State<Arc<AppState>>) -> Result<axum::Json<Value>, StudioError> {
    blocking(move || Ok(axum::Json(json!({ "plugins": state.host.plugins() })))).await
}

fn relative(dir: &Path, file: &Path) -> String {
    file.strip_prefix(dir).unwrap_or(file).display().to_string()
}
