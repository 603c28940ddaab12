//! The API through the router, over run directories written the way `trinity run` writes them, with a host that
//! validates through the config crate itself (every component name accepted) and decodes token `n` as `<n>`.

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
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

async fn call(root: &Path, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
    let options = StudioOptions {
        root: root.to_owned(),
        listen: String::new(),
        workdir: root.to_owned(),
        examples: Some(root.join("examples")),
    };
    let app = router(options, Arc::new(TestHost));
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    let request = Request::builder().method(method).uri(uri).body(body).unwrap();
    let response = app.oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value =
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
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
