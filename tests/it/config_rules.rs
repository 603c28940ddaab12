//! Key categories through the binary: placement keys are noted and never refuse, refused keys name why,
//! `trainer.trainer_config` maps onto the top-level keys, Trinity-RFT's validator corrections apply, and a
//! dry run refuses exactly what the run refuses.

use std::path::Path;

use crate::support::{assert_clean_failure, stderr, stdout, trinity};

const BASE: &str = "\
project: p
name: n
algorithm:
  algorithm_type: grpo
  repeat_times: 4
model:
  model_path: /models/tiny
  max_model_len: 256
  max_response_tokens: 64
buffer:
  batch_size: 2
  explorer_input:
    taskset:
      name: train
      path: /data/train.jsonl
";

fn run(text: &str, dry_run: bool) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, text).unwrap();
    let path = path.display().to_string();
    let mut args = vec!["run", "--config", path.as_str()];
    if dry_run {
        args.push("--dry-run");
    }
    trinity(Path::new(dir.path()), &args)
}

#[test]
fn placement_keys_are_accepted_with_one_note_each() {
    let text = format!(
        "{BASE}explorer:\n  max_repeat_times_per_runner: 2\n  rollout_model:\n    engine_num: 4\n    tensor_parallel_size: 2\n    gpu_memory_utilization: 0.5\n    enforce_eager: true\ntrainer:\n  ulysses_sequence_parallel_size: 2\n  trainer_strategy: megatron\ncluster:\n  node_num: 2\n  gpu_per_node: 8\n"
    );
    let output = run(&text, true);
    let err = stderr(&output);
    assert!(output.status.success(), "{err}");
    for key in [
        "explorer.max_repeat_times_per_runner",
        "explorer.rollout_model.engine_num",
        "explorer.rollout_model.tensor_parallel_size",
        "explorer.rollout_model.gpu_memory_utilization",
        "explorer.rollout_model.enforce_eager",
        "trainer.ulysses_sequence_parallel_size",
        "trainer.trainer_strategy",
        "cluster.node_num",
    ] {
        assert_eq!(err.matches(&format!("`{key}` (placement)")).count(), 1, "one note for {key}:\n{err}");
    }
    assert!(stdout(&output).contains("engine_num: 4"), "the value is kept as written");
}

#[test]
fn refused_keys_name_the_key_and_the_reason_only_when_not_default() {
    let cases = [
        (
            format!("{BASE}explorer:\n  rollout_model:\n    reasoning_parser: granite\n"),
            vec!["`explorer.rollout_model.reasoning_parser`", "`granite`", "`deepseek_r1` and `qwen3`"],
        ),
        (
            BASE.replace(
                "      path: /data/train.jsonl\n",
                "      path: /data/train.jsonl\n      format:\n        image_key: img\n",
            ),
            vec!["`buffer.explorer_input.taskset.format.image_key`", "text-only"],
        ),
        (
            format!("{BASE}trainer:\n  trainer_config:\n    critic:\n      shuffle: true\n"),
            vec!["`trainer.trainer_config.critic.shuffle`", "buffer order"],
        ),
        (
            format!("{BASE}trainer:\n  trainer_config:\n    actor_rollout_ref:\n      model:\n        lora_rank: 8\n"),
            vec!["`trainer.trainer_config.actor_rollout_ref.model.lora_rank`", "LoRA"],
        ),
        (
            BASE.replace(
                "      path: /data/train.jsonl\n",
                "      path: /data/train.jsonl\n      format:\n        messages_key: chat\n",
            ),
            vec!["`buffer.explorer_input.taskset.format.messages_key`", "SFT / DPO rows"],
        ),
        (
            format!("{BASE}data_processor:\n  task_pipeline:\n    operators: []\n"),
            vec!["`data_processor.task_pipeline`", "Data-Juicer"],
        ),
    ];
    for (text, expected) in cases {
        assert_clean_failure(&run(&text, true), &expected);
    }
    // The same keys at their defaults change nothing and pass.
    let defaults = format!(
        "{BASE}  trainer_input:\n    experience_buffer:\n      replay_buffer:\n        enable: false\n        priority_fn: linear_decay\nexplorer:\n  auxiliary_models: []\n  rollout_model:\n    enable_openai_api: false\n    tool_call_parser: null\n"
    );
    let output = run(&defaults, true);
    assert!(output.status.success(), "{}", stderr(&output));
}

#[test]
fn python_workflows_name_what_they_need_and_how_to_bring_them() {
    for (workflow, needs) in [
        ("alfworld_workflow", "ALFWorld"),
        // A dotted path is run by the Python workflow host (tests/it/python_workflow.rs checks its errors).
        ("agentscope_react_workflow", "AgentScope"),
    ] {
        let text =
            BASE.replace("  explorer_input:\n", &format!("  explorer_input:\n    default_workflow_type: {workflow}\n"));
        assert_clean_failure(
            &run(&text, true),
            &[
                &format!("workflow `{workflow}`"),
                needs,
                "WASM workflow plugin",
                "new-plugin --kind workflow",
                "mode: serve",
            ],
        );
    }
}

#[test]
fn trainer_config_maps_onto_the_top_level_keys_with_trinity_precedence() {
    let text = format!(
        "{BASE}trainer:
  grad_clip: 1.0
  trainer_config:
    actor_rollout_ref:
      actor:
        ppo_epochs: 2
        ppo_mini_batch_size: 4
        grad_clip: 0.5
        clip_ratio: 0.3
        entropy_coeff: 0.01
        use_kl_loss: true
        kl_loss_coef: 0.02
        kl_loss_type: low_var_kl
        optim:
          lr: 3e-6
        fsdp_config:
          param_offload: true
        checkpoint:
          load_contents: [model]
    critic:
      optim:
        lr: 1e-5
      ppo_max_token_len_per_gpu: 32768
      forward_max_token_len_per_gpu: ${{trainer.trainer_config.critic.ppo_max_token_len_per_gpu}}
      cliprange_value: 0.5
    trainer:
      max_actor_ckpt_to_keep: 5
      balance_batch: false
"
    );
    let output = run(&text, true);
    let err = stderr(&output);
    assert!(output.status.success(), "{err}");
    let resolved = stdout(&output);
    let section = |name: &str| -> String {
        let start = resolved.find(&format!("\n{name}:")).unwrap_or_else(|| panic!("no {name} in\n{resolved}"));
        resolved[start + 1..].lines().skip(1).take_while(|l| l.starts_with(' ')).collect::<Vec<_>>().join("\n")
    };
    let algorithm = section("algorithm");
    for expected in ["clip_range: 0.3", "entropy_coef: 0.01", "kl_loss_fn: low_var_kl", "kl_coef: 0.02", "lr: 3e-6"] {
        assert!(algorithm.contains(expected), "missing {expected:?} in algorithm:\n{algorithm}");
    }
    let trainer = section("trainer");
    for expected in [
        "grad_clip: 0.5",
        "max_checkpoints_to_keep: 5",
        "ppo_epochs: 2",
        "ppo_mini_batch_size: 4",
        "forward_max_token_len_per_gpu: 32768",
        "cliprange_value: 0.5",
        "lr: 1e-5",
    ] {
        assert!(trainer.contains(expected), "missing {expected:?} in trainer:\n{trainer}");
    }
    for note in [
        // Each of the actor's FSDP keys is named: parameter offload holds on this CPU run (refused on CUDA).
        "trainer.trainer_config.actor_rollout_ref.actor.fsdp_config.param_offload` (true) wins over \
         trainer.param_offload",
        "trainer.trainer_config.trainer.balance_batch` (placement)",
        "trainer.trainer_config.actor_rollout_ref.actor.clip_ratio` is used as algorithm.policy_loss_fn_args.clip_range",
    ] {
        assert!(err.contains(note), "missing note {note:?}:\n{err}");
    }

    // A top-level value the user wrote wins over the veRL one.
    let explicit = text.replace("  repeat_times: 4\n", "  repeat_times: 4\n  optimizer:\n    lr: 7e-6\n");
    let output = run(&explicit, true);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("lr: 7e-6"), "{}", stdout(&output));
    assert!(stderr(&output).contains("is overridden by algorithm.optimizer.lr"), "{}", stderr(&output));

    // Mini-batches must split a train step evenly (2 tasks × 4 repeats = 8 experiences).
    let uneven = text.replace("ppo_mini_batch_size: 4", "ppo_mini_batch_size: 3");
    assert_clean_failure(&run(&uneven, true), &["ppo_mini_batch_size`", "must divide buffer.train_batch_size (8)"]);
}

#[test]
fn validator_corrections_apply_with_a_note_instead_of_refusing() {
    let text = format!(
        "{BASE}  trainer_input:\n    experience_buffer:\n      path: ./exp_buffer\nsynchronizer:\n  sync_interval: 4\nexplorer:\n  eval_interval: 10\nmonitor:\n  monitor_type: csv\n  monitor_args:\n    project: x\n"
    );
    let output = run(&text, true);
    let err = stderr(&output);
    assert!(output.status.success(), "{err}");
    let resolved = stdout(&output);
    assert!(resolved.contains("eval_interval: 8"), "rounded down to a multiple of sync_interval:\n{resolved}");
    assert!(err.contains("monitor.monitor_args are ignored: monitor `csv` takes none"), "{err}");
    assert!(err.contains("explorer.eval_interval (10) is rounded to 8"), "{err}");
    assert!(
        err.contains("`./exp_buffer` is neither"),
        "a queue copy trinity cannot write is dropped with a note:\n{err}"
    );
}

#[test]
fn dry_run_refuses_exactly_what_the_run_refuses() {
    let cases = [
        (
            format!("{BASE}mode: serve\n"),
            vec!["`buffer.trainer_input.experience_buffer.path`", "a `mode: train` trainer"],
        ),
        (
            format!("{BASE}mode: explore\n"),
            vec!["`buffer.trainer_input.experience_buffer.path`", "in this process's memory"],
        ),
        (
            format!("{BASE}stages:\n  - stage_name: warmup\n  - stage_name: apart\n    mode: train\n"),
            vec!["`stages[1].buffer.train_batch_size`", "stage `apart` does not set `buffer`"],
        ),
        (
            BASE.replace(
                "      path: /data/train.jsonl\n",
                "      path: sqlite:///tasks.db\n      storage_type: sql\n",
            ),
            vec!["storage_type`", "`sql` tasksets are not read yet"],
        ),
        (
            format!(
                "{BASE}data_processor:\n  experience_pipeline:\n    operators:\n      - name: reward_shapping_mapper\n"
            ),
            vec!["unknown operator `reward_shapping_mapper`", "did you mean `reward_shaping_mapper`"],
        ),
        (
            BASE.replace("algorithm_type: grpo", "algorithm_type: grpo\n  sample_strategy: mix"),
            vec!["`buffer.trainer_input.auxiliary_buffers`", "auxiliary buffer `sft_dataset`"],
        ),
    ];
    for (text, expected) in cases {
        let dry = run(&text, true);
        let real = run(&text, false);
        assert_clean_failure(&dry, &expected);
        assert_clean_failure(&real, &expected);
        // The same message, past the temporary directory each run had.
        let last_line = |o: &std::process::Output| {
            let line = stderr(o).lines().last().unwrap_or_default().to_owned();
            line.split_once("config.yaml").map(|(_, rest)| rest.to_owned()).unwrap_or(line)
        };
        assert_eq!(last_line(&dry), last_line(&real), "same message from the dry run and the run");
    }
}

#[test]
fn log_level_from_the_config_applies_unless_the_flag_says_otherwise() {
    // A placement note is a warning: `log.level: ERROR` hides it, `--log-level warn` brings it back.
    let text = format!("{BASE}log:\n  level: ERROR\ntrainer:\n  ulysses_sequence_parallel_size: 2\n");
    let quiet = run(&text, true);
    assert!(quiet.status.success(), "{}", stderr(&quiet));
    assert!(!stderr(&quiet).contains("ulysses_sequence_parallel_size"), "{}", stderr(&quiet));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, &text).unwrap();
    let loud = trinity(dir.path(), &["--log-level", "warn", "run", "--config", path.to_str().unwrap(), "--dry-run"]);
    assert!(stderr(&loud).contains("ulysses_sequence_parallel_size"), "{}", stderr(&loud));
}

/// `explorer.env_vars` become the agent programs' environment (tests/it/agent_process.rs runs one): scalars pass
/// with a note saying where they apply, anything that cannot be an environment variable names its key.
#[test]
fn env_vars_are_scalars_and_say_where_they_apply() {
    let output = run(&format!("{BASE}explorer:\n  env_vars:\n    TMPDIR: /tmp\n    N: 3\n"), true);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stderr(&output).contains("agent_process_workflow"), "{}", stderr(&output));
    let output = run(&format!("{BASE}explorer:\n  env_vars:\n    A:\n      b: 1\n"), true);
    assert_clean_failure(&output, &["explorer.env_vars.A", "environment variable"]);
}
