//! The API through the router, over run directories written the way `trinity run` writes them, with a host that
//! validates through the config crate itself (every component name accepted) and decodes token `n` as `<n>`.

use std::path::Path;
use std::sync::Arc;

use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{Map, Value, json};
use tower::ServiceExt;
use trinity_config::{Catalog, ComponentKind, ExperienceSchema, LoadOptions, Preset};

use crate::failed_tasks::tests::failure;
use crate::rollouts::tests::{line, write};
use crate::run_record::{RunRecord, RunStatus};
use crate::{Host, PluginRow, Problem, StudioOptions, Validation, router};

struct AnyName;

impl Catalog for AnyName {
    fn names(&self, _kind: ComponentKind) -> Vec<String> {
        Vec::new()
    }
    fn preset(&self, _algorithm_type: &str) -> Option<Preset> {
        Some(Preset { schema: ExperienceSchema::Experience, ..Preset::default() })
    }
    fn default_args(&self, _kind: ComponentKind, _name: &str) -> Option<Map<String, Value>> {
        None
    }
}

struct TestHost;

impl Host for TestHost {
    fn validate(&self, text: &str, path: &Path) -> Validation {
        let env = |_: &str| None;
        let options = LoadOptions { overrides: &[], env: &env, catalog: &AnyName, cwd: Path::new("/work") };
        match trinity_config::load_str(text, path, options) {
            Ok(loaded) => Validation {
                problems: Vec::new(),
                notes: loaded.notes.iter().map(ToString::to_string).collect(),
                resolved: Some(loaded.dry_run_yaml()),
            },
            Err(errors) => Validation {
                problems: errors.iter().map(Problem::from_config_error).collect(),
                notes: vec![],
                resolved: None,
            },
        }
    }

    fn plugins(&self) -> Vec<PluginRow> {
        vec![PluginRow {
            kind: "reward".into(),
            name: "math_reward".into(),
            version: "0.1.0".into(),
            origin: "built-in".into(),
        }]
    }

    fn token_texts(&self, _model_path: &Path, ids: &[u32]) -> Result<Vec<String>, String> {
        Ok(ids.iter().map(|id| format!("<{id}>")).collect())
    }
}

/// A root with run `p/n`: three steps of metrics (one malformed line), 3 × 4 experiences, a checkpoint, a plan
/// and a finished record.
fn root_with_a_run() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let run = root.path().join("p/n");
    std::fs::create_dir_all(run.join("monitor")).unwrap();
    std::fs::create_dir_all(run.join("global_step_3")).unwrap();
    std::fs::write(run.join("global_step_3/meta.json"), "{}").unwrap();
    let metrics = "{\"step\": 1, \"rollout/reward_mean\": 0.25, \"train/loss\": 1.5}\n\
                   {\"step\": 2, \"rollout/reward_mean\": 0.5, \"train/loss\": 1.0, \"eval/sums/accuracy\": 0.4}\n\
                   not json\n\
                   {\"step\": 3, \"rollout/reward_mean\": 0.75, \"train/loss\": 0.5}\n";
    std::fs::write(run.join("monitor/metrics.jsonl"), metrics).unwrap();
    std::fs::write(run.join("monitor/plan.json"), r#"{"total_steps": 5}"#).unwrap();
    let mut experiences = String::new();
    for step in 1..=3 {
        for task in 0..2 {
            for r in 0..2 {
                experiences += &line(step, task, r, (task * 2 + r) as f64 / 4.0, r == 1);
            }
        }
    }
    write(&run.join("experiences.jsonl"), &experiences);
    let mut record = RunRecord {
        role: "trinity".into(),
        status: RunStatus::Running,
        pid: 0,
        config: "/work/c.yaml".into(),
        project: "p".into(),
        group: String::new(),
        name: "n".into(),
        mode: "both".into(),
        model_path: "/models/tiny".into(),
        started_at: 1,
        ended_at: None,
        error: None,
    };
    record.finish(&run, None).unwrap();
    root
}

/// Where the test studio says it listens; requests name it in their `Host`.
const LISTEN: &str = "127.0.0.1:8765";
const ORIGIN: &str = "http://127.0.0.1:8765";

fn app(root: &Path) -> Router {
    let options = StudioOptions {
        root: root.to_owned(),
        listen: LISTEN.into(),
        workdir: root.to_owned(),
        examples: Some(root.join("examples")),
    };
    router(options, Arc::new(TestHost)).unwrap()
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, Value) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value =
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
}

/// A request as the studio's own page sends it: to its address, and a POST as JSON from its origin.
async fn call(root: &Path, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(uri).header("host", LISTEN);
    if method == "POST" {
        request = request.header("origin", ORIGIN).header("content-type", "application/json");
    }
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    send(&app(root), request.body(body).unwrap()).await
}

async fn get(root: &Path, uri: &str) -> (StatusCode, Value) {
    call(root, "GET", uri, None).await
}

#[tokio::test]
async fn runs_show_status_steps_reward_accuracy_and_model() {
    let root = root_with_a_run();
    let (status, body) = get(root.path(), "/api/runs").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let run = &body["runs"][0];
    assert_eq!(run["id"], "p/n");
    assert_eq!((run["project"].as_str(), run["name"].as_str()), (Some("p"), Some("n")));
    assert_eq!(run["status"], "finished");
    assert_eq!((run["steps_done"].as_u64(), run["total_steps"].as_u64()), (Some(3), Some(5)));
    assert_eq!(run["last_reward"], 0.75);
    assert_eq!((run["eval_accuracy"].as_f64(), run["eval_metric"].as_str()), (Some(0.4), Some("eval/sums/accuracy")));
    assert_eq!((run["model"].as_str(), run["mode"].as_str()), (Some("/models/tiny"), Some("both")));
    assert_eq!(run["checkpoints"], json!([3]));
}

#[tokio::test]
async fn metrics_list_names_report_bad_lines_and_give_aligned_series() {
    let root = root_with_a_run();
    let (status, body) = get(root.path(), "/api/metrics?run=p/n").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["names"], json!(["eval/sums/accuracy", "rollout/reward_mean", "train/loss"]));
    // The Curves page opens on the reward and the eval accuracy.
    assert_eq!(body["preselected"], json!(["rollout/reward_mean", "eval/sums/accuracy"]));
    assert_eq!(body["skipped"][0]["lines"][0]["line"], 3);
    let uri = "/api/series?run=p%2Fn&name=train%2Floss&name=eval%2Fsums%2Faccuracy";
    let (status, body) = get(root.path(), uri).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["steps"], json!([1, 2, 3]));
    assert_eq!(body["values"]["train/loss"], json!([1.5, 1.0, 0.5]));
    assert_eq!(body["values"]["eval/sums/accuracy"], json!([null, 0.4, null]));
    // Appended while viewed: the next request sees the new step.
    write(&root.path().join("p/n/monitor/metrics.jsonl"), "{\"step\": 4, \"train/loss\": 0.25}\n");
    let (_, body) = get(root.path(), uri).await;
    assert_eq!(body["steps"], json!([1, 2, 3, 4]));
}

#[tokio::test]
async fn rollouts_page_filter_and_decode_tokens() {
    let root = root_with_a_run();
    let (status, body) = get(root.path(), "/api/rollouts?run=p/n&step=2&limit=3").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((body["total"].as_u64(), body["rows"].as_array().unwrap().len()), (Some(4), 3));
    assert_eq!(body["steps"][2], json!({"step": 3, "experiences": 4}));
    let row = &body["rows"][1];
    assert_eq!(row["uid"], "2/0/1");
    assert_eq!(row["token_texts"], json!(["<11>", "<11>", "<12>"]));
    assert_eq!(row["logprobs"], json!([-0.1, -2.0, -0.5]));
    let (_, body) = get(root.path(), "/api/rollouts?run=p/n&reward_min=0.5&truncated=false&offset=1&limit=50").await;
    assert_eq!(body["total"], 3, "{body}");
    assert!(body["rows"].as_array().unwrap().iter().all(|r| r["reward"] == 0.5), "{body}");
    let (_, body) = get(root.path(), "/api/groups?run=p/n&step=1&k=1").await;
    assert_eq!((body["best"][0]["group"].as_str(), body["worst"][0]["group"].as_str()), (Some("1/1"), Some("1/0")));
    let (status, body) = get(root.path(), "/api/rollouts?run=p/n&reward_min=lots").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].as_str().unwrap().contains("reward_min"), "{body}");
}

#[tokio::test]
async fn failed_tasks_page_by_step_and_a_run_without_any_answers_an_empty_page() {
    let root = root_with_a_run();
    let (status, body) = get(root.path(), "/api/failed?run=p/n").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((body["total"].as_u64(), body["files"].as_array().map(Vec::len)), (Some(0), Some(0)), "{body}");
    let lines = failure(1, 0, "explore") + &failure(2, 3, "explore") + &failure(2, 5, "eval");
    write(&root.path().join("p/n/failed_tasks.jsonl"), &lines);
    let (status, body) = get(root.path(), "/api/failed?run=p/n&step=2&limit=1&offset=1").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((body["total"].as_u64(), body["file"].as_str()), (Some(2), Some("failed_tasks.jsonl")), "{body}");
    assert_eq!(body["rows"][0]["task"], "math#5");
    assert_eq!(body["steps"], json!([{"step": 1, "failed": 1}, {"step": 2, "failed": 2}]));
    let (_, body) = get(root.path(), "/api/failed?run=p/n&phase=eval").await;
    assert_eq!(body["total"], 1, "{body}");
    let (status, body) = get(root.path(), "/api/failed?run=p/n&file=experiences.jsonl").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn a_deleted_or_foreign_run_is_a_named_404() {
    let root = root_with_a_run();
    let (status, body) = get(root.path(), "/api/metrics?run=../etc").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"].as_str().unwrap().contains("no run `../etc`"), "{body}");
    std::fs::remove_dir_all(root.path().join("p/n")).unwrap();
    let (status, body) = get(root.path(), "/api/rollouts?run=p/n").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (_, body) = get(root.path(), "/api/runs").await;
    assert_eq!(body["runs"], json!([]));
}

#[tokio::test]
async fn config_validation_places_errors_and_saves_yaml() {
    let root = root_with_a_run();
    let text = "project: p\nalgorithm:\n  algoritm_type: grpo\n";
    let (status, body) = call(root.path(), "POST", "/api/config/validate", Some(json!({ "text": text }))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["ok"], false);
    assert_eq!(body["problems"][0]["line"], 3, "{body}");
    assert!(body["problems"][0]["message"].as_str().unwrap().contains("did you mean `algorithm_type`"), "{body}");
    let (status, body) = call(root.path(), "POST", "/api/config/validate", Some(json!({ "txt": 1 }))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let save = json!({ "text": text, "path": "mine.yaml" });
    let (status, body) = call(root.path(), "POST", "/api/config/save", Some(save)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(std::fs::read_to_string(root.path().join("mine.yaml")).unwrap(), text);
    let (status, _) =
        call(root.path(), "POST", "/api/config/save", Some(json!({"text": "", "path": "../x.yaml"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn schema_examples_plugins_and_the_page_are_served() {
    let root = root_with_a_run();
    std::fs::create_dir_all(root.path().join("examples/quick")).unwrap();
    std::fs::write(root.path().join("examples/quick/quick.yaml"), "project: q\n").unwrap();
    let (_, body) = get(root.path(), "/api/examples").await;
    assert_eq!(body["examples"], json!(["quick/quick.yaml"]));
    let (_, body) = get(root.path(), "/api/example?path=quick%2Fquick.yaml").await;
    assert_eq!(
        (body["path"].as_str(), body["text"].as_str()),
        (Some("examples/quick/quick.yaml"), Some("project: q\n"))
    );
    // Only YAML is served, and not through a link to outside the examples.
    std::fs::write(root.path().join("examples/quick/notes.txt"), "not a config").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.yaml"), "token: x\n").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.yaml"), root.path().join("examples/quick/s.yaml")).unwrap();
    for bad in ["quick%2Fnotes.txt", "quick%2Fs.yaml"] {
        let (status, body) = get(root.path(), &format!("/api/example?path={bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert!(!body.to_string().contains("token: x"), "{body}");
    }
    let (_, body) = get(root.path(), "/api/examples").await;
    assert_eq!(body["examples"], json!(["quick/quick.yaml"]));
    let (_, body) = get(root.path(), "/api/schema").await;
    assert!(body["properties"]["algorithm"].is_object(), "{body}");
    let (_, body) = get(root.path(), "/api/plugins").await;
    assert_eq!(body["plugins"][0]["name"], "math_reward");
    let (status, page) = get(root.path(), "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.as_str().unwrap().contains("uPlot.iife.min.js"));
    let (status, _) = get(root.path(), "/assets/uPlot.iife.min.js").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = get(root.path(), "/assets/nothing.js").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A body that records whether anything read it.
fn watched_body(text: &str) -> (Body, Arc<AtomicBool>) {
    let read = Arc::new(AtomicBool::new(false));
    let flag = read.clone();
    let body = Full::new(Bytes::from(text.to_owned())).map_frame(move |frame| {
        flag.store(true, Ordering::SeqCst);
        frame
    });
    (Body::new(body), read)
}

fn post(uri: &str, headers: &[(&str, &str)], body: Body) -> Request<Body> {
    let mut request = Request::builder().method("POST").uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(body).unwrap()
}

#[tokio::test]
async fn a_post_from_another_origin_is_refused_unread_and_saves_nothing() {
    let root = root_with_a_run();
    let app = app(root.path());
    let target = root.path().join("target.yaml");
    std::fs::write(&target, "project: mine\n").unwrap();
    let attack = json!({ "text": "project: pwned\n", "path": "target.yaml" }).to_string();
    let foreign = "http://127.0.0.1:9999";
    // A "simple" request (no preflight) as a form or `fetch(.., {mode: "no-cors"})` sends it, a JSON one (which a
    // browser would preflight), one from a page whose Origin is opaque, and one marked cross-site by the browser.
    let attempts: [&[(&str, &str)]; 5] = [
        &[("host", LISTEN), ("origin", foreign), ("content-type", "text/plain;charset=UTF-8")],
        &[("host", LISTEN), ("origin", foreign), ("content-type", "application/json")],
        &[("host", LISTEN), ("origin", "null"), ("content-type", "application/json")],
        &[("host", LISTEN), ("origin", foreign), ("content-type", "application/x-www-form-urlencoded")],
        &[("host", LISTEN), ("sec-fetch-site", "cross-site"), ("content-type", "application/json")],
    ];
    for uri in ["/api/config/save", "/api/config/validate"] {
        for headers in attempts {
            let (body, read) = watched_body(&attack);
            let (status, answer) = send(&app, post(uri, headers, body)).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{uri} {headers:?}: {answer}");
            assert!(answer["error"].as_str().unwrap().starts_with("request refused: "), "{answer}");
            assert!(!read.load(Ordering::SeqCst), "{uri} {headers:?}: the refused body was read");
        }
    }
    // Same origin, but not JSON: refused too (a simple request cannot send JSON).
    let (body, read) = watched_body(&attack);
    let headers = [("host", LISTEN), ("origin", ORIGIN), ("content-type", "text/plain")];
    let (status, answer) = send(&app, post("/api/config/save", &headers, body)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("application/json"), "{answer}");
    assert!(!read.load(Ordering::SeqCst));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "project: mine\n");
    // The studio's own page, as a browser sends its request: saved.
    let (body, read) = watched_body(&attack);
    let headers = [("host", LISTEN), ("origin", ORIGIN), ("content-type", "application/json")];
    let (status, answer) = send(&app, post("/api/config/save", &headers, body)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(read.load(Ordering::SeqCst));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "project: pwned\n");
    // Opened as localhost: its origin is then http://localhost:8765.
    let headers =
        [("host", "localhost:8765"), ("origin", "http://localhost:8765"), ("content-type", "application/json")];
    let (status, answer) = send(&app, post("/api/config/validate", &headers, Body::from(attack.clone()))).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

#[tokio::test]
async fn a_foreign_host_is_refused_on_every_route() {
    let root = root_with_a_run();
    let app = app(root.path());
    for host in ["rebind.example:8765", "rebind.example:9999", "192.168.1.5:8765", "evil.localhost:8765"] {
        for uri in ["/", "/assets/app.js", "/api/runs", "/api/example?path=quick%2Fquick.yaml", "/nothing"] {
            let request = Request::builder().uri(uri).header("host", host).body(Body::empty()).unwrap();
            let (status, body) = send(&app, request).await;
            assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{host}{uri}: {body}");
            assert!(body["error"].as_str().unwrap().contains(&format!("host `{host}`")), "{body}");
            assert!(!body.to_string().contains("p/n"), "{body}");
        }
        let origin = format!("http://{host}");
        let headers = [("host", host), ("origin", origin.as_str()), ("content-type", "application/json")];
        let (body, read) = watched_body(&json!({ "text": "x: 1\n", "path": "host.yaml" }).to_string());
        let (status, answer) = send(&app, post("/api/config/save", &headers, body)).await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{host}: {answer}");
        assert!(!read.load(Ordering::SeqCst) && !root.path().join("host.yaml").exists());
    }
    let request = Request::builder().uri("/api/runs").body(Body::empty()).unwrap();
    assert_eq!(send(&app, request).await.0, StatusCode::MISDIRECTED_REQUEST, "no Host at all");
    for host in [LISTEN, "localhost:8765", "[::1]:8765"] {
        let request = Request::builder().uri("/api/runs").header("host", host).body(Body::empty()).unwrap();
        let (status, body) = send(&app, request).await;
        assert_eq!((status, body["runs"][0]["id"].as_str()), (StatusCode::OK, Some("p/n")), "{host}: {body}");
    }
}

#[tokio::test]
async fn the_page_carries_the_token_a_post_without_origin_needs() {
    let root = root_with_a_run();
    let app = app(root.path());
    let request = Request::builder().uri("/").header("host", LISTEN).body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.headers()["x-frame-options"], "DENY");
    assert_eq!(response.headers()["cache-control"], "no-store");
    let page = String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    let token = page
        .split_once(r#"<meta name="studio-token" content=""#)
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(token, _)| token.to_owned())
        .unwrap_or_else(|| panic!("no token in the page: {page}"));
    assert_eq!(token.len(), 64, "{token}");
    // A second studio (or a restart) has another token.
    let other = Request::builder().uri("/").header("host", LISTEN).body(Body::empty()).unwrap();
    let (_, other) = send(&self::app(root.path()), other).await;
    assert!(!other.as_str().unwrap().contains(&token));
    let save = json!({ "text": "project: t\n", "path": "token.yaml" }).to_string();
    for (presented, want) in [(None, StatusCode::FORBIDDEN), (Some("0".repeat(64)), StatusCode::FORBIDDEN)] {
        let mut headers = vec![("host", LISTEN), ("content-type", "application/json")];
        if let Some(presented) = &presented {
            headers.push(("x-studio-token", presented.as_str()));
        }
        let (status, answer) = send(&app, post("/api/config/save", &headers, Body::from(save.clone()))).await;
        assert_eq!(status, want, "{presented:?}: {answer}");
        assert!(answer["error"].as_str().unwrap().contains("x-studio-token"), "{answer}");
    }
    assert!(!root.path().join("token.yaml").exists());
    let headers = [("host", LISTEN), ("content-type", "application/json"), ("x-studio-token", token.as_str())];
    let (status, answer) = send(&app, post("/api/config/save", &headers, Body::from(save))).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(std::fs::read_to_string(root.path().join("token.yaml")).unwrap(), "project: t\n");
}

#[tokio::test]
async fn bodies_are_bounded_and_saves_through_symlinks_are_refused() {
    let root = root_with_a_run();
    let huge = json!({ "text": "#".repeat(2 << 20), "path": "huge.yaml" });
    let (status, _) = call(root.path(), "POST", "/api/config/save", Some(huge)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(!root.path().join("huge.yaml").exists());
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("victim.yaml"), "kept: 1\n").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("linked")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("victim.yaml"), root.path().join("file.yaml")).unwrap();
    for path in ["linked/victim.yaml", "linked/new.yaml", "file.yaml"] {
        let save = json!({ "text": "pwned: 1\n", "path": path });
        let (status, body) = call(root.path(), "POST", "/api/config/save", Some(save)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert!(body["error"].as_str().unwrap().contains("symlink"), "{body}");
    }
    assert_eq!(std::fs::read_to_string(outside.path().join("victim.yaml")).unwrap(), "kept: 1\n");
    assert!(!outside.path().join("new.yaml").exists());
}
