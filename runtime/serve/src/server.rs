//! Starting, routing and stopping the server, and the small endpoints (`/v1/models`, `/health`, `/metrics`,
//! `/feedback`, `/commit`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use trinity_explorer::{OpenAiView, RolloutModel};

use crate::error::{ApiError, ServeError};
use crate::ids::IdGenerator;
use crate::metrics::{Metrics, Snapshot};
use crate::reasoning::ReasoningParser;
use crate::recorder::{ExperienceSink, Feedback, Recorder};
use crate::request_guard::RequestGuard;
use crate::target::Recording;
use crate::{chat, completions, params};

/// How the server listens and what it accepts.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeOptions {
    /// Where to listen: `explorer.listen_address:explorer.proxy_port` in Trinity's config (`127.0.0.1:8010` by
    /// default here; Trinity-RFT's `0.0.0.0` must be asked for); port 0 picks a free port (see
    /// [`ServerHandle::local_addr`]).
    pub address: SocketAddr,
    /// Bearer keys a request may carry (`Authorization: Bearer <key>`, as OpenAI's API takes them); when any is
    /// set, every request on every endpoint needs one (401 otherwise). Empty: no key is asked for.
    pub api_keys: Vec<String>,
    /// The model name `/v1/models` lists; a request naming another model gets 404 (one that names none gets
    /// this one).
    pub model_name: String,
    /// Forces every request's sampling temperature. Trinity's serve mode uses `model.temperature`, so the
    /// recorded logprobs are the ones the trainer recomputes at the rollout temperature; `None` honours each
    /// request's `temperature` (default 1).
    pub temperature: Option<f32>,
    /// Most recorded experiences held until committed (a request that would exceed it gets 429 before it
    /// generates anything).
    pub max_pending_experiences: usize,
    /// Largest request body accepted, in bytes (413 above). The server lowers it to what the longest prompt its
    /// models accept can take (8 bytes a byte of it, at least 1 MiB), so a body far over any prompt is refused
    /// unread.
    pub max_request_bytes: usize,
    /// Whether `tool_choice: "auto"` (the default when a request has `tools`) parses hermes `<tool_call>` blocks
    /// into `tool_calls`; without it such a request is refused, as vLLM refuses it without
    /// `--enable-auto-tool-choice` (Trinity's `enable_auto_tool_choice` with `tool_call_parser: hermes`).
    pub auto_tool_choice: bool,
    /// Splits `<think>` text from chat replies into `reasoning_content` (vLLM's `--reasoning-parser`, Trinity's
    /// `reasoning_parser`); `None` returns the whole text as content.
    pub reasoning_parser: Option<ReasoningParser>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            address: SocketAddr::from(([127, 0, 0, 1], 8010)),
            api_keys: Vec::new(),
            model_name: "trinity".into(),
            temperature: None,
            max_pending_experiences: 100_000,
            max_request_bytes: 16 << 20,
            auto_tool_choice: true,
            reasoning_parser: None,
        }
    }
}

/// Everything the handlers share.
pub(crate) struct AppState {
    pub(crate) rollout: Arc<RolloutModel>,
    pub(crate) options: ServeOptions,
    pub(crate) recording: Recording,
    pub(crate) metrics: Metrics,
    pub(crate) ids: IdGenerator,
    /// The vocabularies forced tool choices and response formats are sampled over, and their recent constraints.
    pub(crate) constraints: crate::constrained::Constraints,
    guard: RequestGuard,
    shutting_down: AtomicBool,
    created: u64,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("options", &self.options).finish_non_exhaustive()
    }
}

/// A running server. Dropping it shuts the server down gracefully in the background (without a last commit);
/// [`ServerHandle::shutdown`] does the same, commits what was rewarded, and waits.
#[derive(Debug)]
pub struct ServerHandle {
    address: SocketAddr,
    state: Arc<AppState>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

/// Binds `options.address` and serves the rollout model on the current Tokio runtime until the returned handle
/// shuts it down.
///
/// The server generates through `rollout`'s engine in this process (no second HTTP hop), so requests from
/// any number of clients batch together with each other (and with any workflows sharing the engine). It
/// holds no lock on the engine: weight syncs (`Engine::sync_weights`) run between decode steps while requests
/// are in flight, and each recorded experience carries `rollout.model_version()` from when its request started.
/// Committed experiences go to `sink`.
///
/// Errors: the address cannot be bound.
pub async fn serve(
    options: ServeOptions,
    rollout: Arc<RolloutModel>,
    sink: Arc<dyn ExperienceSink>,
) -> Result<ServerHandle, ServeError> {
    let listener = tokio::net::TcpListener::bind(options.address)
        .await
        .map_err(|source| ServeError::Bind { address: options.address, source })?;
    let recording = Recording::Feedback(Arc::new(Recorder::new(options.max_pending_experiences, sink)));
    start(listener, options, rollout, recording)
}

/// Serves the rollout model to workflows (`explorer.rollout_model.enable_openai_api`) on a free loopback port,
/// on the current Tokio runtime, and hands the rollout model its [`OpenAiView`] (so
/// [`RolloutModel::openai_session`] gives each workflow run a base URL of its own).
///
/// Requests on a run's URL (`/runs/<key>/v1/...`) are filed under that run when `history` is on
/// (`enable_history`); those on the plain `/v1/...` URL are answered and not recorded. The rollout model samples
/// at `options.temperature` when set, auxiliary models at the temperature each request asks. There is no
/// `/feedback` or `/commit`: the workflow rewards its own experiences.
///
/// Errors: no loopback port can be bound, or no Tokio runtime is running on this thread.
pub fn serve_workflows(
    options: ServeOptions,
    rollout: Arc<RolloutModel>,
    history: bool,
) -> Result<ServerHandle, ServeError> {
    let address = SocketAddr::from(([127, 0, 0, 1], 0));
    let bound = std::net::TcpListener::bind(address)
        .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
        .map_err(|source| ServeError::Bind { address, source })?;
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(ServeError::Task("the OpenAI-compatible server needs a running Tokio runtime".into()));
    }
    let listener = tokio::net::TcpListener::from_std(bound)?;
    let origin = format!("http://{}", listener.local_addr()?);
    let view = Arc::new(OpenAiView::new(origin, options.model_name.clone(), history));
    rollout.set_openai_view(Arc::clone(&view));
    start(listener, options, rollout, Recording::Workflows(view))
}

fn start(
    listener: tokio::net::TcpListener,
    mut options: ServeOptions,
    rollout: Arc<RolloutModel>,
    recording: Recording,
) -> Result<ServerHandle, ServeError> {
    let address = listener.local_addr()?;
    options.max_request_bytes = options.max_request_bytes.min(request_limit(&rollout));
    if matches!(recording, Recording::Feedback(_)) {
        if address.ip().is_unspecified() && options.api_keys.is_empty() {
            tracing::warn!(
                %address,
                "serve listens on every network interface without an API key: anyone who can reach this machine \
                 can generate, reward and commit experiences (set TRINITY_SERVE_API_KEY, or listen_address 127.0.0.1)"
            );
        }
        tracing::info!(
            %address,
            api_key = !options.api_keys.is_empty(),
            max_request_bytes = options.max_request_bytes,
            "serve listens"
        );
    }
    let guard = RequestGuard::new(address, options.api_keys.clone());
    let state = Arc::new(AppState {
        rollout,
        recording,
        options,
        metrics: Metrics::default(),
        ids: IdGenerator::new(),
        constraints: Default::default(),
        guard,
        shutting_down: AtomicBool::new(false),
        created: crate::ids::unix_seconds(),
    });
    let app = router(Arc::clone(&state));
    let (stop, stopped) = oneshot::channel::<()>();
    let signal_state = Arc::clone(&state);
    let shutdown = async move {
        // A dropped handle counts as a shutdown request.
        let _ = stopped.await;
        signal_state.shutting_down.store(true, Ordering::SeqCst);
        tracing::info!("serve: shutting down; requests in flight finish first");
    };
    let task = tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(shutdown).await });
    tracing::info!(%address, model = %state.options.model_name, "serving the rollout model over the OpenAI API");
    Ok(ServerHandle { address, state, stop: Some(stop), task })
}

impl ServerHandle {
    /// The address the server listens on (with the actual port when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// The OpenAI base URL clients use: `http://<address>/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.address)
    }

    /// Stops accepting connections, answers new requests on open connections with 503, lets requests in
    /// flight finish (streams included), commits every rewarded experience not yet committed (as `POST /commit`
    /// would), and returns when the server has stopped. What cannot be handed over (never rewarded, or refused by
    /// the sink) is counted in a warning that names the responses.
    pub async fn shutdown(mut self) -> Result<(), ServeError> {
        self.state.shutting_down.store(true, Ordering::SeqCst);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let state = Arc::clone(&self.state);
        let served = self.join().await;
        if let Recording::Feedback(recorder) = &state.recording {
            recorder.commit_at_shutdown().await;
        }
        served
    }

    /// Serves until `signal` completes (Ctrl-C, the end of a run), then shuts down as
    /// [`ServerHandle::shutdown`] does. Returns early with the error if the server fails.
    pub async fn run_until<F: Future<Output = ()>>(mut self, signal: F) -> Result<(), ServeError> {
        tokio::select! {
            () = signal => self.shutdown().await,
            result = &mut self.task => flatten(result),
        }
    }

    async fn join(self) -> Result<(), ServeError> {
        flatten(self.task.await)
    }
}

fn flatten(result: Result<std::io::Result<()>, tokio::task::JoinError>) -> Result<(), ServeError> {
    match result {
        Ok(result) => Ok(result?),
        Err(error) => Err(ServeError::Task(error.to_string())),
    }
}

fn router(state: Arc<AppState>) -> Router {
    let mut router = Router::new()
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics));
    router = match &state.recording {
        Recording::Feedback(_) => router.route("/feedback", post(feedback)).route("/commit", post(commit)),
        // Each workflow run has a base URL of its own, so its replies are filed under it.
        Recording::Workflows(_) => router
            .route("/runs/{run}/v1/chat/completions", post(chat::handle))
            .route("/runs/{run}/v1/completions", post(completions::handle))
            .route("/runs/{run}/v1/models", get(models)),
    };
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(Arc::clone(&state), refuse_while_stopping))
        // Inside the guard, so a refused request never waits for a permit.
        .layer(middleware::from_fn_with_state(crate::large_requests::permits(), crate::large_requests::bound))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), guard))
        .with_state(state)
}

/// The largest body worth reading: 8 bytes (a JSON escape is at most 6) for each byte the longest prompt any
/// served model accepts can have (its tokenizer's [`trinity_model::Tokenizer::max_text_bytes`] of its
/// `max_model_len`), at least 1 MiB for the rest of a request (tools, a batch of prompts). `usize::MAX` (no
/// lower limit) when a tokenizer gives no such bound.
pub(crate) fn request_limit(rollout: &RolloutModel) -> usize {
    let longest = |model: &RolloutModel| {
        model.tokenizer().max_text_bytes(model.engine().info().max_model_len).map(|bytes| bytes.saturating_mul(8))
    };
    let mut limit = longest(rollout);
    for aux in rollout.auxiliary_models() {
        limit = limit.zip(longest(aux.model().as_ref())).map(|(a, b)| a.max(b));
    }
    limit.map_or(usize::MAX, |bytes| bytes.max(1 << 20))
}

/// Refuses what the [`RequestGuard`] refuses (foreign `Host`, no key, cross-site, not JSON) before any handler
/// reads the body.
async fn guard(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    match state.guard.check(request.method(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}

/// The recorder of mode `serve`; the workflows' view has none (404 for `/feedback` and `/commit`).
fn recorder(state: &AppState) -> Result<&Arc<Recorder>, ApiError> {
    match &state.recording {
        Recording::Feedback(recorder) => Ok(recorder),
        Recording::Workflows(_) => Err(ApiError::not_found("workflows reward their own experiences", None)),
    }
}

/// 503 for everything but `/metrics` once shutdown has begun (requests already in their handlers go on).
async fn refuse_while_stopping(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if state.shutting_down.load(Ordering::SeqCst) && request.uri().path() != "/metrics" {
        return ApiError::shutting_down().into_response();
    }
    next.run(request).await
}

/// The request body, up to `max_request_bytes` (413 above).
pub(crate) async fn read_body(state: &AppState, request: Request) -> Result<Bytes, ApiError> {
    let limit = state.options.max_request_bytes;
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ApiError::too_large(limit));
    }
    // With the declared length in bounds, the only failures left are an undeclared body over the limit and a
    // connection that broke (whose client never sees the answer).
    axum::body::to_bytes(request.into_body(), limit).await.map_err(|_| ApiError::too_large(limit))
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    let mut data = Vec::new();
    for name in state.served_names() {
        let Ok(target) = state.target(Some(&name), None) else { continue };
        data.push(json!({
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "trinity",
            "root": name,
            "max_model_len": target.model.engine().info().max_model_len,
            "model_version": target.model.model_version(),
        }));
    }
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    Json(json!({"status": "ok", "model_version": state.rollout.model_version()})).into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let engine = state.rollout.engine();
    let snapshot = Snapshot {
        engine: engine.stats(),
        info: engine.info(),
        recorder: recorder(&state).ok().map(|r| r.stats()),
        model_version: state.rollout.model_version(),
    };
    let text = state.metrics.render(&snapshot);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn feedback(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let started = Instant::now();
    let result = async {
        let body = read_body(&state, request).await?;
        let map = params::object(&body)?;
        let feedback: Feedback = params::typed(&map)?;
        let recorder = recorder(&state)?;
        let updated = recorder.feedback(&feedback)?;
        let stats = recorder.stats();
        Ok::<_, ApiError>(
            json!({"status": "ok", "updated": updated, "pending": stats.pending, "rewarded": stats.rewarded}),
        )
    }
    .await;
    respond("feedback", &state, started, result)
}

async fn commit(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let started = Instant::now();
    let result = async {
        let body = read_body(&state, request).await?;
        // The body is optional; when present it must be an (empty) object.
        if !body.iter().all(u8::is_ascii_whitespace) {
            let map = params::object(&body)?;
            if let Some(unknown) = map.keys().next() {
                return Err(ApiError::invalid(Some(unknown.clone()), format!("`/commit` takes no field `{unknown}`")));
            }
        }
        recorder(&state)?.commit().await
    }
    .await;
    respond("commit", &state, started, result)
}

fn respond(
    endpoint: &'static str,
    state: &AppState,
    started: Instant,
    result: Result<serde_json::Value, ApiError>,
) -> Response {
    let (status, response) = match result {
        Ok(body) => (StatusCode::OK, Json(body).into_response()),
        Err(error) => (error.status, error.into_response()),
    };
    state.metrics.request_done(endpoint, status.as_u16(), started.elapsed());
    response
}

async fn not_found(request: Request) -> Response {
    ApiError::not_found(format!("no route for {} {}", request.method(), request.uri().path()), None).into_response()
}

async fn method_not_allowed(request: Request) -> Response {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!("{} is not allowed on {}", request.method(), request.uri().path()),
        kind: "invalid_request_error",
        param: None,
        code: Some("method_not_allowed"),
    }
    .into_response()
}
