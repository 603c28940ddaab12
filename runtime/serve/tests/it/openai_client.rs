//! The official `openai` Python package against the server: what an agent sees, and that the experiences the
//! server commits hold exactly the token ids and logprobs the client received — the logprobs a training
//! forward pass computes for those tokens.
//!
//! The package comes from the virtual environment `cargo xtask setup` installs it into (`.deps/openai-venv`,
//! or `$TRINITY_OPENAI_PYTHON`); without it the test fails and says to run setup: it is never skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use tch::{Device, Kind, Tensor};

use crate::helpers::*;

/// The interpreter with the `openai` package that `cargo xtask setup` installed.
pub fn openai_python() -> PathBuf {
    let python = std::env::var_os("TRINITY_OPENAI_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let deps = std::env::var_os("TRINITY_DEPS_DIR").map_or_else(|| root.join(".deps"), PathBuf::from);
        deps.join("openai-venv/bin/python")
    });
    let imports = Command::new(&python).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success());
    assert!(
        imports,
        "{} cannot import the `openai` package: run `cargo xtask setup`, which installs it",
        python.display()
    );
    python
}

/// Logprobs of `tokens[prompt..]` from the training forward pass of the fixture model.
fn training_logprobs(tokens: &[u32], prompt: usize, temperature: f64) -> Vec<f32> {
    let model = trinity_model::load_model(&tiny_model_dir(), Kind::Float, Device::Cpu).unwrap();
    let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    let t = ids.len() as i64;
    let ids = Tensor::from_slice(&ids).view([1, t]);
    let lp = tch::no_grad(|| {
        let hidden = model.decoder.forward_hidden(&ids, None).unwrap();
        model.decoder.token_logprobs(&hidden.narrow(1, 0, t - 1), &ids.narrow(1, 1, t - 1), temperature, 64).unwrap()
    });
    let all: Vec<f32> = Vec::try_from(lp.view([-1])).unwrap();
    all[prompt - 1..].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_drives_serve_mode_and_its_tokens_are_committed() {
    let python = openai_python();
    let (server, sink) = start(tiny_rollout(4, 256), options("tiny")).await;
    let (tools_server, tools_sink) = start(tool_rollout(), options("tools")).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let (base, tools) = (server.base_url(), tools_server.base_url());
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python).arg(script).args(["--base-url", &base, "--tools-url", &tools]).output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the client script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();

    assert_eq!(seen["commit"]["committed"], 3, "{seen}");
    assert_eq!(seen["commit"]["pending"], 1, "the unrewarded completion stays: {seen}");
    assert_eq!(seen["tools_commit"]["committed"], 1, "{seen}");
    let mut committed = sink.all().remove(0);
    committed.extend(tools_sink.all().remove(0));
    assert_eq!(committed.len(), 4);
    let responses = seen["responses"].as_object().unwrap();
    for e in &committed {
        let id = e.info["response_id"].as_str().unwrap();
        let choice = e.info["choice"].as_u64().unwrap() as usize;
        let client = &responses[id]["choices"][choice];
        let tokens: Vec<u32> = serde_json::from_value(client["token_ids"].clone()).unwrap();
        let logprobs: Vec<f32> =
            client["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        assert_eq!(e.tokens[e.prompt_length..], tokens[..], "{id}#{choice}: token ids as the client received them");
        assert_eq!(e.logprobs, logprobs, "{id}#{choice}: logprobs as the client received them");
        e.validate().unwrap();
        if let Some(prompt) = responses[id].get("prompt_token_ids") {
            let prompt: Vec<u32> = serde_json::from_value(prompt.clone()).unwrap();
            assert_eq!(e.tokens[..e.prompt_length], prompt[..]);
        }
    }
    // Rewards and groups as the agent sent them: the n = 2 choices are one group, the stream and the tool call
    // (two servers, one task) share `game-1`.
    let rewards: Vec<(f64, &str)> = committed.iter().map(|e| (e.reward, e.group_id.as_str())).collect();
    assert_eq!(rewards[0].0, 1.0);
    assert_eq!(rewards[1].0, 0.0);
    assert_eq!(rewards[0].1, rewards[1].1);
    assert_eq!(&rewards[2..], &[(0.5, "game-1"), (1.0, "game-1")]);
    // A train step would score exactly these tokens: the training forward pass gives the recorded logprobs.
    for e in &committed[..3] {
        let temperature = e.info["temperature"].as_f64().unwrap();
        let trained = training_logprobs(&e.tokens, e.prompt_length, temperature);
        for (recorded, trained) in e.logprobs.iter().zip(&trained) {
            assert!((recorded - trained).abs() < 1e-4, "recorded {recorded} vs training forward {trained}");
        }
    }
    server.shutdown().await.unwrap();
    tools_server.shutdown().await.unwrap();
}
