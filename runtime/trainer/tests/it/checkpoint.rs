use tch::Kind;
use trinity_trainer::{TrainRow, TrainerOptions};

use crate::{algorithm, max_param_diff, tiny_model, trainer};

/// A trainer restored from `save_state` (bf16 parameters, so the fp32 masters matter) continues exactly like
/// the one that saved it.
#[test]
fn resumed_trainer_continues_identically() {
    let alg = algorithm("sft", |_| {});
    let rows = vec![TrainRow::sft(&[1, 2], &[3, 4, 5]), TrainRow::sft(&[6], &[7, 8])];
    let mut a = trainer(tiny_model(6, Kind::BFloat16), &alg, 1e-2, TrainerOptions::default());
    a.train_step(&rows).unwrap();
    let dir = tempfile::tempdir().unwrap();
    a.save_state(dir.path()).unwrap();

    // The caller restores the weights (HF checkpoint) and then the trainer state.
    let mut policy = tiny_model(7, Kind::BFloat16);
    policy.copy_weights_from(a.policy()).unwrap();
    let mut b = trainer(policy, &alg, 1e-2, TrainerOptions::default());
    b.load_state(dir.path(), a.global_step()).unwrap();
    assert_eq!(b.current_lr(), a.current_lr());

    a.train_step(&rows).unwrap();
    b.train_step(&rows).unwrap();
    assert_eq!(max_param_diff(a.policy(), b.policy()), 0.0);
    let (ma, mb) = (a.optimizer().master_weights(), b.optimizer().master_weights());
    assert!(ma.iter().zip(&mb).all(|((_, x), (_, y))| x.equal(y)));
}
