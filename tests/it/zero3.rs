//! ZeRO stage 3 through `trinity launch` (`trainer_strategy: fsdp2`, the default, over two Gloo ranks): bf16
//! training against one process, a one-process checkpoint resumed on two fully sharded ranks, and
//! `fsdp_config.reshard_after_forward: false`, which asks for stage 2. The fp32 runs of mode `train` and mode `both`,
//! and two sharded ranks' checkpoint resumed in one process, are `data_parallel.rs`'s tests, which run stage 3 too.

use std::collections::BTreeMap;
use std::path::Path;

use tch::{Kind, Tensor};

use crate::data_parallel::{
    STEPS, assert_same_training, base_weights, launch_two, one_and_two, run_one, sft_config, trainer_log, weights,
};

/// The L2 norm over every tensor of `a - b`, in fp32.
fn l2(a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>) -> f64 {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let square = |x: &Tensor, y: &Tensor| {
        (x.to_kind(Kind::Float) - y.to_kind(Kind::Float)).square().sum(Kind::Double).double_value(&[])
    };
    a.iter().map(|(name, x)| square(x, &b[name])).sum::<f64>().sqrt()
}

/// bf16 on two stage-3 ranks: the final weights are within 2% (L2 over all weights) of what one process moved
/// them, as the trainer's own stage-3 tests measure bf16 (a bf16 weight's last place is a sizeable part of a few
/// steps' move, so single elements are not compared).
#[test]
fn two_fully_sharded_ranks_train_bf16_as_one_process_does_within_two_percent() {
    let bf16 = |dir: &Path| {
        sft_config(dir, STEPS, "").replace("  dtype: float32\n", "  dtype: bfloat16\n").replace("2e-3", "1e-2")
    };
    let (one, two) = one_and_two(bf16);
    assert!(trainer_log(two.path()).contains("sharded data parallel: ZeRO stage 3 over 2 ranks"));
    let (a, b, base) = (weights(one.path(), STEPS), weights(two.path(), STEPS), base_weights());
    let base: BTreeMap<String, Tensor> = base.into_iter().filter(|(name, _)| a.contains_key(name)).collect();
    let (moved, apart) = (l2(&a, &base), l2(&a, &b));
    println!(
        "bf16: two stage-3 ranks end {apart:.3e} from one process, {:.3}% of the {moved:.3e} move",
        100.0 * apart / moved
    );
    assert!(moved > 1e-2, "the weights moved only {moved}");
    assert!(apart <= 0.02 * moved, "two ranks end {apart} from one process, more than 2% of {moved}");
}

/// A one-process checkpoint resumed on two stage-3 ranks: rank 0 reads the optimizer state and sends each
/// layer's to the other rank, which never reads the run directory; the run ends as the uninterrupted one process.
#[test]
fn two_fully_sharded_ranks_resume_from_one_process_checkpoint_as_if_it_had_run_all_along() {
    let whole = tempfile::tempdir().unwrap();
    std::fs::write(whole.path().join("c.yaml"), sft_config(whole.path(), STEPS, "")).unwrap();
    run_one(whole.path(), "one process, uninterrupted");

    let split = tempfile::tempdir().unwrap();
    std::fs::write(split.path().join("c.yaml"), sft_config(split.path(), STEPS - 1, "")).unwrap();
    run_one(split.path(), "one process");
    std::fs::write(split.path().join("c.yaml"), sft_config(split.path(), STEPS, "")).unwrap();
    launch_two(split.path(), "two stage-3 ranks resuming");
    let log = trainer_log(split.path());
    assert!(log.contains("resuming from") && log.contains("ZeRO stage 3 over 2 ranks"), "{log}");
    assert_same_training(whole.path(), split.path(), "monitor/trainer/metrics.jsonl");
}

/// `fsdp_config.reshard_after_forward: false` is FSDP's SHARD_GRAD_OP: the parameters stay gathered after the
/// forward, the gradients and optimizer state are sharded, which is ZeRO stage 2; the log says so and the run
/// trains as one process.
#[test]
fn reshard_after_forward_false_trains_with_zero_stage_2() {
    let stage2 = |dir: &Path| {
        sft_config(dir, STEPS, "").replace(
            "  use_dynamic_bsz: false\n",
            "  use_dynamic_bsz: false\n  trainer_config:\n    actor_rollout_ref:\n      actor:\n        fsdp_config:\n          \
             reshard_after_forward: false\n",
        )
    };
    let (one, two) = one_and_two(stage2);
    let log = trainer_log(two.path());
    assert!(log.contains("sharded data parallel: ZeRO stage 2 over 2 ranks"), "{log}");
    assert_same_training(one.path(), two.path(), "monitor/trainer/metrics.jsonl");
}
