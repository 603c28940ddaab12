//! `trinity generate`, `trinity score` and `trinity convert` on the tiny model the repository ships.

use crate::support::{assert_clean_failure, stderr, stdout, tiny_model_dir, trinity, workspace_root};

fn tiny_model() -> String {
    tiny_model_dir().display().to_string()
}

#[test]
fn generate_writes_completions_in_input_order() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("prompts.jsonl");
    std::fs::write(
        &input,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"ab\"}]}\n{\"messages\": [{\"role\": \"user\", \"content\": \"ba\"}]}\n",
    )
    .unwrap();
    let model = tiny_model();
    let args = ["generate", "--model", &model, "--input", "prompts.jsonl", "--chat", "--n", "2", "--max-tokens", "4"];
    let output = trinity(dir.path(), &[&args[..], &["--seed", "3"]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let lines: Vec<serde_json::Value> = stdout(&output).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    for line in &lines {
        let completions = line["completions"].as_array().unwrap();
        assert_eq!(completions.len(), 2, "--n 2");
        for completion in completions {
            let tokens = completion["tokens"].as_array().unwrap();
            assert!(!tokens.is_empty() && tokens.len() <= 4);
            assert_eq!(completion["logprobs"].as_array().unwrap().len(), tokens.len());
            assert!(completion["finish_reason"].is_string());
        }
    }
    assert!(lines[0]["prompt"].to_string().contains("ab"), "input order: {}", lines[0]);
    assert!(stderr(&output).contains("tok/s"), "the summary reports throughput");
    // Not a terminal: progress is plain lines on stderr (stdout holds only the results, parsed above).
    let err = stderr(&output);
    let progress: Vec<&str> = err.lines().filter(|l| l.starts_with("progress: ")).collect();
    assert_eq!(progress.len(), 2, "a line at each tenth of the prompts reached: {progress:?}");
    assert!(progress[1].starts_with("progress: generate: 2/2 prompts [####################] 100%"), "{progress:?}");
    assert!(progress[1].contains("tokens/s"), "{progress:?}");
    // The same seed samples the same tokens. Logprobs may differ in their last bits: how continuous batching
    // groups the prompts into prefills and decode steps (timing-dependent) changes the matmul shapes.
    let again = trinity(dir.path(), &[&args[..], &["--seed", "3"]].concat());
    let repeated: Vec<serde_json::Value> = stdout(&again).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(repeated.len(), lines.len());
    for (first, second) in lines.iter().zip(&repeated) {
        assert_eq!(first["prompt"], second["prompt"]);
        for (a, b) in first["completions"].as_array().unwrap().iter().zip(second["completions"].as_array().unwrap()) {
            assert_eq!(
                (&a["text"], &a["tokens"], &a["finish_reason"]),
                (&b["text"], &b["tokens"], &b["finish_reason"])
            );
            for (x, y) in a["logprobs"].as_array().unwrap().iter().zip(b["logprobs"].as_array().unwrap()) {
                assert!((x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-4, "same seed, logprobs {x} vs {y}");
            }
        }
    }
}

#[test]
fn score_and_convert_round_trip_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pairs.jsonl"), "{\"prompt\": \"ab\", \"response\": \"ba\"}\n").unwrap();
    let model = tiny_model();
    let scored = trinity(dir.path(), &["score", "--model", &model, "--input", "pairs.jsonl", "--device", "cpu"]);
    assert!(scored.status.success(), "{}", stderr(&scored));
    let line: serde_json::Value = serde_json::from_str(stdout(&scored).trim()).unwrap();
    let logprobs = line["logprobs"].as_array().unwrap();
    assert_eq!(logprobs.len(), line["response_tokens"].as_array().unwrap().len());
    assert!(logprobs.iter().all(|l| l.as_f64().unwrap() <= 0.0));
    assert!(stderr(&scored).contains("progress: score: 1/1 rows [####################] 100%"), "{}", stderr(&scored));
    // The config's dtype spellings are the flag's too, with the same meaning.
    let spelled = trinity(
        dir.path(),
        &["score", "--model", &model, "--input", "pairs.jsonl", "--device", "cpu", "--dtype", "float32"],
    );
    assert!(spelled.status.success(), "{}", stderr(&spelled));
    assert_eq!(stdout(&spelled), stdout(&scored), "--dtype float32 is --dtype f32");
    let bf16 = trinity(
        dir.path(),
        &["score", "--model", &model, "--input", "pairs.jsonl", "--device", "cpu", "--dtype", "bfloat16"],
    );
    assert!(bf16.status.success(), "{}", stderr(&bf16));
    // Emulated bf16 is honoured, with a warning that says why it is slow, only where the CPU lacks native bf16.
    let warned = stderr(&bf16).contains("this CPU has no native bf16");
    assert_eq!(warned, !trinity_model::fast_bf16(tch::Device::Cpu), "{}", stderr(&bf16));

    let missing = trinity(dir.path(), &["score", "--model", "nowhere", "--input", "pairs.jsonl"]);
    assert_clean_failure(&missing, &["nowhere"]);
    let chat_without_flag = {
        std::fs::write(dir.path().join("chat.jsonl"), "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n")
            .unwrap();
        trinity(dir.path(), &["score", "--model", &model, "--input", "chat.jsonl"])
    };
    assert_clean_failure(&chat_without_flag, &["chat.jsonl:1", "--chat"]);

    // A GGUF file converted to an HF directory scores exactly like the file itself.
    let gguf = workspace_root().join("runtime/model/tests/fixtures/tiny_llama.gguf").display().to_string();
    let converted = trinity(dir.path(), &["convert", "--gguf", &gguf, "--output", "hf"]);
    assert!(converted.status.success(), "{}", stderr(&converted));
    assert_eq!(stdout(&converted).trim(), "wrote hf", "progress stays off stdout");
    let shown = stderr(&converted);
    assert!(shown.lines().any(|l| l.starts_with("progress: convert: ") && l.ends_with(" s)")), "{shown}");
    let from_gguf = trinity(dir.path(), &["score", "--model", &gguf, "--input", "pairs.jsonl", "--device", "cpu"]);
    let from_hf = trinity(dir.path(), &["score", "--model", "hf", "--input", "pairs.jsonl", "--device", "cpu"]);
    assert!(from_gguf.status.success() && from_hf.status.success(), "{}{}", stderr(&from_gguf), stderr(&from_hf));
    assert_eq!(stdout(&from_gguf), stdout(&from_hf));
}

#[test]
fn convert_merges_a_lora_adapter_into_its_base_model() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model();
    let load =
        |path: &std::path::Path| trinity_model::load_model(path, tch::Kind::Float, tch::Device::Cpu).unwrap().decoder;
    // An adapter with non-zero B, as training leaves it, saved the way a LoRA run saves its checkpoints.
    let mut adapted = load(std::path::Path::new(&model));
    let spec = trinity_model::LoraSpec {
        rank: 2,
        alpha: 4.0,
        target_modules: trinity_model::ModuleSelector::AllLinear,
        exclude_modules: None,
        dropout: 0.0,
        use_rslora: false,
    };
    adapted.add_lora(&spec, 1).unwrap();
    tch::no_grad(|| {
        for (name, t) in adapted.lora_parameters() {
            if name.contains("lora_B") {
                t.shallow_clone().copy_(&(tch::Tensor::randn(t.size(), (tch::Kind::Float, tch::Device::Cpu)) * 0.1));
            }
        }
    });
    adapted.save_lora(&dir.path().join("adapter"), &spec, &model).unwrap();

    let converted = trinity(dir.path(), &["convert", "--adapter", "adapter", "--output", "merged"]);
    assert!(converted.status.success(), "{}", stderr(&converted));
    assert_eq!(stdout(&converted).trim(), "wrote merged");
    let merged = load(&dir.path().join("merged"));
    let ids = tch::Tensor::from_slice(&[1i64, 2, 3, 4, 5]).view([1, 5]);
    let want = adapted.forward(&ids, None).unwrap();
    let got = merged.forward(&ids, None).unwrap();
    let base = load(std::path::Path::new(&model)).forward(&ids, None).unwrap();
    assert!((&want - &got).abs().max().double_value(&[]) < 1e-4, "merged model differs from base + adapter");
    assert!((&want - &base).abs().max().double_value(&[]) > 1e-3, "the adapter changed nothing");

    // An adapter that names no base model needs --base; giving it works.
    adapted.save_lora(&dir.path().join("anonymous"), &spec, "").unwrap();
    let refused = trinity(dir.path(), &["convert", "--adapter", "anonymous", "--output", "x"]);
    assert_clean_failure(&refused, &["anonymous", "--base"]);
    let with_base = trinity(dir.path(), &["convert", "--adapter", "anonymous", "--base", &model, "--output", "y"]);
    assert!(with_base.status.success(), "{}", stderr(&with_base));
}
