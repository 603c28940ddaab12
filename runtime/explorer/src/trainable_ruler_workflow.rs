//! `math_trainable_ruler_workflow`: Trinity-RFT 0.6.0's `MathTrainableRULERWorkflow`, where the policy itself is
//! the RULER judge and learns to judge.
//!
//! The group is sampled and scored as in `math_ruler_workflow` (the task's reward, `math_reward` by default, is the
//! gold reward, kept as metrics). Then the policy is shown the question and every candidate (the RULER prompt in
//! its compact spelling) and asked for a list of scores. Each task draws whether its ground truth counts as
//! available, with probability [`TRUTH_AVAILABLE`] (0.2, as in 0.6.0; 0.6.0 draws from NumPy's global generator,
//! trinity from the task's seed, so a run repeats):
//!
//! - available: the answers keep their gold rewards, and the policy judges `repeat_times` times with the task's
//!   rollout arguments. Each judgement is an experience of its own, rewarded `1 − mean |score − scaled gold|`
//!   (gold scaled from [−0.1, 1.1] to [0, 1] by `(g + 0.1) / 1.2`), 0 when its list does not parse; they form a
//!   group of their own (Trinity-RFT's `<task>-ruler` id: here task index + [`JUDGE_GROUP`]) and are trained
//!   with the answers. `reward_for_judge` and `judge_success` are their metrics.
//! - not available: the policy judges once; the answers' rewards are its scores (0 when the list does not parse)
//!   and the judgement is not trained.
//!
//! `judge_success` is the share of judgements whose list parsed with one score per answer; with several, the
//! answers' scores are the mean over those.

use trinity_buffer::{Experience, Task};

use crate::judge_workflow::{RulerLayout, answered, gold_rewards, ruler_judge_messages, ruler_messages, ruler_scores};
use crate::math_workflow::{describe, mix, sample_group, sampling_params};
use crate::workflow::{Workflow, WorkflowContext, WorkflowEntry, WorkflowFuture};

/// The probability that a task's ground truth is taken as available for training the judge.
pub(crate) const TRUTH_AVAILABLE: f64 = 0.2;

/// Added to the task index to make the judgements' group id (Trinity-RFT names it `<task_id>-ruler`; trinity's ids
/// are numbers): above any task index of a batch, below 2^53 so that it stays exact in JSON readers.
pub(crate) const JUDGE_GROUP: u64 = 1 << 32;

/// Salts of the draws derived from the task's seed, so that they differ from the group's sampling seed.
const TRUTH_SALT: u64 = 0x7275_6c65_7274_7275;
const JUDGE_SALT: u64 = 0x7275_6c65_726a_6467;

/// What the judgements of one group say.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Verdicts {
    /// Each answer's mean score over the judgements that parsed (0 when none did).
    pub(crate) scores: Vec<f64>,
    /// The share of judgements that parsed.
    pub(crate) success_rate: f64,
    /// Each judgement's reward: `1 − MAE` against `gold` when given and the judgement parsed, else 0.
    pub(crate) judge_rewards: Vec<f64>,
}

/// Reads `replies` (one per judgement) for `n` scores each, as Trinity-RFT 0.6.0's `get_ruler_responses` does.
pub(crate) fn verdicts(replies: &[&str], n: usize, gold: Option<&[f64]>) -> Verdicts {
    let mut sums = vec![0.0; n];
    let mut parsed = 0usize;
    let mut judge_rewards = Vec::with_capacity(replies.len());
    for reply in replies {
        let Some(scores) = ruler_scores(reply, n) else {
            judge_rewards.push(0.0);
            continue;
        };
        parsed += 1;
        for (sum, score) in sums.iter_mut().zip(&scores) {
            *sum += score;
        }
        let reward = gold.filter(|g| !g.is_empty()).map_or(0.0, |gold| {
            let error: f64 = scores.iter().zip(gold).map(|(s, g)| (s - g).abs()).sum::<f64>() / n as f64;
            1.0 - error
        });
        judge_rewards.push(reward);
    }
    if parsed > 0 {
        sums.iter_mut().for_each(|s| *s /= parsed as f64);
    }
    let success_rate = if replies.is_empty() { 0.0 } else { parsed as f64 / replies.len() as f64 };
    Verdicts { scores: sums, success_rate, judge_rewards }
}

/// The task's seed mixed with `salt`.
fn task_seed(task: &Task, ctx: &WorkflowContext, salt: u64) -> u64 {
    let base = task.rollout_args.seed.unwrap_or(42);
    mix(&[base, task.batch_id, task.taskset_id as u64, task.index as u64, u64::from(ctx.attempt), salt])
}

/// Whether this task trains the judge: a uniform draw in [0, 1) from the task's seed below [`TRUTH_AVAILABLE`].
fn truth_available(task: &Task, ctx: &WorkflowContext) -> bool {
    let uniform = (task_seed(task, ctx, TRUTH_SALT) >> 11) as f64 / (1u64 << 53) as f64;
    uniform < TRUTH_AVAILABLE
}

#[derive(Debug, Clone, Copy)]
struct TrainableRuler;

impl Workflow for TrainableRuler {
    fn run<'a>(&'a self, task: &'a Task, ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async move {
            let (messages, prompt, reward) = ruler_messages(task)?;
            let mut answers = sample_group(task, ctx, &messages, sampling_params(task, ctx)).await?;
            if !answered(&answers) {
                return Ok(answers);
            }
            gold_rewards(task, &mut answers, &reward, &prompt).await?;
            let scaled: Vec<f64> = answers.iter().map(|e| (e.reward + 0.1) / 1.2).collect();
            let trains_judge = truth_available(task, ctx);
            let texts: Vec<&str> = answers.iter().map(|e| e.response_text.as_deref().unwrap_or("")).collect();
            let judge_messages = ruler_judge_messages(&prompt, &texts, RulerLayout::Compact);
            let mut params = sampling_params(task, ctx);
            params.n = if trains_judge { ctx.repeat_times as usize } else { 1 };
            params.seed = Some(task_seed(task, ctx, JUDGE_SALT));
            let mut judgements = sample_group(task, ctx, &judge_messages, params).await?;
            let replies: Vec<&str> = judgements.iter().map(|e| e.response_text.as_deref().unwrap_or("")).collect();
            let verdicts = verdicts(&replies, answers.len(), trains_judge.then_some(scaled.as_slice()));
            if verdicts.success_rate == 0.0 {
                tracing::warn!("task {}: no judgement held a list of {} scores", describe(task), answers.len());
            }
            for (i, answer) in answers.iter_mut().enumerate() {
                if !trains_judge {
                    answer.reward = verdicts.scores[i];
                }
                answer.metrics.insert("judge_success".to_owned(), verdicts.success_rate);
            }
            if !trains_judge {
                return Ok(answers);
            }
            for (judgement, reward) in judgements.iter_mut().zip(&verdicts.judge_rewards) {
                mark_judgement(judgement, task, *reward, verdicts.success_rate);
            }
            answers.append(&mut judgements);
            Ok(answers)
        })
    }
}

/// A judgement as the experience the judge is trained on: its reward, metrics and group.
fn mark_judgement(judgement: &mut Experience, task: &Task, reward: f64, success_rate: f64) {
    judgement.reward = reward;
    judgement.eid.task = task.index as u64 + JUDGE_GROUP;
    judgement.metrics.insert("judge_success".to_owned(), success_rate);
    judgement.metrics.insert("reward_for_judge".to_owned(), reward);
    judgement.info.insert("ruler_judge".to_owned(), true.into());
}

inventory::submit! {
    WorkflowEntry {
        name: "math_trainable_ruler_workflow",
        description: "RULER with the policy as its own judge; with the truth (p = 0.2) the judgements are trained, rewarded 1 - MAE to the gold scores",
        build: || Box::new(TrainableRuler),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judgements_are_rewarded_by_their_distance_to_the_scaled_gold_scores() {
        // Gold rewards 1.1 and -0.1 scale to 1 and 0.
        let gold = [1.0, 0.0];
        let replies = ["[1, 0.5]", "no list", "[0.5, 0.5, 0.5]", "think... [0.0, 0.0]"];
        let v = verdicts(&replies, 2, Some(&gold));
        assert_eq!(v.judge_rewards, vec![0.75, 0.0, 0.0, 0.5]);
        assert_eq!(v.success_rate, 0.5);
        assert_eq!(v.scores, vec![0.5, 0.25], "the mean over the two judgements that parsed");
    }

    #[test]
    fn without_the_truth_judgements_earn_nothing_and_a_failed_one_scores_zero() {
        let v = verdicts(&["[0.3, 2]"], 2, None);
        assert_eq!((v.scores, v.judge_rewards, v.success_rate), (vec![0.3, 1.0], vec![0.0], 1.0));
        let failed = verdicts(&["[0.3]"], 2, None);
        assert_eq!((failed.scores, failed.success_rate), (vec![0.0, 0.0], 0.0));
        assert_eq!(verdicts(&[], 2, None).success_rate, 0.0);
    }
}
