//! Continued pre-training (Trinity-RFT 0.6.0's `algorithm_type: cpt`) through the `trinity` binary: a mode-train
//! run on plain text, whose loss at each step is checked against the next-token loss `trinity score` computes
//! independently, with the weights that step trained (the base model, then the checkpoint of the step before).

use std::path::Path;

use serde_json::{Value, json};

use crate::support::{stderr, stdout, tiny_model_dir, trinity};

/// Texts of unequal lengths in the tiny vocabulary's single letters (no merge spans their first letter), so
/// `trinity score` splits each as the CPT formatter does: the first token, then the rest.
const TEXTS: [&str; 4] = ["abc dig", "fab", "cafe bad bead", "dice"];

fn config(model: &Path) -> String {
    format!(
        "project: p
name: cpt
mode: train
checkpoint_root_dir: ./ckpt
algorithm:
  algorithm_type: cpt
  optimizer:
    lr: 1e-2
model:
  model_path: {}
  max_model_len: 32
buffer:
  train_batch_size: 2
  trainer_input:
    experience_buffer:
      name: corpus
      storage_type: file
      path: corpus.jsonl
      format:
        prompt_type: plaintext
        prompt_key: text
trainer:
  total_steps: 2
  save_interval: 1
  dtype: float32
  use_dynamic_bsz: false
monitor:
  monitor_type: jsonl
",
        model.display()
    )
}

/// The token-mean of −log p(token | earlier tokens) over every token but each text's first, under `model`, from
/// `trinity score`; also the number of tokens it averaged.
fn next_token_loss(dir: &Path, model: &Path, texts: &[&str]) -> (f64, usize) {
    let lines: String =
        texts.iter().map(|t| format!("{}\n", json!({"prompt": &t[..1], "response": &t[1..]}))).collect();
    std::fs::write(dir.join("score.jsonl"), lines).unwrap();
    let model = model.display().to_string();
    let scored = trinity(dir, &["score", "--model", &model, "--input", "score.jsonl", "--device", "cpu"]);
    assert!(scored.status.success(), "score: {}", stderr(&scored));
    let (mut sum, mut count) = (0.0, 0);
    for line in stdout(&scored).lines() {
        let line: Value = serde_json::from_str(line).unwrap();
        assert_eq!(line["prompt_tokens"].as_array().unwrap().len(), 1, "one prompt token: {line}");
        for logprob in line["logprobs"].as_array().unwrap() {
            sum -= logprob.as_f64().unwrap();
            count += 1;
        }
    }
    (sum / count as f64, count)
}

#[test]
fn cpt_trains_the_next_token_loss_of_plain_text() {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = TEXTS.iter().enumerate().map(|(i, t)| format!("{}\n", json!({"id": i, "text": t}))).collect();
    std::fs::write(dir.path().join("corpus.jsonl"), rows).unwrap();
    std::fs::write(dir.path().join("c.yaml"), config(&tiny_model_dir())).unwrap();
    let run = trinity(dir.path(), &["run", "--config", "c.yaml"]);
    assert!(run.status.success(), "cpt run failed:\n{}", stderr(&run));

    let job = dir.path().join("ckpt/p/cpt");
    let metrics = std::fs::read_to_string(job.join("monitor/trainer/metrics.jsonl")).unwrap();
    let steps: Vec<Value> = metrics.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(steps.len(), 2, "{metrics}");
    // Step 1 trains rows 0 and 1 with the base weights, step 2 rows 2 and 3 with step 1's.
    let step_1_weights = job.join("global_step_1/hf");
    let scorers = [tiny_model_dir(), step_1_weights];
    for (step, (metrics, model)) in steps.iter().zip(&scorers).enumerate() {
        let texts = &TEXTS[2 * step..2 * step + 2];
        let (expected, tokens) = next_token_loss(dir.path(), model, texts);
        for key in ["train/loss", "train/sft_loss"] {
            let got = metrics[key].as_f64().unwrap_or_else(|| panic!("no {key}: {metrics}"));
            println!("step {}: {key} {got:.6}, scored {expected:.6} over {tokens} tokens", step + 1);
            assert!(
                (got - expected).abs() <= 1e-4 * expected.max(1.0),
                "step {}: {key} {got} is not the token-mean next-token loss {expected} of {texts:?}",
                step + 1
            );
        }
    }
    // Step 2's number depends on step 1 having trained: the base model scores those rows differently.
    let (base, _) = next_token_loss(dir.path(), &tiny_model_dir(), &TEXTS[2..]);
    let second = steps[1]["train/loss"].as_f64().unwrap();
    assert!((base - second).abs() > 1e-3, "step 1 moved nothing: {base} vs {second}");
}

#[test]
fn cpt_is_listed_and_evaluates_as_the_sft_loss() {
    let dir = tempfile::tempdir().unwrap();
    let list = trinity(dir.path(), &["algorithm", "list", "--json"]);
    assert!(list.status.success(), "{}", stderr(&list));
    let cpt = stdout(&list)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|item| item["name"] == "cpt")
        .unwrap_or_else(|| panic!("no cpt in:\n{}", stdout(&list)));
    assert_eq!(
        (&cpt["default_args"]["schema"], &cpt["default_args"]["policy_loss_fn"]),
        (&json!("cpt"), &json!("sft"))
    );
    let input = json!({"algorithm_type": "cpt", "batch": {
        "logprob": [[-1.0, -2.0], [-3.0, 0.0]], "action_mask": [[1, 1], [1, 0]]}});
    std::fs::write(dir.path().join("input.json"), input.to_string()).unwrap();
    let eval = trinity(dir.path(), &["algorithm", "eval", "--input", "input.json"]);
    assert!(eval.status.success(), "{}", stderr(&eval));
    let out: Value = serde_json::from_str(&stdout(&eval)).unwrap();
    assert!((out["loss"].as_f64().unwrap() - 2.0).abs() < 1e-6, "token-mean of 1, 2, 3: {out}");
}

#[test]
fn a_cpt_dataset_without_its_text_field_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("corpus.jsonl"), "{\"text\": \"abc\"}\n{\"body\": \"abc\"}\n").unwrap();
    std::fs::write(dir.path().join("c.yaml"), config(&tiny_model_dir())).unwrap();
    let run = trinity(dir.path(), &["run", "--config", "c.yaml"]);
    crate::support::assert_clean_failure(
        &run,
        &["buffer.trainer_input.experience_buffer", "row 1", "no `text` field (format.prompt_key)", "`body`"],
    );
    // 0.6.0's CPT formatter reads plain text only: the default `messages` layout is refused before the run.
    let messages = config(&tiny_model_dir()).replace("prompt_type: plaintext", "prompt_type: messages");
    std::fs::write(dir.path().join("m.yaml"), messages).unwrap();
    let dry = trinity(dir.path(), &["run", "--config", "m.yaml", "--dry-run"]);
    crate::support::assert_clean_failure(&dry, &["format.prompt_type", "plaintext"]);
}
