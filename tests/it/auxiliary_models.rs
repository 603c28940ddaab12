//! `explorer.auxiliary_models` in a run: on-policy distillation on the tiny model, with the same tiny model as its
//! own teacher, so the teacher's logprobs of every sampled token must equal the student's (a misaligned slice, a
//! wrong temperature or a wrong model would show), and the trainer trains on them.

use crate::support::{grpo_run_config, stderr, tiny_model_dir, trinity};

fn distill_dir(algorithm: &str, aux: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..4).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let config =
        grpo_run_config(&tiny_model_dir(), 40).replace("algorithm_type: grpo", &format!("algorithm_type: {algorithm}"));
    let config = format!(
        "{config}    default_workflow_type: on_policy_distill_workflow
  total_steps: 2
explorer:
  rollout_model:
    dtype: float32
  auxiliary_models:{aux}
"
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    dir
}

#[test]
fn a_model_distilled_from_itself_gets_its_own_logprobs_as_teacher_logprobs() {
    let aux = format!(
        "\n    - model_path: {}\n      name: teacher\n      dtype: float32\n      max_model_len: 64",
        tiny_model_dir().display()
    );
    let dir = distill_dir("on_policy_distill", &aux);
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let experiences: Vec<serde_json::Value> = std::fs::read_to_string(job.join("experiences.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(experiences.len(), 8, "2 steps × 2 tasks × 2 rollouts");
    for e in &experiences {
        let student: Vec<f64> = e["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let teacher: Vec<f64> = e["teacher_logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!(student.len(), teacher.len());
        for (s, t) in student.iter().zip(&teacher) {
            assert!((s - t).abs() < 1e-3, "student {student:?} vs teacher {teacher:?}");
        }
        assert!(e["metrics"]["kl_divergence"].as_f64().unwrap().abs() < 1e-2, "{e}");
    }
    let metrics = std::fs::read_to_string(job.join("monitor/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2, "{metrics}");
}

#[test]
fn a_distill_workflow_without_a_teacher_is_refused_before_the_run() {
    let dir = distill_dir("jsd", " []");
    let output = trinity(dir.path(), &["run", "--config", "config.yaml", "--dry-run"]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("on_policy_distill_workflow") && err.contains("explorer.auxiliary_models"), "{err}");
}
