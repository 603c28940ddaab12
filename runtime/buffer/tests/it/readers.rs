//! Every taskset reader through `Taskset::load`, including the Hugging Face directory layouts.

use std::path::Path;

use trinity_buffer::{BufferError, Taskset};
use trinity_config::buffer::TasksetConfig;

use crate::support::write_parquet;

fn config(path: &Path, subset: Option<&str>, split: &str) -> TasksetConfig {
    let mut config = TasksetConfig {
        name: "t".into(),
        path: path.display().to_string(),
        subset_name: subset.map(str::to_owned),
        split: split.into(),
        default_workflow_type: Some("math_workflow".into()),
        default_reward_fn_type: Some("math_reward".into()),
        ..Default::default()
    };
    config.format.prompt_key = "question".into();
    config.format.response_key = "answer".into();
    config
}

#[test]
fn hf_subset_layout_with_sharded_parquet() {
    // gsm8k as `huggingface-cli download openai/gsm8k --repo-type dataset` leaves it.
    let dir = tempfile::tempdir().unwrap();
    write_parquet(&dir.path().join("main/train-00000-of-00002.parquet"), &[("a", 1), ("b", 2)]);
    write_parquet(&dir.path().join("main/train-00001-of-00002.parquet"), &[("c", 3)]);
    write_parquet(&dir.path().join("main/test-00000-of-00001.parquet"), &[("z", 9)]);
    write_parquet(&dir.path().join("socratic/train-00000-of-00001.parquet"), &[("s", 0)]);
    std::fs::write(dir.path().join("README.md"), "# gsm8k").unwrap();
    let ts = Taskset::load(&config(dir.path(), Some("main"), "train"), 0, false).unwrap();
    let tasks = ts.all_tasks().unwrap();
    let prompts: Vec<_> = tasks.iter().map(|t| t.prompt().unwrap()).collect();
    assert_eq!(prompts, ["a", "b", "c"]);
    assert_eq!(tasks[2].truth().as_deref(), Some("3"));
    assert_eq!(tasks[2].reward_fn.as_deref(), Some("math_reward"));
    let test = Taskset::load(&config(dir.path(), Some("main"), "test"), 0, true).unwrap();
    assert_eq!(test.len(), 1);
    assert!(test.task(0).unwrap().is_eval);
}

#[test]
fn hf_data_dir_and_plain_split_files() {
    let dir = tempfile::tempdir().unwrap();
    write_parquet(&dir.path().join("data/train-00000-of-00001.parquet"), &[("p", 1)]);
    assert_eq!(Taskset::load(&config(dir.path(), None, "train"), 0, false).unwrap().len(), 1);

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("train.jsonl"), "{\"question\": \"q1\", \"answer\": \"1\"}\n").unwrap();
    std::fs::write(dir.path().join("test.json"), r#"[{"question": "q2", "answer": "2"}]"#).unwrap();
    assert_eq!(Taskset::load(&config(dir.path(), None, "train"), 0, false).unwrap().len(), 1);
    let test = Taskset::load(&config(dir.path(), None, "test"), 0, true).unwrap();
    assert_eq!(test.task(0).unwrap().prompt().as_deref(), Some("q2"));
}

#[test]
fn single_files_of_each_format() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("t.jsonl");
    std::fs::write(&jsonl, "{\"question\": \"a\", \"answer\": 1}\n{\"question\": \"b\", \"answer\": 2}\n").unwrap();
    let json = dir.path().join("t.json");
    std::fs::write(&json, r#"[{"question": "a", "answer": 1}, {"question": "b", "answer": 2}]"#).unwrap();
    let parquet = dir.path().join("t.parquet");
    write_parquet(&parquet, &[("a", 1), ("b", 2)]);
    for path in [&jsonl, &json, &parquet] {
        let ts = Taskset::load(&config(path, None, "train"), 0, false).unwrap();
        let truths: Vec<_> = ts.all_tasks().unwrap().iter().map(|t| t.truth().unwrap()).collect();
        assert_eq!(truths, ["1", "2"], "{}", path.display());
    }
}

#[test]
fn errors_name_file_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"question\": \"a\"}\n{\"question\": \"b\",}\n").unwrap();
    let text = Taskset::load(&config(&bad, None, "train"), 0, false).unwrap_err().to_string();
    assert!(text.contains("bad.jsonl") && text.contains("line 2"), "{text}");

    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    assert!(matches!(Taskset::load(&config(&empty, None, "train"), 0, false), Err(BufferError::EmptyTaskset { .. })));

    let missing_split = Taskset::load(&config(dir.path(), Some("main"), "validation"), 0, false).unwrap_err();
    assert!(matches!(missing_split, BufferError::NoSplitFiles { .. }), "{missing_split}");

    let mut with_key = config(&dir.path().join("rows.jsonl"), None, "train");
    with_key.format.reward_fn_key = "reward".into();
    std::fs::write(dir.path().join("rows.jsonl"), "{\"question\": \"a\"}\n{\"question\": \"b\", \"reward\": [1]}\n")
        .unwrap();
    let text = Taskset::load(&with_key, 0, false).unwrap_err().to_string();
    assert!(text.contains("row 1") && text.contains("`reward`"), "{text}");
}

#[test]
fn eval_tasksets_load_from_the_buffer_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eval.jsonl");
    std::fs::write(&path, "{\"question\": \"a\", \"answer\": 1}\n{\"question\": \"b\", \"answer\": 2}\n").unwrap();
    let mut buffer = trinity_config::buffer::BufferConfig::default();
    buffer.explorer_input.eval_tasksets = vec![config(&path, None, "test"), config(&path, None, "test")];
    let eval = trinity_buffer::load_eval_tasksets(&buffer).unwrap();
    assert_eq!(eval.len(), 2);
    assert_eq!(eval[1].taskset_id, 1);
    assert!(eval[1].all_tasks().unwrap().iter().all(|t| t.is_eval && t.taskset_id == 1));
}
