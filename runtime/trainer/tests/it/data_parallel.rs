//! Data-parallel training across processes on loopback: ranks agree bit for bit after every step, and their step
//! equals the one-process step on the whole batch (within 1e-5 relative) for GRPO and PPO with token-mean loss
//! aggregation, even and uneven shares; on rows of unequal length whose ranks' micro-batches are not one process's
//! (SFT and GRPO), step 1's loss within 1e-6 and the final weights within 2% of what training moved them. Each
//! test runs the ranks and a one-process reference as separate processes (this binary started again, entering
//! `dp_child`), so every process draws the same random weights. With LoRA
//! adapters the same holds for the adapters, and the frozen base weights stay rank 0's on every rank.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tch::{Kind, Tensor};
use trinity_collective::testing::{assert_all_succeeded, run_ranks, var};
use trinity_collective::{GroupOptions, ProcessGroup, Store, WeightReceiver, WeightSender, WeightSyncOptions};
use trinity_config::algorithm::AlgorithmConfig;
use trinity_model::LoraSpec;
use trinity_trainer::{MicroBatching, StartingModels, TrainRow, Trainer, TrainerOptions, ZeroStage, share_rows};

use crate::{algorithm, tiny_model, trainer, uneven_rows};

const STEPS: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(30);
/// Large enough that three steps move the parameters well beyond the tolerance, small enough that AdamW's
/// normalisation does not magnify the rounding differences of a differently ordered gradient sum past it.
const LR: f64 = 2e-3;

/// `n` rows of different prompt and response lengths, some tokens masked, with rewards (PPO) or advantages (GRPO).
fn rows(n: usize, with_advantages: bool) -> Vec<TrainRow> {
    (0..n)
        .map(|i| {
            let prompt: Vec<i64> = (0..2 + i % 2).map(|j| 1 + ((i + j) % 5) as i64).collect();
            let response: Vec<i64> = (0..1 + (i * 3) % 4).map(|j| 3 + ((i * 7 + j * 3) % 11) as i64).collect();
            let mut r = TrainRow::sft(&prompt, &response);
            r.logprobs = (0..response.len()).map(|j| -2.0 - 0.1 * j as f32 - 0.05 * i as f32).collect();
            if response.len() > 2 {
                r.action_mask[1] = false;
            }
            r.reward = Some(if i % 3 == 0 { 1.0 } else { -0.5 });
            if with_advantages {
                r.advantages = Some((0..response.len()).map(|j| (i as f32 - 2.5) * 0.3 + 0.1 * j as f32).collect());
            }
            r.group_id = Some(format!("task-{}", i / 4));
            r
        })
        .collect()
}

struct Scenario {
    algorithm: AlgorithmConfig,
    options: TrainerOptions,
    rows: Vec<TrainRow>,
}

fn scenario(name: &str) -> Scenario {
    if let Some(s) = zero_scenario(name) {
        return s;
    }
    let options = |micro: usize, mini: Option<usize>| TrainerOptions {
        micro_batching: MicroBatching::Rows(micro),
        mini_batch_rows: mini,
        ..TrainerOptions::default()
    };
    match name {
        // 8 rows, 4 per rank, micro-batches of 2: the one-process micro-batches exactly.
        "grpo" | "dies" | "explorer" => {
            Scenario { algorithm: algorithm("grpo", |_| {}), options: options(2, None), rows: rows(8, true) }
        }
        // 7 rows in mini-batches of 4 and 3 (shares 2/2 and 2/1), critic shares 4/3, GAE over the whole batch.
        "ppo" => Scenario { algorithm: algorithm("ppo", |_| {}), options: options(1, Some(4)), rows: rows(7, false) },
        // The GRPO scenario with LoRA adapters on every projection: only the adapters train.
        "grpo_lora" => {
            Scenario { algorithm: algorithm("grpo", |_| {}), options: options(2, None), rows: rows(8, true) }
        }
        // 3 ranks on 8 rows: shares 3/3/2.
        "grpo3" => Scenario { algorithm: algorithm("grpo", |_| {}), options: options(1, None), rows: rows(8, true) },
        // Rows of unequal length: one process trains each step as one micro-batch, each rank its share as one
        // (13 and 16 response tokens): the ranks' token means must weigh as the whole batch's.
        "sft_uneven" => {
            Scenario { algorithm: algorithm("sft", |_| {}), options: options(8, None), rows: uneven_rows(8, false) }
        }
        // GRPO with entropy and KL terms on rows of unequal length, micro-batches of 3 rows: one process cuts
        // {0,1,2} {3,4,5} {6,7}, the ranks {0,1,2} {3} and {4,5,6} {7}.
        "grpo_uneven" => Scenario {
            algorithm: algorithm("grpo", |a| {
                a.entropy_loss_fn_args = crate::args(serde_json::json!({"entropy_coef": 0.01}));
                a.kl_loss_fn_args = crate::args(serde_json::json!({"kl_coef": 0.1}));
            }),
            options: options(3, None),
            rows: uneven_rows(8, true),
        },
        other => panic!("unknown scenario {other}"),
    }
}

/// The tiny model drawn from `seed`; in the LoRA scenario with adapters whose `A` is drawn from `seed` too, so
/// ranks other than 0 start from other adapters as well as other base weights.
fn model(name: &str, seed: i64) -> trinity_model::Decoder {
    let kind = if name.ends_with("_bf16") { Kind::BFloat16 } else { Kind::Float };
    let mut model = tiny_model(seed, kind);
    if name == "grpo_lora" {
        let spec = LoraSpec::all_linear(4, 8.0);
        model.add_lora(&spec, seed as u64).unwrap();
    }
    model
}

/// Saves the base parameters and, under `lora/`, the adapters.
fn save(dir: &Path, tag: &str, trainer: &Trainer, metrics: &BTreeMap<String, f64>) {
    let policy = trainer.policy();
    // Under stage 3 a collective: every rank saves after every step.
    let mut params = match trainer.fully_sharded() {
        true => {
            // Part by part, as a weight sync takes them: one unit (a decoder layer, then the outer parameters) at
            // a time, in the order the layout announces without gathering.
            let layout = trainer.policy_layout().unwrap();
            let mut parts = Vec::new();
            let consumed: Result<(), ()> = trainer
                .policy_parts(|part| {
                    parts.push(part);
                    Ok(())
                })
                .unwrap();
            consumed.unwrap();
            assert_eq!(parts.len() as i64, policy.config().num_hidden_layers + 1);
            let params: Vec<(String, Tensor)> = parts.into_iter().flatten().collect();
            let specs: Vec<_> = params.iter().map(|(n, t)| trinity_model::TensorSpec::of(n, t)).collect();
            assert_eq!(specs, layout);
            params
        }
        false => policy.named_parameters().unwrap(),
    };
    params.extend(policy.lora_parameters().into_iter().map(|(n, t)| (format!("lora/{n}"), t)));
    Tensor::write_safetensors(&params, dir.join(format!("{tag}.safetensors"))).unwrap();
    let kept: BTreeMap<&String, &f64> = metrics.iter().filter(|(k, _)| !k.starts_with("perf/")).collect();
    std::fs::write(dir.join(format!("{tag}.json")), serde_json::to_string(&kept).unwrap()).unwrap();
}

/// The entry point of a rank (or of the one-process reference); returns at once in an ordinary test run.
#[test]
fn dp_child() {
    let Ok(name) = std::env::var("TRINITY_DP_SCENARIO") else { return };
    let get = |k: &str| std::env::var(k).unwrap();
    let (rank, world): (usize, usize) =
        (get("TRINITY_DP_RANK").parse().unwrap(), get("TRINITY_DP_WORLD").parse().unwrap());
    let dir = PathBuf::from(get("TRINITY_DP_DIR"));
    let s = scenario(&name);
    let port: u16 = get("TRINITY_DP_PORT").parse().unwrap();
    if std::env::var("TRINITY_DP_EXPLORER").is_ok_and(|e| !e.is_empty()) {
        explorer(&dir, port);
        return;
    }
    let sharded = name.starts_with("zero");
    let resume = std::env::var("TRINITY_DP_RESUME").ok().filter(|r| !r.is_empty()).map(PathBuf::from);
    let steps = if sharded { ZERO_STEPS } else { STEPS };
    if world == 0 {
        // The reference: one process, the whole batch.
        let mut t = trainer(model(&name, 3), &s.algorithm, LR, s.options);
        if let Some(from) = &resume {
            // Continues from the sharded ranks' checkpoint.
            resume_from(&mut t, from, "rank0", "rank_state");
            for step in ZERO_SAVE_AFTER..steps {
                let m = t.train_step(&s.rows).unwrap();
                save(&dir, &format!("resumed_single_step{step}"), &t, &m);
            }
            save_final_state(&t, &dir, "resumed_single");
            return;
        }
        save(&dir, "single_init", &t, &BTreeMap::new());
        for step in 0..steps {
            let m = t.train_step(&s.rows).unwrap();
            save(&dir, &format!("single_step{step}"), &t, &m);
            if sharded && step + 1 == ZERO_SAVE_AFTER {
                let state = dir.join("single_state");
                std::fs::create_dir_all(&state).unwrap();
                t.save_state(&state).unwrap();
            }
        }
        if sharded {
            save_final_state(&t, &dir, "single");
        }
        let memory = serde_json::json!({"state_elements": t.optimizer().state_elements()});
        std::fs::write(dir.join("single_memory.json"), memory.to_string()).unwrap();
        return;
    }
    let store = Store::client("127.0.0.1", port, TIMEOUT).unwrap();
    let group = ProcessGroup::new(
        &store.with_prefix("dp").unwrap(),
        rank,
        world,
        &GroupOptions { timeout: TIMEOUT, ..GroupOptions::default() },
    )
    .unwrap();
    // Ranks other than 0 start from other weights: the broadcast at start must make them rank 0's.
    let model = model(&name, if rank == 0 { 3 } else { 100 + rank as i64 });
    let mut reference = None;
    if let Some(from) = resume.as_ref().filter(|_| name.starts_with("zero3")) {
        // Stage 3 shards the parameters when the trainer joins its group: a resumed run loads them before, as
        // `trinity run` loads a checkpoint's weights, and its KL reference is the base model.
        copy_weights(&model, &load(from, &format!("single_step{}", ZERO_SAVE_AFTER - 1)));
        reference = Some(self::model(&name, 3));
    }
    let components = trinity_trainer::Components::from_config(&s.algorithm).unwrap();
    let models = StartingModels { reference, critic: None };
    let t = Trainer::with_models(model, models, components, &crate::optimizer(LR), s.options).unwrap();
    // A state that will be sharded is not allocated before the group splits it: no rank ever holds it whole.
    let state_before_group = t.optimizer().state_elements();
    let mut t = t.with_process_group(group).unwrap();
    if let Some(from) = &resume {
        // The sharded ranks continue from the one process's checkpoint.
        resume_from(&mut t, from, "single", "single_state");
        for step in ZERO_SAVE_AFTER..steps {
            let rows = share_rows(t.process_group().unwrap(), 0, (rank == 0).then_some(&s.rows[..])).unwrap();
            let m = t.train_step(&rows).unwrap();
            save(&dir, &format!("resumed_rank{rank}_step{step}"), &t, &m);
        }
        save_final_state(&t, &dir, "resumed_rank");
        return;
    }
    save(&dir, &format!("rank{rank}_init"), &t, &BTreeMap::new());
    // Trainer rank 0 sends every step's weights to the explorer process (scenario `explorer`).
    let mut sender = (name == "explorer" && rank == 0).then(|| {
        let sender = WeightSender::host("127.0.0.1", 0, 1, sync_options()).unwrap();
        store.set("weight_sync_port", sender.port().to_string().as_bytes()).unwrap();
        sender
    });
    let steps = if name == "explorer" { EXPLORER_STEPS } else { steps };
    for step in 0..steps {
        // Rank 0 hands the rows to the others, as a run whose rank 0 reads the buffer does.
        let rows = share_rows(t.process_group().unwrap(), 0, (rank == 0).then_some(&s.rows[..])).unwrap();
        if name == "dies" && rank == 1 && step == 1 {
            std::process::abort();
        }
        let start = Instant::now();
        match t.train_step(&rows) {
            Ok(m) => {
                save(&dir, &format!("rank{rank}_step{step}"), &t, &m);
                if sharded && step + 1 == ZERO_SAVE_AFTER {
                    // A collective: every rank takes part, rank 0 writes.
                    let state = dir.join("rank_state");
                    std::fs::create_dir_all(&state).unwrap();
                    t.save_state(&state).unwrap();
                }
                if sharded && step + 1 == steps {
                    let m = t.sharded_memory().unwrap();
                    let expected = t.expected_memory();
                    let memory = serde_json::json!({
                        "state_elements": t.optimizer().state_elements(),
                        "state_elements_before_group": state_before_group,
                        "gradient_bytes": m.gradients,
                        "parameter_bytes": m.parameters,
                        "expected_state_bytes": expected.optimizer_state,
                        "expected_gradient_shard_bytes": expected.gradient_shard,
                        "expected_parameter_bytes": expected.parameters,
                        "offloaded": t.optimizer().is_offloaded() && expected.optimizer_offloaded,
                        "state_on_host": t.optimizer().state_devices().iter().all(|d| *d == tch::Device::Cpu),
                        "reference_shard_bytes": t.sharded_reference_memory().map(|r| r.parameter_shards),
                        "reference_whole": t.reference().map(|r| {
                            r.decoder().named_parameters().unwrap().iter().any(|(_, p)| p.numel() > 0)
                        }),
                    });
                    std::fs::write(dir.join(format!("rank{rank}_memory.json")), memory.to_string()).unwrap();
                    save_final_state(&t, &dir, "rank");
                }
                if let Some(sender) = &mut sender {
                    sender.publish(step as u64 + 1, &t.policy().named_parameters().unwrap()).unwrap();
                }
            }
            Err(e) => {
                println!("rank {rank} step {step}: error after {:.2} s: {e}", start.elapsed().as_secs_f64());
                assert!(start.elapsed() < Duration::from_secs(10));
                std::process::exit(3);
            }
        }
    }
}

const EXPLORER_STEPS: usize = 5;

fn sync_options() -> WeightSyncOptions {
    WeightSyncOptions { timeout: TIMEOUT, bucket_bytes: 1 << 14, ..WeightSyncOptions::default() }
}

/// An explorer process: receives every version trainer rank 0 publishes and keeps what it got.
fn explorer(dir: &Path, port: u16) {
    let store = Store::client("127.0.0.1", port, TIMEOUT).unwrap();
    let ws_port: u16 = String::from_utf8(store.get("weight_sync_port").unwrap()).unwrap().parse().unwrap();
    let mut receiver = WeightReceiver::connect("127.0.0.1", ws_port, sync_options()).unwrap();
    let mut last = 0;
    for _ in 0..EXPLORER_STEPS {
        let (version, weights) = receiver.receive().unwrap();
        assert!(version > last, "version {version} after {last}");
        last = version;
        Tensor::write_safetensors(&weights, dir.join(format!("explorer_v{version}.safetensors"))).unwrap();
        println!("explorer: applied version {version}");
    }
}

/// Runs `name` on `world` ranks plus the one-process reference (or, for `explorer`, an explorer process); returns
/// the folder with their outputs.
fn run(name: &str, world: usize) -> tempfile::TempDir {
    run_resuming(name, world, None)
}

/// [`run`]; with `resume`, the processes continue from the checkpoints a sharded run left there (the one process
/// from the ranks', the ranks from the one process's).
fn run_resuming(name: &str, world: usize, resume: Option<&Path>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let resume = resume.map(|r| r.display().to_string()).unwrap_or_default();
    let store = Store::server("127.0.0.1", 0, TIMEOUT).unwrap();
    // The reference process (world size 0 in its environment) runs beside the ranks.
    let processes = if name == "dies" { world } else { world + 1 };
    let envs: Vec<Vec<(String, String)>> = (0..processes)
        .map(|i| {
            let (rank, world) = if i == world { (0, 0) } else { (i, world) };
            let explorer = if name == "explorer" && i == processes - 1 { "1" } else { "" };
            vec![
                var("TRINITY_DP_EXPLORER", explorer),
                var("TRINITY_DP_SCENARIO", name),
                var("TRINITY_DP_RANK", rank),
                var("TRINITY_DP_WORLD", world),
                var("TRINITY_DP_PORT", store.port()),
                var("TRINITY_DP_DIR", dir.path().display()),
                var("TRINITY_DP_RESUME", &resume),
            ]
        })
        .collect();
    let outcomes = run_ranks("data_parallel::dp_child", &envs, Duration::from_secs(240));
    if name != "dies" {
        assert_all_succeeded(&outcomes);
    } else {
        let rank0 = &outcomes[0];
        assert_eq!(rank0.status.and_then(|s| s.code()), Some(3), "{}", rank0.output);
        println!("{}", rank0.output.lines().filter(|l| l.contains("error after")).collect::<String>());
    }
    dir
}

/// Saved parameters by name (a safetensors file does not keep the order they were written in).
fn load(dir: &Path, tag: &str) -> BTreeMap<String, Tensor> {
    Tensor::read_safetensors(dir.join(format!("{tag}.safetensors"))).unwrap().into_iter().collect()
}

fn metrics(dir: &Path, tag: &str) -> BTreeMap<String, f64> {
    serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{tag}.json"))).unwrap()).unwrap()
}

/// Asserts every rank's parameters and metrics after `step` equal rank 0's bit for bit; returns rank 0's parameters.
fn ranks_agree(dir: &Path, world: usize, step: usize) -> BTreeMap<String, Tensor> {
    let zero = load(dir, &format!("rank0_step{step}"));
    for rank in 1..world {
        let other = load(dir, &format!("rank{rank}_step{step}"));
        for ((name, a), (_, b)) in zero.iter().zip(&other) {
            assert!(a.equal(b), "step {step}: `{name}` differs between rank 0 and rank {rank}");
        }
        assert_eq!(metrics(dir, &format!("rank0_step{step}")), metrics(dir, &format!("rank{rank}_step{step}")));
    }
    zero
}

/// Checks bit-identical ranks after every step and the last step against the reference.
fn check(dir: &Path, world: usize) {
    for rank in 1..world {
        for ((name, a), (_, b)) in load(dir, "rank0_init").iter().zip(&load(dir, &format!("rank{rank}_init"))) {
            assert!(a.equal(b), "at start: `{name}` differs between rank 0 and rank {rank}");
        }
    }
    for step in 0..STEPS {
        let zero = ranks_agree(dir, world, step);
        let single = load(dir, &format!("single_step{step}"));
        let mut worst = 0f64;
        for ((name, a), (_, b)) in zero.iter().zip(&single) {
            let diff = (a - b).abs().max().double_value(&[]);
            let scale = b.abs().max().double_value(&[]).max(1e-6);
            worst = worst.max(diff / scale);
            assert!(diff <= 1e-5 * scale, "step {step}: `{name}` differs from one process by {diff} (scale {scale})");
        }
        let (dp, one) = (metrics(dir, &format!("rank0_step{step}")), metrics(dir, &format!("single_step{step}")));
        assert_eq!(dp.keys().collect::<Vec<_>>(), one.keys().collect::<Vec<_>>());
        for (k, v) in &dp {
            assert!((v - one[k]).abs() <= 1e-4 * (1.0 + one[k].abs()), "step {step}: metric {k}: {v} vs {}", one[k]);
        }
        println!("step {step}: worst relative parameter difference to one process {worst:.2e}");
    }
    // The steps moved the parameters: the comparison is not between two untouched models.
    let start = load(dir, "single_init");
    let end = load(dir, &format!("rank0_step{}", STEPS - 1));
    let moved =
        start.iter().zip(&end).map(|((_, a), (_, b))| (a - b).abs().max().double_value(&[])).fold(0.0, f64::max);
    assert!(moved > 1e-3, "parameters moved only {moved}");
}

/// Checks bit-identical ranks and, against one process, step 1's loss (within 1e-6) and the final weights (within 2%
/// of what training moved them): the tolerance of runs whose micro-batches differ, where gradients sum in another
/// order.
fn check_uneven(dir: &Path, world: usize, loss_metric: &str) {
    for step in 0..STEPS {
        ranks_agree(dir, world, step);
    }
    let (dp, one) = (metrics(dir, "rank0_step0"), metrics(dir, "single_step0"));
    let last = STEPS - 1;
    let (start, end, single) =
        (load(dir, "single_init"), load(dir, &format!("rank0_step{last}")), load(dir, &format!("single_step{last}")));
    let max_diff = |a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>| {
        a.iter().zip(b).map(|((_, x), (_, y))| (x - y).abs().max().double_value(&[])).fold(0.0, f64::max)
    };
    let (moved, apart) = (max_diff(&start, &single), max_diff(&end, &single));
    println!(
        "step-1 loss {:.8} on {world} ranks vs {:.8} in one process (diff {:.2e}); final weights differ by {apart:.2e}, \
         {:.2}% of the {moved:.2e} training moved them",
        dp["actor/loss"],
        one["actor/loss"],
        (dp["actor/loss"] - one["actor/loss"]).abs(),
        100.0 * apart / moved
    );
    for key in ["actor/loss", loss_metric] {
        assert!((dp[key] - one[key]).abs() <= 1e-6, "step 1: {key} {} on {world} ranks vs {}", dp[key], one[key]);
    }
    assert!(moved > 1e-3, "parameters moved only {moved}");
    assert!(apart <= 0.02 * moved, "final weights differ by {apart}, more than 2% of the {moved} training moved them");
}

#[test]
fn two_ranks_match_one_process_for_sft_on_rows_of_unequal_length() {
    let dir = run("sft_uneven", 2);
    check_uneven(dir.path(), 2, "actor/sft_loss");
}

#[test]
fn two_ranks_match_one_process_for_grpo_on_rows_of_unequal_length() {
    let dir = run("grpo_uneven", 2);
    check_uneven(dir.path(), 2, "actor/pg_loss");
}

#[test]
fn two_ranks_match_one_process_for_grpo() {
    let dir = run("grpo", 2);
    check(dir.path(), 2);
}

#[test]
fn two_ranks_with_uneven_shares_match_one_process_for_ppo_with_a_critic() {
    let dir = run("ppo", 2);
    check(dir.path(), 2);
}

/// LoRA under data parallelism: the adapters start as rank 0's, their gradients are reduced like full
/// parameters', and the frozen base weights never move (`check` compares both and requires the adapters to move).
#[test]
fn two_ranks_match_one_process_for_grpo_with_lora() {
    let dir = run("grpo_lora", 2);
    check(dir.path(), 2);
    let (start, end) = (load(dir.path(), "single_init"), load(dir.path(), &format!("rank0_step{}", STEPS - 1)));
    for (name, a) in start.iter().filter(|(name, _)| !name.starts_with("lora/")) {
        assert!(a.equal(&end[name]), "frozen base weight `{name}` moved");
    }
    let adapters = start.keys().filter(|name| name.starts_with("lora/")).count();
    assert_eq!(adapters, 2 * 7 * 2, "A and B for 7 projections in each of 2 layers");
}

#[test]
fn three_ranks_with_uneven_shares_match_one_process() {
    let dir = run("grpo3", 3);
    check(dir.path(), 3);
}

#[test]
fn a_rank_that_dies_fails_the_others_step() {
    run("dies", 2);
}

#[test]
fn two_trainer_ranks_and_an_explorer_process_sync_weights_every_step() {
    let dir = run("explorer", 2);
    for step in 0..EXPLORER_STEPS {
        let trained = load(dir.path(), &format!("rank0_step{step}"));
        let received = load(dir.path(), &format!("explorer_v{}", step + 1));
        assert_eq!(trained.len(), received.len());
        for (name, t) in &trained {
            assert!(t.equal(&received[name]), "version {}: `{name}` differs from the trainer's", step + 1);
        }
    }
}

/// Train steps of the sharded scenarios, and the step after which they write a checkpoint.
const ZERO_STEPS: usize = 5;
const ZERO_SAVE_AFTER: usize = 3;

/// `zero{1,2,2off}_{sft,grpo}_{f32,bf16}`: the uneven-rows scenarios with the policy's optimizer sharded (stage 1)
/// or its gradients too (stage 2; `2off` with `optimizer_offload`), in buckets small enough that the tiny model
/// spans several, with parameters cut between ranks.
fn zero_scenario(name: &str) -> Option<Scenario> {
    let mut parts = name.split('_');
    let (stage, offload) = match parts.next()? {
        "zero1" => (ZeroStage::OptimizerState, false),
        "zero2" => (ZeroStage::Gradients, false),
        "zero2off" => (ZeroStage::Gradients, true),
        "zero3" => (ZeroStage::Parameters, false),
        _ => return None,
    };
    let mut s = scenario(&format!("{}_uneven", parts.next()?));
    s.options.zero_stage = stage;
    s.options.optimizer_offload = offload;
    s.options.shard_bucket_bytes = 16 << 10;
    if stage == ZeroStage::Parameters {
        // 7 rows in micro-batches of 3, one pass each: rank 0 trains {0,1,2} {3}, rank 1 {4,5,6} and an idle pass;
        // GRPO recomputes its old logprobs, so forward-only sharded passes (and an idle one) run too.
        let with_advantages = s.rows[0].advantages.is_some();
        s.rows = uneven_rows(7, with_advantages);
        s.options.micro_batching = MicroBatching::Rows(3);
        s.options.pass_tokens = None;
        s.options.recompute_old_logprobs = with_advantages;
    }
    Some(s)
}

fn copy_weights(model: &trinity_model::Decoder, saved: &BTreeMap<String, Tensor>) {
    tch::no_grad(|| {
        for (name, mut p) in model.named_parameters().unwrap() {
            p.copy_(&saved[&name]);
        }
    });
}

/// Loads the policy's weights saved as `<tag>_step<ZERO_SAVE_AFTER - 1>` and the trainer state in `state` of
/// `from`.
fn resume_from(t: &mut Trainer, from: &Path, tag: &str, state: &str) {
    if !t.fully_sharded() {
        copy_weights(t.policy(), &load(from, &format!("{tag}_step{}", ZERO_SAVE_AFTER - 1)));
    }
    t.load_state(&from.join(state), ZERO_SAVE_AFTER as u64).unwrap();
}

/// The trainer state after the last step, in `<tag>_final` (a collective on sharded ranks).
fn save_final_state(t: &Trainer, dir: &Path, tag: &str) {
    let state = dir.join(format!("{tag}_final"));
    std::fs::create_dir_all(&state).unwrap();
    t.save_state(&state).unwrap();
}

/// The fp32 weights a run ended with: the parameters, or in bf16 their fp32 masters from the final state (a bf16
/// weight rounds a change of the 2% tolerance away: one unit in its last place is about a third of what five
/// steps move it). In bf16 the runs are compared by the L2 norm over all weights: the largest single element
/// differs by a quarter of its move between 2 ranks and one process even without sharding (bf16 logits of other
/// micro-batches flip the sign of AdamW's update where a gradient is near 0), 1.0% in norm for SFT.
fn final_weights(dir: &Path, tag: &str, state: &str, bf16: bool) -> BTreeMap<String, Tensor> {
    if !bf16 {
        return load(dir, &format!("{tag}_step{}", ZERO_STEPS - 1));
    }
    let saved = load(&dir.join(format!("{state}_final")), "optimizer");
    saved.into_iter().filter_map(|(k, t)| Some((k.strip_prefix("master/")?.to_owned(), t))).collect()
}

/// The L2 norm of the difference over all tensors.
fn l2_diff(a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>) -> f64 {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let square = |x: &Tensor, y: &Tensor| {
        (x.to_kind(Kind::Float) - y.to_kind(Kind::Float)).square().sum(Kind::Double).double_value(&[])
    };
    a.iter().zip(b).map(|((_, x), (_, y))| square(x, y)).sum::<f64>().sqrt()
}

fn max_diff(a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>) -> f64 {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    a.iter()
        .zip(b)
        .map(|((_, x), (_, y))| (x.to_kind(Kind::Float) - y.to_kind(Kind::Float)).abs().max().double_value(&[]))
        .fold(0.0, f64::max)
}

/// A sharded run against one process: ranks identical after every step, step 1's loss, the final weights within
/// 2% of what training moved them, each rank holding about half the optimizer state (and in stage 2 half the
/// gradients), and the checkpoints interchangeable: the ranks' optimizer file is the one process's format and
/// values, and a run resumed from either continues as the uninterrupted ones.
fn check_sharded(name: &str) {
    let dir = run(name, 2);
    let dir = dir.path();
    let bf16 = name.ends_with("_bf16");
    let last = ZERO_STEPS - 1;
    for step in 0..ZERO_STEPS {
        let (zero, one) = (load(dir, &format!("rank0_step{step}")), load(dir, &format!("rank1_step{step}")));
        for ((n, a), (_, b)) in zero.iter().zip(&one) {
            assert!(a.equal(b), "{name} step {step}: `{n}` differs between the ranks");
        }
    }
    let (dp, one) = (metrics(dir, "rank0_step0"), metrics(dir, "single_step0"));
    let loss_tolerance = if bf16 { 1e-3 } else { 1e-6 };
    assert!((dp["actor/loss"] - one["actor/loss"]).abs() <= loss_tolerance, "{name}: {dp:?} vs {one:?}");
    let start = load(dir, "single_init");
    let (single, end) = (final_weights(dir, "single", "single", bf16), final_weights(dir, "rank0", "rank", bf16));
    let gap = |a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>| match bf16 {
        true => l2_diff(a, b),
        false => max_diff(a, b),
    };
    let (moved, apart) = (gap(&start, &single), gap(&end, &single));
    println!(
        "{name}: final weights differ from one process by {apart:.2e}, {:.3}% of the {moved:.2e} training moved them \
         ({})",
        100.0 * apart / moved,
        if bf16 { "L2 norms of the fp32 masters" } else { "largest elements" }
    );
    assert!(max_diff(&start, &single) > 1e-3, "{name}: parameters moved only {moved}");
    assert!(apart <= 0.02 * moved, "{name}: final weights {apart} apart, more than 2% of {moved}");

    // Memory: each rank holds its half of the optimizer state (the chunks are padded to equal sizes, so a few
    // elements more than half at most); in stage 2 about half the gradients too.
    let json = |tag: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{tag}_memory.json"))).unwrap()).unwrap()
    };
    let whole = json("single")["state_elements"].as_i64().unwrap();
    let ranks: Vec<serde_json::Value> = (0..2).map(|r| json(&format!("rank{r}"))).collect();
    let held: Vec<i64> = ranks.iter().map(|m| m["state_elements"].as_i64().unwrap()).collect();
    println!("{name}: optimizer state elements per rank {held:?} of {whole} unsharded");
    let stage3 = name.starts_with("zero3");
    if stage3 {
        // Each unit's flat vector is padded to a multiple of the world: a few elements per unit more at most.
        let padded = held.iter().sum::<i64>() - whole;
        assert!((0..=3 * 2 * 8).contains(&padded), "{name}: the shards hold {padded} elements beyond the whole");
    } else {
        assert_eq!(held.iter().sum::<i64>(), whole, "{name}: the shards do not add up to the whole state");
    }
    for (h, m) in held.iter().zip(&ranks) {
        assert!((*h as f64) <= 0.5 * whole as f64 * 1.01, "{name}: a rank holds {h} of {whole} state elements");
        assert_eq!(m["state_elements_before_group"], 0, "{name}: the state was allocated before it was sharded");
        // The trainer's expected figures (what it sizes micro-batches by and logs) are what the rank holds, up to
        // the padding of each bucket's chunks.
        let expected = m["expected_state_bytes"].as_i64().unwrap() as f64;
        assert!((expected - 4.0 * *h as f64).abs() <= 0.01 * expected, "{name}: expected {expected} state bytes");
        if stage3 {
            // The expected figure adds the whole units a pass holds to the shards.
            let (expected, held) =
                (m["expected_parameter_bytes"].as_i64().unwrap(), m["parameter_bytes"].as_i64().unwrap());
            let whole_bytes = whole / if bf16 { 3 } else { 2 } * if bf16 { 2 } else { 4 };
            println!("{name}: parameter bytes held {held} of {whole_bytes}, expected with a pass's units {expected}");
            assert!(held as f64 <= 0.5 * whole_bytes as f64 * 1.01, "{name}: a rank holds {held} parameter bytes");
            // The tiny model's three largest units are all of it (two layers and the outer unit).
            assert!(expected > held && expected <= held + whole_bytes, "{name}: expected {expected} parameter bytes");
            // GRPO's KL reference (a copy of the policy in its dtype) is sharded the same way, and no rank keeps
            // it whole between passes; SFT has none.
            match name.contains("grpo") {
                true => {
                    let reference = m["reference_shard_bytes"].as_i64().unwrap();
                    println!("{name}: reference bytes held {reference} of {whole_bytes}");
                    let half = 0.5 * whole_bytes as f64;
                    assert!((reference as f64 - half).abs() <= 0.01 * half, "{name}: reference {reference} bytes");
                    assert_eq!(m["reference_whole"], false, "{name}: a rank keeps the whole reference");
                }
                false => assert!(m["reference_shard_bytes"].is_null(), "{name}: {m}"),
            }
        } else {
            assert_eq!(m["expected_parameter_bytes"], m["parameter_bytes"], "{name}");
        }
    }
    if name.starts_with("zero2") || stage3 {
        for m in &ranks {
            let (grads, params) = (m["gradient_bytes"].as_i64().unwrap(), m["parameter_bytes"].as_i64().unwrap());
            // Stage 3's parameter bytes are a shard already.
            let elements = params / if bf16 { 2 } else { 4 } * if stage3 { 2 } else { 1 };
            println!("{name}: gradient bytes held {grads} for {elements} parameters (fp32 shards)");
            assert!(grads as f64 <= 0.5 * 4.0 * elements as f64 * 1.01, "{name}: {grads} gradient bytes");
            let expected = m["expected_gradient_shard_bytes"].as_i64().unwrap() as f64;
            assert!((expected - grads as f64).abs() <= 0.01 * expected, "{name}: expected {expected} shard bytes");
        }
    }

    // The ranks' checkpoint is the one process's: same entries and shapes, values as close as the runs are.
    let (ranks_state, single_state) =
        (load(&dir.join("rank_state"), "optimizer"), load(&dir.join("single_state"), "optimizer"));
    let keys = |m: &BTreeMap<String, Tensor>| m.iter().map(|(k, t)| (k.clone(), t.size())).collect::<Vec<_>>();
    assert_eq!(keys(&ranks_state), keys(&single_state), "{name}: the sharded checkpoint's entries");
    assert_eq!(ranks_state.keys().any(|k| k.starts_with("master/")), bf16);

    // Resumed the other way round: one process from the ranks' checkpoint, two sharded ranks from one process's.
    let resumed = run_resuming(name, 2, Some(dir));
    let resumed = resumed.path();
    for (tag, state, uninterrupted) in
        [("resumed_single", "resumed_single", &end), ("resumed_rank0", "resumed_rank", &single)]
    {
        let got = final_weights(resumed, tag, state, bf16);
        let apart = gap(&got, uninterrupted);
        println!(
            "{name}: {tag} ends {apart:.2e} from the uninterrupted run, {:.3}% of the move",
            100.0 * apart / moved
        );
        assert!(apart <= 0.02 * moved, "{name}: {tag} ends {apart} from the uninterrupted run (moved {moved})");
    }
    let (a, b) =
        (load(resumed, &format!("resumed_rank0_step{last}")), load(resumed, &format!("resumed_rank1_step{last}")));
    assert_eq!(max_diff(&a, &b), 0.0, "{name}: resumed ranks differ");
}

#[test]
fn zero_stage_1_matches_one_process_for_sft_on_rows_of_unequal_length() {
    check_sharded("zero1_sft_f32");
    check_sharded("zero1_sft_bf16");
}

#[test]
fn zero_stage_1_matches_one_process_for_grpo_on_rows_of_unequal_length() {
    check_sharded("zero1_grpo_f32");
    check_sharded("zero1_grpo_bf16");
}

#[test]
fn zero_stage_2_matches_one_process_for_sft_on_rows_of_unequal_length() {
    check_sharded("zero2_sft_f32");
    check_sharded("zero2_sft_bf16");
}

#[test]
fn zero_stage_2_matches_one_process_for_grpo_on_rows_of_unequal_length() {
    check_sharded("zero2_grpo_f32");
    check_sharded("zero2_grpo_bf16");
}

/// Stage 3 in the trainer: parameters sharded per layer, ranks with fewer micro-batches (and forward-only passes)
/// running idle passes, weights gathered for the comparison, checkpoints across world sizes.
#[test]
fn zero_stage_3_matches_one_process_for_sft_on_rows_of_unequal_length() {
    check_sharded("zero3_sft_f32");
    check_sharded("zero3_sft_bf16");
}

#[test]
fn zero_stage_3_matches_one_process_for_grpo_on_rows_of_unequal_length() {
    check_sharded("zero3_grpo_f32");
    check_sharded("zero3_grpo_bf16");
}

/// `optimizer_offload` on two ZeRO-2 ranks: the state's shards are in host memory (on this CPU, the parameters' own,
/// so only the path differs from resident state) and the run is bit for bit the resident run, checkpoints and
/// resumption across world sizes included.
#[test]
fn zero_stage_2_with_optimizer_offload_trains_as_resident_state() {
    check_sharded("zero2off_sft_bf16");
    let (off, on) = (run("zero2off_grpo_f32", 2), run("zero2_grpo_f32", 2));
    for step in 0..ZERO_STEPS {
        for rank in 0..2 {
            let tag = format!("rank{rank}_step{step}");
            assert_eq!(max_diff(&load(off.path(), &tag), &load(on.path(), &tag)), 0.0, "{tag}: offload changed it");
        }
    }
    for rank in 0..2 {
        let text = std::fs::read_to_string(off.path().join(format!("rank{rank}_memory.json"))).unwrap();
        let memory: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!((&memory["offloaded"], &memory["state_on_host"]), (&true.into(), &true.into()), "{memory}");
    }
}
