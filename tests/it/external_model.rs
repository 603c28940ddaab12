//! `mode: bench` with `model.external_model`: trinity's own serve mode (a tiny model) is the OpenAI-compatible
//! endpoint, reached through a loopback proxy that keeps a copy of every request, so the test sees what went over
//! the wire (rollout arguments, the `Authorization` header) and what the server answered (its `/metrics`).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::serve::{config_for, server_address};
use crate::support::{assert_clean_failure, spawn_run, stderr, tiny_model_dir};

const API_KEY: &str = "sk-trinity-test-4f1c9a";

/// A bench of `base_url`'s `model` on three rows, two answers each, at most three tokens per answer.
fn bench_config(model: &str) -> String {
    format!(
        "mode: bench
project: p
name: hosted
checkpoint_root_dir: ./ckpt
model:
  model_path: tiny-over-http
  max_model_len: 64
  max_response_tokens: 4
  external_model:
    enable: true
    model_name: {model}
    base_url_env: TEST_ENDPOINT_URL
    api_key_env: TEST_ENDPOINT_KEY
buffer:
  explorer_input:
    eval_tasksets:
      - name: arith
        path: eval.jsonl
        repeat_times: 2
        format:
          prompt_key: question
          response_key: answer
        rollout_args:
          temperature: 0.7
          max_tokens: 3
    default_eval_workflow_type: simple_workflow
explorer:
  runner_per_model: 3
monitor:
  monitor_type: jsonl
"
    )
}

fn write_bench(dir: &Path, model: &str) {
    std::fs::write(dir.join("bench.yaml"), bench_config(model)).unwrap();
    let rows = [
        "{\"question\": \"ab1\", \"answer\": \"1\"}",
        "{\"question\": \"b2\", \"answer\": \"2\"}",
        "{\"question\": \"a3\", \"answer\": \"3\"}",
    ];
    std::fs::write(dir.join("eval.jsonl"), rows.join("\n") + "\n").unwrap();
}

fn run_bench(dir: &Path, base_url: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trinity"))
        .current_dir(dir)
        .args(["run", "--config", "bench.yaml"])
        .env_remove("RUST_LOG")
        .env("TEST_ENDPOINT_URL", base_url)
        .env("TEST_ENDPOINT_KEY", API_KEY)
        .output()
        .unwrap()
}

/// A loopback proxy to `target` that keeps a copy of every byte clients send.
fn recording_proxy(target: String) -> (String, Arc<Mutex<Vec<Vec<u8>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let (Ok(client), Ok(server)) = (client, TcpStream::connect(&target)) else { continue };
            let (mut from_client, mut to_server) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            // Each connection's bytes are kept apart: concurrent requests would otherwise interleave their
            // headers and bodies in one buffer.
            let log = Arc::clone(&log);
            let slot = {
                let mut connections = log.lock().unwrap();
                connections.push(Vec::new());
                connections.len() - 1
            };
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 << 10];
                while let Ok(n @ 1..) = from_client.read(&mut buf) {
                    log.lock().unwrap()[slot].extend_from_slice(&buf[..n]);
                    if to_server.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to_server.shutdown(Shutdown::Write);
            });
            let (mut from_server, mut to_client) = (server, client);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut from_server, &mut to_client);
                let _ = to_client.shutdown(Shutdown::Write);
            });
        }
    });
    (address, seen)
}

/// `GET path` on `address`: the body.
fn get(address: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(address).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
}

/// The value of the Prometheus sample `name` (with its labels) in `text`.
fn sample(text: &str, name: &str) -> f64 {
    let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path).is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle)) {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[test]
fn bench_evaluates_an_openai_compatible_endpoint_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = tiny_model_dir();
    std::fs::write(dir.path().join("serve.yaml"), config_for("serve", &tiny, 64, 6, 2)).unwrap();
    let server = spawn_run(dir.path(), "serve.yaml");
    let address = server_address(&dir.path().join("ckpt/p/served"));
    let (proxy, wire) = recording_proxy(address.clone());
    // The name the server answers to (its model_path, as in Trinity-RFT's serve mode).
    let models: Value = serde_json::from_str(&get(&address, "/v1/models")).unwrap();
    let served_name = models["data"][0]["id"].as_str().unwrap().to_owned();
    write_bench(dir.path(), &served_name);

    let output = run_bench(dir.path(), &format!("http://{proxy}/v1"));
    let metrics_text = get(&address, "/metrics");
    assert!(Command::new("kill").args(["-TERM", &server.id().to_string()]).status().unwrap().success());
    let served = server.wait_with_output().unwrap();
    assert!(output.status.success(), "bench failed:\n{}\nserver:\n{}", stderr(&output), stderr(&served));

    // The bench metrics of a local bench, at step 0.
    let job = dir.path().join("ckpt/p/hosted");
    let lines = std::fs::read_to_string(job.join("monitor/bench/metrics.jsonl")).unwrap();
    let step: Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    assert_eq!(step["step"], 0, "{step}");
    for key in ["accuracy", "reward_mean", "response_length_mean", "failed_tasks"] {
        assert!(step[format!("bench/arith/{key}")].is_number(), "no bench/arith/{key}: {step}");
    }
    assert_eq!(step["bench/arith/failed_tasks"], 0.0, "{step}");
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(job.join("bench_meta.json")).unwrap()).unwrap();
    assert_eq!(meta["evaluated"], serde_json::json!([0]));

    // One request per task went over HTTP, each with the Bearer key and the taskset's rollout arguments.
    let wire = String::from_utf8_lossy(&wire.lock().unwrap().concat()).into_owned();
    let requests: Vec<&str> = wire.split("POST /v1/chat/completions ").skip(1).collect();
    assert_eq!(requests.len(), 3, "{wire}");
    for request in &requests {
        let lower = request.to_ascii_lowercase();
        assert!(lower.contains(&format!("authorization: bearer {}", API_KEY.to_ascii_lowercase())), "{request}");
        let body: Value = serde_json::from_str(request.split_once("\r\n\r\n").unwrap().1.lines().next().unwrap())
            .unwrap_or_else(|e| panic!("{e}: {request}"));
        assert_eq!(body["n"], 2, "{body}");
        assert_eq!(body["temperature"], 0.7, "{body}");
        assert_eq!(body["max_completion_tokens"], 3, "{body}");
        assert_eq!(body["model"], served_name.as_str(), "{body}");
        assert!(body["seed"].is_i64(), "{body}");
    }
    // The server answered those three, honouring max_tokens, and the bench's lengths are its usage counts.
    assert_eq!(
        sample(&metrics_text, "trinity_serve_requests_total{endpoint=\"chat.completions\",status=\"200\"}"),
        3.0
    );
    let completion_tokens = sample(&metrics_text, "trinity_serve_completion_tokens_total");
    assert!(completion_tokens > 0.0 && completion_tokens <= 3.0 * 2.0 * 3.0, "{metrics_text}");
    let mean = step["bench/arith/response_length_mean"].as_f64().unwrap();
    assert!((mean * 6.0 - completion_tokens).abs() < 1e-9, "{mean} × 6 answers vs {completion_tokens} served");

    // The key went into headers only: no file of the run (nor its log output) holds it.
    assert_eq!(files_containing(dir.path(), API_KEY.as_bytes()), Vec::<String>::new());
    assert!(!stderr(&output).contains(API_KEY));
}

#[test]
fn an_endpoint_that_is_down_stops_the_bench_naming_its_url_and_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    write_bench(dir.path(), "gpt-x");
    // A port that was free a moment ago: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let output = run_bench(dir.path(), &format!("http://127.0.0.1:{port}/v1/"));
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    assert_clean_failure(&output, &[&url, "every task of eval taskset `arith` failed"]);
    let job = dir.path().join("ckpt/p/hosted");
    assert!(!job.join("bench_meta.json").exists(), "a failed bench records no evaluated step");
    let metrics = std::fs::read_to_string(job.join("monitor/bench/metrics.jsonl")).unwrap_or_default();
    assert!(metrics.trim().is_empty(), "no metrics for a failed step: {metrics}");
    assert!(!stderr(&output).contains(API_KEY));
    assert_eq!(files_containing(dir.path(), API_KEY.as_bytes()), Vec::<String>::new());
}

#[test]
fn workflows_that_need_tokens_are_refused_before_the_bench_starts() {
    let dir = tempfile::tempdir().unwrap();
    write_bench(dir.path(), "gpt-x");
    let text = bench_config("gpt-x")
        .replace("default_eval_workflow_type: simple_workflow", "default_eval_workflow_type: frozen_lake_workflow");
    std::fs::write(dir.path().join("bench.yaml"), text).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_trinity"))
        .current_dir(dir.path())
        .args(["run", "--config", "bench.yaml", "--dry-run"])
        .env_remove("RUST_LOG")
        .env("TEST_ENDPOINT_URL", "http://127.0.0.1:9/v1")
        .env("TEST_ENDPOINT_KEY", API_KEY)
        .output()
        .unwrap();
    assert_clean_failure(&output, &["frozen_lake_workflow", "model.external_model returns text only", "math_workflow"]);
}
