//! Offline evaluation of algorithm components on a recorded batch (`trinity algorithm eval --input FILE.json`).
//!
//! The input names components (optionally through an `algorithm_type` preset, explicit names and args win) and
//! a padded batch; the output holds what one trainer micro-batch would compute: advantages and returns,
//! `pg_loss`, `kl` (unscaled aggregate) and `kl_loss` (scaled), `entropy` and `entropy_loss`,
//! `loss = pg_loss − entropy_loss + kl_loss`, the metrics and `grad_logprob` = ∂loss/∂logprob by autograd.
//!
//! How it follows Trinity-RFT's trainer step:
//! 1. Advantages: skipped when the batch carries `advantages`. A trainer-side advantage first gets the KL
//!    reward penalty (`kl_penalty_fn`, on `old_logprob` vs `ref_logprob`) applied to the token-level scores
//!    (`token_level_rewards`, or each `reward` on the row's last action token); the penalty has no effect on
//!    explorer-side (group) advantages, as in Trinity-RFT. Rows a group advantage drops (std_threshold) get
//!    zero advantages and leave the loss; duplicated groups enter it twice (draws use `seed` when given).
//!    A function that filters tokens (clipb, clipv) narrows the mask every loss term then trains on; the output
//!    shows that mask as `action_mask`.
//! 2. Losses on the resulting rows, all with the same `loss_agg_mode`. Without `algorithm_type`, the policy
//!    loss keeps its own `loss_agg_mode` argument unless the top-level `loss_agg_mode` is given; with
//!    `algorithm_type` the top-level one (default `token-mean`) overrides it, as Trinity-RFT's config
//!    validator does. A KL loss or entropy term whose coefficient is 0 is skipped when its input
//!    (`ref_logprob`, `entropy`) is absent; otherwise the input is required. The terms and their sum come from
//!    [`crate::loss`], the trainer's own composition, with every micro-batch weight 1.
//! 3. Metric names are the components' own (`pg_clipfrac`, `kl_loss`, `entropy_loss`,
//!    `group_advantages/…`); the trainer-side advantage stage is prefixed `advantage/` as Trinity-RFT's trainer
//!    logs it (`advantage/kl`, `advantage/kl_coef`, `advantage/kl/mean`, …).
//!
//! A preset fills components it names; for the policy loss, KL loss and entropy term it also applies
//! Trinity-RFT's global fallback (ppo, k2, default). Components neither given nor implied contribute 0.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tch::{Kind as TKind, Tensor};

use crate::aggregation::LossAggMode;
use crate::batch::{Batch, BatchJson, tensor_to_rows};
use crate::error::AlgorithmError;
use crate::loss;
use crate::masked::scalar;
use crate::metrics::Metrics;
use crate::registry::{self, Kind};

/// The input document of `trinity algorithm eval`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalInput {
    pub algorithm_type: Option<String>,
    pub advantage_fn: Option<String>,
    pub advantage_fn_args: Option<Map<String, Value>>,
    pub policy_loss_fn: Option<String>,
    pub policy_loss_fn_args: Option<Map<String, Value>>,
    pub kl_loss_fn: Option<String>,
    pub kl_loss_fn_args: Option<Map<String, Value>>,
    pub kl_penalty_fn: Option<String>,
    pub kl_penalty_fn_args: Option<Map<String, Value>>,
    pub entropy_loss_fn: Option<String>,
    pub entropy_loss_fn_args: Option<Map<String, Value>>,
    pub loss_agg_mode: Option<String>,
    /// Seeds libtorch's generator for the random choices of `grpo` (duplicate_experiences) and `rec` (drop).
    pub seed: Option<i64>,
    pub batch: BatchJson,
}

/// The output document of `trinity algorithm eval`.
#[derive(Debug, Serialize)]
pub struct EvalOutput {
    /// Per-token advantages in input row order (given or computed); `null` when neither.
    pub advantages: Option<Vec<Vec<f64>>>,
    /// Per-token returns from the advantage function; `null` when none ran.
    pub returns: Option<Vec<Vec<f64>>>,
    /// The training mask the losses used when the advantage function narrowed it (clipb, clipv), input row
    /// order; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action_mask: Option<Vec<Vec<f64>>>,
    pub pg_loss: f64,
    /// The KL loss's unscaled aggregate.
    pub kl: f64,
    /// kl_coef · kl.
    pub kl_loss: f64,
    /// The entropy's unscaled aggregate.
    pub entropy: f64,
    /// entropy_coef · entropy.
    pub entropy_loss: f64,
    /// pg_loss − entropy_loss + kl_loss.
    pub loss: f64,
    pub metrics: Metrics,
    /// ∂loss/∂logprob, input row order; `null` without `logprob`.
    pub grad_logprob: Option<Vec<Vec<f64>>>,
}

/// A component slot resolved to a name and arguments.
struct Slot {
    name: String,
    args: Option<Map<String, Value>>,
}

/// Explicit name > preset > (optionally) the global fallback; preset args apply only to the preset's own
/// choice, and explicit args are merged over them.
fn slot(
    explicit: &Option<String>,
    explicit_args: &Option<Map<String, Value>>,
    preset_name: Option<String>,
    preset_args: Option<Map<String, Value>>,
    fallback: Option<&str>,
) -> Option<Slot> {
    let from_preset = explicit.is_none() || explicit == &preset_name;
    let name = explicit.clone().or(preset_name).or(fallback.map(str::to_owned))?;
    let mut args = if from_preset { preset_args } else { None };
    if let Some(user) = explicit_args {
        args.get_or_insert_with(Map::new).extend(user.clone());
    }
    Some(Slot { name, args })
}

fn fallback(key: &str) -> Option<&'static str> {
    trinity_config::algorithm::fallback_component(key)
}

/// Parses and evaluates an input document.
pub fn eval_str(input: &str) -> Result<EvalOutput, AlgorithmError> {
    let parsed: EvalInput = serde_json::from_str(input).map_err(|e| AlgorithmError::InvalidInput(e.to_string()))?;
    eval(&parsed)
}

/// Evaluates the components of `input` on its batch.
pub fn eval(input: &EvalInput) -> Result<EvalOutput, AlgorithmError> {
    let preset = match &input.algorithm_type {
        Some(name) => Some(registry::preset(name).ok_or_else(|| AlgorithmError::UnknownComponent {
            kind: Kind::AlgorithmType,
            name: name.clone(),
            known: registry::names(Kind::AlgorithmType),
        })?),
        None => None,
    };
    let with_preset = preset.is_some();
    let p = preset.unwrap_or_default();
    let fb = |key: &str| if with_preset { fallback(key) } else { None };
    let advantage = slot(&input.advantage_fn, &input.advantage_fn_args, p.advantage_fn, p.advantage_fn_args, None);
    let policy = slot(
        &input.policy_loss_fn,
        &input.policy_loss_fn_args,
        p.policy_loss_fn,
        p.policy_loss_fn_args,
        fb("policy_loss_fn"),
    );
    let kl_loss = slot(&input.kl_loss_fn, &input.kl_loss_fn_args, p.kl_loss_fn, None, fb("kl_loss_fn"));
    let kl_penalty = slot(&input.kl_penalty_fn, &input.kl_penalty_fn_args, p.kl_penalty_fn, None, None);
    let entropy =
        slot(&input.entropy_loss_fn, &input.entropy_loss_fn_args, p.entropy_loss_fn, None, fb("entropy_loss_fn"));
    let explicit_agg = input.loss_agg_mode.clone().or(p.loss_agg_mode).or(fb("loss_agg_mode").map(str::to_owned));
    let agg_name = explicit_agg.clone().unwrap_or_else(|| "token-mean".to_owned());
    let agg: LossAggMode = agg_name.parse().map_err(AlgorithmError::InvalidInput)?;

    // Build every component before touching the batch, so argument errors come first.
    let advantage = advantage
        .map(|s| -> Result<_, AlgorithmError> {
            let args = registry::resolve_args(Kind::AdvantageFn, &s.name, s.args.as_ref())?;
            let (f, in_trainer) = registry::advantage_fn(&s.name, &args)?;
            Ok((s.name, f, in_trainer))
        })
        .transpose()?;
    let policy = policy
        .map(|s| -> Result<_, AlgorithmError> {
            let mut args = registry::resolve_args(Kind::PolicyLoss, &s.name, s.args.as_ref())?;
            if let Some(mode) = &explicit_agg
                && args.accepts("loss_agg_mode")
            {
                args.set("loss_agg_mode", Value::from(mode.clone()));
            }
            Ok((s.name.clone(), registry::policy_loss_fn(&s.name, &args)?))
        })
        .transpose()?;
    let kl_loss = kl_loss
        .map(|s| -> Result<_, AlgorithmError> {
            let args = registry::resolve_args(Kind::KlFn, &s.name, s.args.as_ref())?;
            Ok((s.name.clone(), registry::kl_fn(&s.name, &args)?))
        })
        .transpose()?;
    let mut kl_penalty = kl_penalty
        .map(|s| -> Result<_, AlgorithmError> {
            let args = registry::resolve_args(Kind::KlFn, &s.name, s.args.as_ref())?;
            Ok((s.name.clone(), registry::kl_fn(&s.name, &args)?))
        })
        .transpose()?;
    let entropy = entropy
        .map(|s| -> Result<_, AlgorithmError> {
            let args = registry::resolve_args(Kind::EntropyLoss, &s.name, s.args.as_ref())?;
            Ok((s.name.clone(), registry::entropy_loss_fn(&s.name, &args)?))
        })
        .transpose()?;

    if let Some(seed) = input.seed {
        tch::manual_seed(seed);
    }
    let mut batch = Batch::from_json(&input.batch)?;
    let logprob_leaf = batch.logprob.take().map(|t| t.set_requires_grad(true));
    batch.logprob = logprob_leaf.as_ref().map(Tensor::shallow_clone);

    let mut metrics = Metrics::new();
    let mut returns = None;
    let mut rows: Option<Vec<i64>> = None;
    let mut narrowed_mask = None;
    if batch.advantages.is_none()
        && let Some((name, f, in_trainer)) = &advantage
    {
        if *in_trainer
            && let Some((pname, penalty)) = kl_penalty.as_mut()
            && !penalty.is_none()
        {
            let scores = batch.token_level_scores(name)?;
            let (penalized, m) = penalty.apply_penalty(&batch, &scores, pname)?;
            batch.token_level_rewards = Some(penalized);
            metrics.extend(m.into_iter().map(|(k, v)| (format!("advantage/{k}"), v)));
        }
        let out = tch::no_grad(|| f.compute(&batch))?;
        let prefix = if *in_trainer { "advantage/" } else { "" };
        metrics.extend(out.metrics.into_iter().map(|(k, v)| (format!("{prefix}{k}"), v)));
        returns = Some(tensor_to_rows(&out.returns));
        batch.advantages = Some(out.advantages);
        if let Some(mask) = out.action_mask {
            narrowed_mask = Some(tensor_to_rows(&mask));
            batch.action_mask = mask;
        }
        rows = out.rows;
    }
    let advantages = batch.advantages.as_ref().map(tensor_to_rows);

    // The rows that go on to the losses, in Trinity-RFT's order.
    let identity: Vec<i64> = (0..batch.rows() as i64).collect();
    let loss_batch = match &rows {
        Some(r) if r != &identity => batch.select_rows(r),
        _ => batch,
    };
    let zero = || Tensor::from(0f32);
    let (mut pg_loss, mut kl_scaled, mut kl_raw, mut ent_scaled, mut ent_raw) =
        (zero(), zero(), zero(), zero(), zero());
    // The trainer's composition (crate::loss), every weight 1.
    if !loss_batch.is_empty() {
        if let Some((_, f)) = &policy {
            let (loss, m) = f.loss(&loss_batch)?;
            pg_loss = loss;
            metrics.extend(m);
        }
        let entropy = entropy.as_ref().map(|(name, f)| (name.as_str(), f));
        let kl_loss = kl_loss.as_ref().map(|(name, f)| (name.as_str(), f));
        let terms = loss::loss_terms(entropy, kl_loss, &loss_batch, agg)?;
        if let Some(t) = terms.entropy {
            (ent_scaled, ent_raw) = (t.scaled, t.raw);
            metrics.extend(t.metrics);
        }
        if let Some(t) = terms.kl {
            (kl_scaled, kl_raw) = (t.scaled, t.raw);
            metrics.extend(t.metrics);
        }
    }
    let loss =
        loss::combine(pg_loss.shallow_clone(), Some(ent_scaled.shallow_clone()), Some(kl_scaled.shallow_clone()));

    let grad_logprob = match &logprob_leaf {
        Some(leaf) if loss.requires_grad() => {
            let grads = Tensor::f_run_backward(&[&loss], &[leaf], false, false)
                .map_err(|e| AlgorithmError::InvalidInput(format!("backward pass failed: {e}")))?;
            grads.first().map(tensor_to_rows)
        }
        Some(leaf) => Some(tensor_to_rows(&leaf.zeros_like().to_kind(TKind::Float))),
        None => None,
    };

    Ok(EvalOutput {
        advantages,
        returns,
        action_mask: narrowed_mask,
        pg_loss: scalar(&pg_loss),
        kl: scalar(&kl_raw),
        kl_loss: scalar(&kl_scaled),
        entropy: scalar(&ent_raw),
        entropy_loss: scalar(&ent_scaled),
        loss: scalar(&loss),
        metrics,
        grad_logprob,
    })
}

#[cfg(test)]
mod tests {
    use crate::testing::{eval_err, eval_json, json};

    #[test]
    fn matches_trinity_end_to_end() {
        crate::testing::check_fixtures("eval");
    }

    #[test]
    fn loss_combines_terms_and_gradient_flows() {
        let out = eval_json(json!({
            "policy_loss_fn": "sft",
            "kl_loss_fn": "k1", "kl_loss_fn_args": {"kl_coef": 0.5},
            "entropy_loss_fn": "default", "entropy_loss_fn_args": {"entropy_coef": 0.1},
            "batch": {"logprob": [[-1.0, -2.0]], "ref_logprob": [[-1.5, -1.5]], "entropy": [[1.0, 3.0]],
                      "action_mask": [[1, 1]]}
        }));
        let f = |k: &str| out[k].as_f64().unwrap();
        assert!((f("pg_loss") - 1.5).abs() < 1e-6);
        assert!((f("kl") - 0.0).abs() < 1e-6 && (f("entropy") - 2.0).abs() < 1e-6);
        assert!((f("loss") - (1.5 - 0.2 + 0.0)).abs() < 1e-6);
        // d/dℓ of mean(−ℓ) + 0.5·mean(ℓ − ℓ_ref) = (−1 + 0.5)/2 per token.
        assert!((out["grad_logprob"][0][0].as_f64().unwrap() + 0.25).abs() < 1e-6);
    }

    #[test]
    fn unknown_arg_and_component_are_errors() {
        let err = eval_err(json!({"policy_loss_fn": "ppo", "policy_loss_fn_args": {"clip": 1},
                                  "batch": {"action_mask": [[1]]}}));
        assert!(err.contains("`clip`") && err.contains("clip_range"), "{err}");
        let err = eval_err(json!({"advantage_fn": "grpoo", "batch": {"action_mask": [[1]]}}));
        assert!(err.contains("grpoo"), "{err}");
        let err = eval_err(json!({"policy_loss_fn": "ppo", "batch": {"action_mask": [[1]], "logprob": [[0.0]],
                                  "old_logprob": [[0.0]]}}));
        assert!(err.contains("advantages"), "{err}");
    }

    #[test]
    fn preset_fills_components_and_needs_reference() {
        let err = eval_err(json!({"algorithm_type": "grpo", "batch": {
            "group_id": ["a", "a"], "reward": [1.0, 0.0], "logprob": [[-1.0], [-1.0]], "old_logprob": [[-1.0], [-1.0]],
            "action_mask": [[1], [1]]}}));
        assert!(err.contains("ref_logprob"), "{err}");
        let out = eval_json(json!({"algorithm_type": "grpo", "batch": {
            "group_id": ["a", "a"], "reward": [1.0, 0.0], "logprob": [[-1.0], [-1.0]], "old_logprob": [[-1.0], [-1.0]],
            "ref_logprob": [[-1.0], [-1.0]], "action_mask": [[1], [1]]}}));
        assert!(out["metrics"]["pg_clipfrac"].is_number() && out["metrics"]["kl_coef"] == 0.001, "{out}");
    }

    #[test]
    fn cpt_is_the_token_mean_next_token_loss_with_no_reference() {
        // Rows of 3 and 1 trained tokens: token-mean weighs the 4 tokens alike ((1+2+3+4)/4), where a sequence mean
        // would give (2+4)/2. No ref_logprob or entropy is needed: CPT has no KL or entropy term.
        let out = eval_json(json!({"algorithm_type": "cpt", "batch": {
            "logprob": [[-1.0, -2.0, -3.0], [-4.0, -9.0, -9.0]], "action_mask": [[1, 1, 1], [1, 0, 0]]}}));
        let f = |k: &str| out[k].as_f64().unwrap();
        assert!((f("pg_loss") - 2.5).abs() < 1e-6 && (f("loss") - 2.5).abs() < 1e-6, "{out}");
        assert!((out["metrics"]["sft_loss"].as_f64().unwrap() - 2.5).abs() < 1e-6, "{out}");
        assert_eq!((f("kl_loss"), f("entropy_loss")), (0.0, 0.0));
        assert!(out["advantages"].is_null(), "no advantage function: {out}");
        let grad = &out["grad_logprob"];
        assert!((grad[0][0].as_f64().unwrap() + 0.25).abs() < 1e-6 && grad[1][1].as_f64().unwrap() == 0.0, "{out}");
    }

    #[test]
    fn dropped_groups_leave_the_loss() {
        let out = eval_json(json!({
            "advantage_fn": "grpo", "advantage_fn_args": {"std_threshold": 0.0},
            "policy_loss_fn": "sft", "loss_agg_mode": "seq-mean-token-sum",
            "batch": {"group_id": ["a", "a", "b"], "reward": [1.0, 1.0, 2.0],
                      "logprob": [[-1.0], [-2.0], [-4.0]], "action_mask": [[1], [1], [1]]}
        }));
        assert_eq!(out["metrics"]["filtered_count"], 3.0);
        assert_eq!(out["pg_loss"], 0.0);
    }
}
