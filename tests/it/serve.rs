//! `mode: serve` end to end: `trinity run` serves a tiny model over the OpenAI API, an agent (raw HTTP, and the
//! official `openai` Python package) chats, calls a tool, rewards and commits, and a `mode: train` process trains
//! on exactly the recorded tokens; SIGTERM stops the server cleanly.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{openai_python, spawn_run, stderr, stdout, tiny_model_dir, trinity, workspace_root};
use crate::tool_model::write_tool_model;

fn config(mode: &str) -> String {
    config_for(mode, &tiny_model_dir(), 40, 6, 2)
}

/// A serve (or train) config for `model`: train steps of `train_batch_size` experiences from the shared buffer.
/// Engine and trainer both hold fp32 weights, so the trainer's logprobs of the recorded tokens can be compared
/// tightly with the ones the server returned.
pub(crate) fn config_for(
    mode: &str,
    model: &Path,
    max_model_len: u32,
    max_response_tokens: u32,
    train_batch_size: u32,
) -> String {
    format!(
        "project: p
name: served
mode: {mode}
checkpoint_root_dir: ./ckpt
algorithm:
  algorithm_type: grpo
  repeat_times: 2
model:
  model_path: {model}
  max_model_len: {max_model_len}
  max_response_tokens: {max_response_tokens}
buffer:
  train_batch_size: {train_batch_size}
  total_steps: 1
  trainer_input:
    experience_buffer:
      name: exp
      storage_type: queue
      path: sqlite:///exp.db
explorer:
  listen_address: 127.0.0.1
  proxy_port: 0
  rollout_model:
    dtype: float32
    enable_auto_tool_choice: true
    tool_call_parser: hermes
trainer:
  dtype: float32
synchronizer:
  sync_method: checkpoint
monitor:
  monitor_type: jsonl
",
        model = model.display()
    )
}

/// One HTTP/1.1 request; the response's status and JSON body.
fn post(address: &str, path: &str, body: &Value) -> (u16, Value) {
    let mut stream = TcpStream::connect(address).unwrap();
    let body = body.to_string();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (_, body) = response.split_once("\r\n\r\n").unwrap_or(("", ""));
    (status, serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {response}")))
}

pub(crate) fn server_address(job: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(url) = std::fs::read_to_string(job.join("explorer_server_url.txt")) {
            return url.trim().trim_start_matches("http://").to_owned();
        }
        assert!(Instant::now() < deadline, "the server never wrote its URL");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_agent_chats_rewards_and_commits_and_a_trainer_trains_on_exactly_those_tokens() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("serve.yaml"), config("serve")).unwrap();
    std::fs::write(dir.path().join("train.yaml"), config("train")).unwrap();
    let job = dir.path().join("ckpt/p/served");
    let server = spawn_run(dir.path(), "serve.yaml");
    let address = server_address(&job);

    let (status, reply) = post(
        &address,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "ab1"}], "n": 2, "max_tokens": 5, "logprobs": true,
                "return_token_ids": true, "seed": 3}),
    );
    assert_eq!(status, 200, "{reply}");
    let id = reply["id"].as_str().unwrap().to_owned();
    let choices = reply["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    let (status, body) = post(&address, "/feedback", &json!({"msg_ids": [id], "reward": 1.0, "task_id": "t1"}));
    assert_eq!(status, 200, "{body}");
    let (status, report) = post(&address, "/commit", &json!({}));
    assert_eq!(status, 200, "{report}");

    // The trainer takes the two committed experiences as train step 1.
    let stored = train_then_stop(dir.path(), server, &job);
    // What the sink stored is exactly what the API returned: token ids and logprobs per choice.
    assert_eq!(stored.len(), 2);
    for (choice, experience) in choices.iter().zip(&stored) {
        let tokens: Vec<u64> = experience["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
        let prompt_length = experience["prompt_length"].as_u64().unwrap() as usize;
        let returned: Vec<u64> = choice["token_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
        assert_eq!(tokens[prompt_length..], returned[..]);
        let logprobs: Vec<f64> =
            choice["logprobs"]["content"].as_array().unwrap().iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        let recorded: Vec<f64> =
            experience["logprobs"].as_array().unwrap().iter().map(|l| l.as_f64().unwrap()).collect();
        assert_eq!(logprobs.len(), recorded.len());
        for (a, b) in logprobs.iter().zip(&recorded) {
            assert!((a - b).abs() < 1e-5, "{logprobs:?} vs {recorded:?}");
        }
    }
    // Trained on those tokens: the trainer's logprobs of the recorded tokens equal the recorded ones (PPO's
    // ratio starts at 1, ppo_kl ≈ 0), and the buffer shows both consumed by step 1.
    let metrics = std::fs::read_to_string(job.join("monitor/trainer/metrics.jsonl")).unwrap();
    let step: Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    assert_eq!(step["step"], 1);
    assert!(step["train/ppo_kl"].as_f64().unwrap().abs() < 1e-3, "{step}");
    let db = rusqlite::Connection::open(job.join("buffer/exp.db")).unwrap();
    let count = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(count("SELECT COUNT(*) FROM experiences WHERE consumed = 1 AND train_step = 1"), 2);
    assert_eq!(count("SELECT COUNT(*) FROM producers WHERE name = 'explorer' AND state = 'finished'"), 1);
}

/// Runs mode train (`train.yaml` in `dir`) to success, stops the server with SIGTERM (requests in flight finish,
/// the producer is marked finished, exit 0) and returns the experiences the server's sink stored.
fn train_then_stop(dir: &Path, server: std::process::Child, job: &Path) -> Vec<Value> {
    let output = trinity(dir, &["run", "--config", "train.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let pid = server.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let served = server.wait_with_output().unwrap();
    assert!(served.status.success(), "{}", stderr(&served));
    std::fs::read_to_string(job.join("explorer_experiences.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn u64s(value: &Value) -> Vec<u64> {
    value.as_array().unwrap_or_else(|| panic!("not a list: {value}")).iter().map(|v| v.as_u64().unwrap()).collect()
}

fn f64s(value: &Value) -> Vec<f64> {
    value.as_array().unwrap_or_else(|| panic!("not a list: {value}")).iter().map(|v| v.as_f64().unwrap()).collect()
}

/// The official client against `trinity run` in mode serve, on a model that really calls its tool: chat with
/// n = 2 and logprobs, a streamed chat, a legacy completion, errors, a tool call (whole and streamed), rewards,
/// one commit; then `mode: train` takes the four rewarded experiences as its step and its logprobs of those
/// tokens equal the ones the client received (PPO's ratio starts at 1).
#[test]
fn the_openai_client_drives_mode_serve_and_a_trainer_trains_on_what_it_received() {
    let python = openai_python();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tool-model");
    write_tool_model(&model);
    std::fs::write(dir.path().join("serve.yaml"), config_for("serve", &model, 512, 12, 4)).unwrap();
    std::fs::write(dir.path().join("train.yaml"), config_for("train", &model, 512, 12, 4)).unwrap();
    let job = dir.path().join("ckpt/p/served");
    let server = spawn_run(dir.path(), "serve.yaml");
    let address = server_address(&job);
    let script = workspace_root().join("runtime/serve/tests/openai_client.py");
    let client =
        Command::new(python).arg(script).args(["--base-url", &format!("http://{address}/v1")]).output().unwrap();
    let stdout = String::from_utf8_lossy(&client.stdout);
    assert!(
        client.status.success(),
        "the client script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&client.stderr)
    );
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    // Rewarded: the two chat choices, the stream and the tool call; the legacy completion and the streamed
    // tool call stay pending.
    assert_eq!(seen["commit"]["committed"], 4, "{seen}");
    assert_eq!(seen["commit"]["pending"], 2, "{seen}");

    let stored = train_then_stop(dir.path(), server, &job);
    // Stored exactly as the client received it, token ids and logprobs per choice.
    assert_eq!(stored.len(), 4);
    let responses = seen["responses"].as_object().unwrap();
    let mut far_from_certain = 0;
    for experience in &stored {
        let id = experience["info"]["response_id"].as_str().unwrap();
        let choice = experience["info"]["choice"].as_u64().unwrap() as usize;
        let client = &responses[id]["choices"][choice];
        let tokens = u64s(&experience["tokens"]);
        let prompt_length = experience["prompt_length"].as_u64().unwrap() as usize;
        assert_eq!(tokens[prompt_length..], u64s(&client["token_ids"])[..], "{id}#{choice}");
        let received = f64s(&client["logprobs"]);
        let recorded = f64s(&experience["logprobs"]);
        assert_eq!(received.len(), recorded.len(), "{id}#{choice}");
        for (a, b) in received.iter().zip(&recorded) {
            assert!((a - b).abs() < 1e-5, "{id}#{choice}: {received:?} vs {recorded:?}");
        }
        far_from_certain += recorded.iter().filter(|&&l| l < -0.1).count();
    }
    // The tool call is certain by construction; the continued replies are not, so the check below has teeth.
    assert!(far_from_certain > 0, "every recorded logprob is ≈ 0: {stored:?}");
    let metrics = std::fs::read_to_string(job.join("monitor/trainer/metrics.jsonl")).unwrap();
    let step: Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    assert_eq!(step["step"], 1);
    assert!(step["train/ppo_kl"].as_f64().unwrap().abs() < 1e-4, "{step}");
    let db = rusqlite::Connection::open(job.join("buffer/exp.db")).unwrap();
    let count = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(count("SELECT COUNT(*) FROM experiences WHERE consumed = 1 AND train_step = 1"), 4);
}

/// The server's resident memory, from `/proc`.
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {status}"));
    kib * 1024
}

/// One raw HTTP/1.1 request with `headers`; the status and the body as text.
fn raw_post(address: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {address}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default())
}

/// Prompts far over the limit are refused by their length, before the tokenizer (which costs ~100 bytes of
/// memory a byte of text, kept by the allocator) sees them: three 900 KB prompts used to add ~300 MB.
#[test]
fn oversized_prompts_are_refused_without_growing_the_server() {
    let dir = tempfile::tempdir().unwrap();
    // The tool model's byte-level vocabulary has every byte, so its tokenizer bounds a prompt's length in bytes
    // (the tiny fixture's lacks some, and gets no bound).
    let model = dir.path().join("tool-model");
    write_tool_model(&model);
    std::fs::write(dir.path().join("serve.yaml"), config_for("serve", &model, 512, 12, 4)).unwrap();
    let job = dir.path().join("ckpt/p/served");
    let mut server = spawn_run(dir.path(), "serve.yaml");
    let address = server_address(&job);
    let (status, reply) = post(
        &address,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "ab1"}], "max_tokens": 2}),
    );
    assert_eq!(status, 200, "{reply}");
    let before = resident_bytes(server.id());
    let huge = "ab1 ".repeat(225_000);
    std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                let (status, reply) =
                    post(&address, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": huge}]}));
                assert_eq!((status, &reply["error"]["code"]), (400, &json!("context_length_exceeded")), "{reply}");
            });
        }
    });
    let (status, reply) = post(&address, "/v1/completions", &json!({"prompt": huge}));
    assert_eq!(status, 400, "{reply}");
    let grown = resident_bytes(server.id()).saturating_sub(before);
    println!(
        "resident memory: {:.1} MB before, {:.1} MB more after four 900 KB prompts",
        before as f64 / 1e6,
        grown as f64 / 1e6
    );
    assert!(grown < 40_000_000, "the server grew by {grown} bytes");
    server.kill().unwrap();
    server.wait().unwrap();
}

/// SIGTERM commits what was rewarded and not yet committed; unset, `listen_address` is loopback.
#[test]
fn sigterm_commits_every_rewarded_experience_and_the_default_bind_is_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let config = config("serve").replace("  listen_address: 127.0.0.1\n", "");
    assert!(!config.contains("listen_address"));
    std::fs::write(dir.path().join("serve.yaml"), config).unwrap();
    let job = dir.path().join("ckpt/p/served");
    let server = spawn_run(dir.path(), "serve.yaml");
    let address = server_address(&job);
    assert!(address.starts_with("127.0.0.1:"), "{address}");
    let chat = json!({"messages": [{"role": "user", "content": "ab1"}], "n": 2, "max_tokens": 3});
    let (_, rewarded) = post(&address, "/v1/chat/completions", &chat);
    let (_, unrewarded) = post(&address, "/v1/chat/completions", &chat);
    let id = rewarded["id"].as_str().unwrap().to_owned();
    let (status, body) = post(&address, "/feedback", &json!({"msg_ids": [id, format!("{id}#0")], "reward": 1.0}));
    assert_eq!((status, &body["updated"]), (200, &json!(2)), "{body}");
    assert!(Command::new("kill").args(["-TERM", &server.id().to_string()]).status().unwrap().success());
    let served = server.wait_with_output().unwrap();
    let log = stderr(&served);
    assert!(served.status.success(), "{log}");
    let stored: Vec<Value> = std::fs::read_to_string(job.join("explorer_experiences.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(stored.len(), 2, "{log}");
    assert!(stored.iter().all(|e| e["info"]["response_id"] == json!(id)), "{stored:?}");
    // The unrewarded reply is named as lost.
    let unrewarded = unrewarded["id"].as_str().unwrap();
    assert!(log.contains("never committed") && log.contains(unrewarded), "{log}");
    let db = rusqlite::Connection::open(job.join("buffer/exp.db")).unwrap();
    let count: i64 = db.query_row("SELECT COUNT(*) FROM experiences", [], |r| r.get(0)).unwrap();
    assert_eq!(count, 2);
}

/// With `TRINITY_SERVE_API_KEY`, the official client needs the key; a page's text/plain POST is refused.
#[test]
fn the_openai_client_needs_the_api_key_and_a_cross_site_post_is_refused() {
    let python = openai_python();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("serve.yaml"), config("serve")).unwrap();
    let job = dir.path().join("ckpt/p/served");
    let mut server = Command::new(env!("CARGO_BIN_EXE_trinity"))
        .current_dir(dir.path())
        .args(["run", "--config", "serve.yaml"])
        .env_remove("RUST_LOG")
        .env("TRINITY_SERVE_API_KEY", "s3cret")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let address = server_address(&job);
    let script = r#"
import sys, openai
base = sys.argv[1]
good = openai.OpenAI(base_url=base, api_key="s3cret")
reply = good.chat.completions.create(model=good.models.list().data[0].id, messages=[{"role": "user", "content": "ab1"}], max_tokens=2)
assert reply.choices, reply
for key in ["wrong", "EMPTY"]:
    try:
        openai.OpenAI(base_url=base, api_key=key, max_retries=0).models.list()
    except openai.AuthenticationError as error:
        assert error.status_code == 401 and error.code == "invalid_api_key", (error, error.code)
    else:
        raise SystemExit(f"key {key!r} was accepted")
print("ok")
"#;
    let client = Command::new(python).args(["-c", script, &format!("http://{address}/v1")]).output().unwrap();
    assert!(client.status.success(), "{}\n{}", stdout(&client), stderr(&client));
    let body = r#"{"messages": [{"role": "user", "content": "ab1"}], "max_tokens": 2}"#;
    let key = "Authorization: Bearer s3cret\r\n";
    let (status, reply) =
        raw_post(&address, "/v1/chat/completions", &format!("{key}Content-Type: text/plain\r\n"), body);
    assert_eq!(status, 415, "{reply}");
    let page = format!("{key}Content-Type: application/json\r\nOrigin: https://evil.example\r\n");
    let (status, reply) = raw_post(&address, "/v1/chat/completions", &page, body);
    assert_eq!(status, 403, "{reply}");
    let (status, reply) = raw_post(&address, "/v1/chat/completions", "Content-Type: application/json\r\n", body);
    assert_eq!(status, 401, "{reply}");
    server.kill().unwrap();
    server.wait().unwrap();
}
