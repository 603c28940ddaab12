//! Resolution of `trainer.trainer_config` (veRL): values that change the numbers are mapped onto the
//! top-level keys or kept typed for the trainer; every mapping is logged.
//!
//! Precedence follows Trinity-RFT's `synchronize_config` where it lets a veRL value win (`grad_clip`,
//! `use_dynamic_bsz`, `ppo_max_token_len_per_gpu`: the veRL value when set) and otherwise lets the top-level key
//! win: a veRL loss or optimizer value only fills a top-level value the user left unset. (Trinity-RFT itself
//! overwrites those veRL values unconditionally, so in Trinity-RFT they have no effect at all; trinity uses
//! them when nothing else says otherwise and says so in a note.)

use serde_json::{Map, Value};

use crate::algorithm::{LossAggMode, OptimizerConfig};
use crate::catalog::ComponentKind;
use crate::config::Config;
use crate::error::ConfigError;
use crate::resolve::Resolver;

const AT: &str = "trainer.trainer_config";

impl Resolver<'_> {
    /// Maps veRL loss, KL, advantage and optimizer values onto the unresolved `algorithm` section; runs before
    /// the algorithm is resolved so presets and registered defaults still apply underneath.
    pub(crate) fn map_trainer_config(&mut self, config: &mut Config) -> Result<(), ConfigError> {
        let verl = config.trainer.trainer_config.clone();
        let actor = &verl.actor_rollout_ref.actor;
        let algorithm = &mut config.algorithm;
        let preset = self.catalog.preset(&algorithm.algorithm_type).unwrap_or_default();

        if let Some(mode) = &actor.loss_agg_mode {
            let key = format!("{AT}.actor_rollout_ref.actor.loss_agg_mode");
            match serde_json::from_value::<LossAggMode>(Value::from(mode.as_str())) {
                Ok(parsed) => self.fill_option(&mut algorithm.loss_agg_mode, parsed, &key, "algorithm.loss_agg_mode"),
                Err(_) => {
                    let error = self.invalid(&key, format!("`{mode}` is not a loss aggregation mode (token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm)"));
                    self.record(Err(error));
                }
            }
        }

        let policy_loss = algorithm.policy_loss_fn.clone().or(preset.policy_loss_fn.clone()).unwrap_or("ppo".into());
        for (verl_key, value, arg) in [
            ("clip_ratio", actor.clip_ratio, "clip_range"),
            ("clip_ratio_low", actor.clip_ratio_low, "clip_range_low"),
            ("clip_ratio_high", actor.clip_ratio_high, "clip_range_high"),
        ] {
            if let Some(value) = value {
                let key = format!("{AT}.actor_rollout_ref.actor.{verl_key}");
                let args = &mut algorithm.policy_loss_fn_args;
                self.fill_arg(args, ComponentKind::PolicyLossFn, &policy_loss, arg, value, &key, "policy_loss_fn_args");
            }
        }

        if let Some(coef) = actor.entropy_coeff {
            let key = format!("{AT}.actor_rollout_ref.actor.entropy_coeff");
            let entropy =
                algorithm.entropy_loss_fn.clone().or(preset.entropy_loss_fn.clone()).unwrap_or("default".into());
            let args = &mut algorithm.entropy_loss_fn_args;
            self.fill_arg(
                args,
                ComponentKind::EntropyLossFn,
                &entropy,
                "entropy_coef",
                coef,
                &key,
                "entropy_loss_fn_args",
            );
        }

        if let Some(kind) = &actor.kl_loss_type {
            let key = format!("{AT}.actor_rollout_ref.actor.kl_loss_type");
            let name = match kind.as_str() {
                "kl" | "k1" => Some("k1"),
                "abs" => Some("abs"),
                "mse" | "k2" => Some("k2"),
                "low_var_kl" => Some("low_var_kl"),
                "k3" => Some("k3"),
                other => {
                    let error = self.invalid(
                        &key,
                        format!("veRL KL estimator `{other}` has no trinity equivalent; use kl, abs, mse, low_var_kl or set algorithm.kl_loss_fn"),
                    );
                    self.record(Err(error));
                    None
                }
            };
            if let Some(name) = name
                && actor.use_kl_loss != Some(false)
            {
                self.fill_option(&mut algorithm.kl_loss_fn, name.to_owned(), &key, "algorithm.kl_loss_fn");
            }
        }
        if actor.use_kl_loss == Some(false) {
            let key = format!("{AT}.actor_rollout_ref.actor.use_kl_loss");
            self.fill_option(&mut algorithm.kl_loss_fn, "none".to_owned(), &key, "algorithm.kl_loss_fn");
        }
        if let Some(coef) = actor.kl_loss_coef {
            let key = format!("{AT}.actor_rollout_ref.actor.kl_loss_coef");
            let kl = algorithm.kl_loss_fn.clone().or(preset.kl_loss_fn.clone()).unwrap_or("k2".into());
            let args = &mut algorithm.kl_loss_fn_args;
            self.fill_arg(args, ComponentKind::KlFn, &kl, "kl_coef", coef, &key, "kl_loss_fn_args");
        }
        if let Some(coef) = verl.algorithm.kl_ctrl.kl_coef {
            let key = format!("{AT}.algorithm.kl_ctrl.kl_coef");
            let kl = algorithm.kl_penalty_fn.clone().or(preset.kl_penalty_fn.clone()).unwrap_or("none".into());
            let args = &mut algorithm.kl_penalty_fn_args;
            self.fill_arg(args, ComponentKind::KlFn, &kl, "kl_coef", coef, &key, "kl_penalty_fn_args");
        }

        let advantage = algorithm.advantage_fn.clone().or(preset.advantage_fn.clone()).unwrap_or("ppo".into());
        for (verl_key, value) in [("gamma", verl.algorithm.gamma), ("lam", verl.algorithm.lam)] {
            if let Some(value) = value {
                let key = format!("{AT}.algorithm.{verl_key}");
                let args = &mut algorithm.advantage_fn_args;
                self.fill_arg(args, ComponentKind::AdvantageFn, &advantage, verl_key, value, &key, "advantage_fn_args");
            }
        }

        self.map_rollout_correction(config);
        if !config.algorithm.bypass_old_logprobs {
            let top = "algorithm.rollout_correction.bypass_mode";
            if self.user_set(top) && config.trainer.trainer_config.algorithm.rollout_correction.bypass_mode {
                let error = self.invalid(top, "is true but algorithm.bypass_old_logprobs is false: give one of them");
                self.record(Err(error));
            }
            // Newer Trinity-RFT's spelling of the veRL switch; either `false` asks for recomputed old logprobs.
            config.trainer.trainer_config.algorithm.rollout_correction.bypass_mode = false;
            self.notes.push("algorithm.bypass_old_logprobs `false` sets trainer.trainer_config.algorithm.rollout_correction.bypass_mode to false".into());
        }
        self.map_actor_optim(config, &actor.optim)?;
        Ok(())
    }

    /// Trinity-RFT 0.6.0's `algorithm.rollout_correction` sets the veRL section's keys it gives; a key both
    /// spellings give with different values is an error naming both.
    fn map_rollout_correction(&mut self, config: &mut Config) {
        let Some(top) = &config.algorithm.rollout_correction else { return };
        let (Ok(Value::Object(top)), Ok(Value::Object(mut verl))) = (
            serde_json::to_value(top),
            serde_json::to_value(&config.trainer.trainer_config.algorithm.rollout_correction),
        ) else {
            return;
        };
        for (name, value) in top {
            let top_key = format!("algorithm.rollout_correction.{name}");
            let verl_key = format!("{AT}.algorithm.rollout_correction.{name}");
            if !self.user_set(&top_key) {
                continue;
            }
            if self.user_set(&verl_key) && verl.get(&name) != Some(&value) {
                let error =
                    self.invalid(&top_key, format!("is {value} but `{verl_key}` is {}: give it once", verl[&name]));
                self.record(Err(error));
                continue;
            }
            self.notes.push(format!("`{top_key}` ({value}) is used as {verl_key}"));
            verl.insert(name, value);
        }
        match serde_json::from_value(Value::Object(verl)) {
            Ok(merged) => config.trainer.trainer_config.algorithm.rollout_correction = merged,
            Err(e) => {
                let error = self.invalid("algorithm.rollout_correction", e.to_string());
                self.record(Err(error));
            }
        }
    }

    /// The rollout-correction keys that change the numbers, checked as veRL checks them; the keys trinity cannot
    /// honour are refused with why, and keys without effect in bypass mode are named in a note.
    fn check_rollout_correction(&mut self, rc: &crate::verl::RolloutCorrection, top_level: bool) {
        // Errors name the spelling the user wrote (the top-level one for a key neither gives, when it is there).
        let key = |r: &Self, name: &str| {
            let top = format!("algorithm.rollout_correction.{name}");
            let verl = format!("{AT}.algorithm.rollout_correction.{name}");
            if r.user_set(&top) || (top_level && !r.user_set(&verl)) { top } else { verl }
        };
        let settings = match rc.settings() {
            Ok(s) => s,
            Err((name, message)) => {
                let error = self.invalid(&key(self, name), message);
                self.record(Err(error));
                return;
            }
        };
        // `loss_type` other than `ppo_clip` is refused by its category (verl_category.rs).
        if rc.bypass_mode {
            let rs = key(self, "rollout_rs");
            self.check(
                settings.rs.is_empty(),
                &rs,
                "rejection sampling in bypass mode (veRL's bypass_mode loss, which rejects on the current policy's \
                 logprobs inside the loss) is not implemented in trinity; set bypass_mode (or \
                 algorithm.bypass_old_logprobs) to false to reject on the recomputed old logprobs",
            );
            for name in ["rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize"] {
                let k = key(self, name);
                if self.user_set(&k) {
                    self.notes.push(format!(
                        "`{k}` has no effect in bypass mode: the old logprobs are the rollout's, so every weight is 1 \
                         (as in veRL's ppo_clip bypass loss); set bypass_mode to false to weight by the recomputed ones"
                    ));
                }
            }
            return;
        }
        let weights = match settings.is_level {
            None => "no importance weights".to_owned(),
            Some(level) => format!(
                "{} importance weights π_old/π_rollout truncated at {}{}",
                if level == crate::verl::IsLevel::Token { "per-token" } else { "per-sequence" },
                settings.is_threshold,
                if settings.is_batch_normalize { " and normalised to mean 1 over the batch" } else { "" },
            ),
        };
        let rejection = match &rc.rollout_rs {
            None => "no rejection sampling".to_owned(),
            Some(rs) => format!("rejection sampling `{rs}`"),
        };
        self.notes.push(format!(
            "`{AT}.algorithm.rollout_correction.bypass_mode` is false: the trainer recomputes the old logprobs \
             before each update instead of using the rollout engine's, and corrects for their difference with \
             {weights} and {rejection} (rollout_corr/* metrics)"
        ));
    }

    /// `actor.optim.*` fills the `algorithm.optimizer` values the user did not write.
    fn map_actor_optim(&mut self, config: &mut Config, optim: &Map<String, Value>) -> Result<(), ConfigError> {
        let mut tree = serde_json::to_value(&config.algorithm.optimizer).unwrap_or(Value::Null);
        for (name, value) in optim {
            let key = format!("{AT}.actor_rollout_ref.actor.optim.{name}");
            let target = if name == "optimizer" { "optimizer_type" } else { name.as_str() };
            let top = format!("algorithm.optimizer.{target}");
            if tree.get(target).is_none() || name == "total_training_steps" {
                self.notes.push(format!("`{key}`: no effect in trinity (its AdamW has no such setting)"));
                continue;
            }
            if self.user_set(&top) {
                self.notes.push(format!("`{key}` is overridden by {top}, which is set"));
                continue;
            }
            let value = if name == "optimizer" {
                Value::from(value.as_str().unwrap_or("adam").to_lowercase())
            } else {
                value.clone()
            };
            tree[target] = value;
            self.notes.push(format!("`{key}` is used as {top}"));
        }
        config.algorithm.optimizer = serde_json::from_value(tree)
            .map_err(|e| self.invalid(&format!("{AT}.actor_rollout_ref.actor.optim"), e.to_string()))?;
        Ok(())
    }

    /// Resolves what the trainer reads from the veRL tree once the buffer and the algorithm are resolved:
    /// veRL values that win over `trainer.*`, mini-batches, epochs, the critic's optimizer and the old-logprob
    /// mode.
    pub(crate) fn resolve_trainer_config(&mut self, config: &mut Config) {
        let train_batch_size = config.buffer.train_batch_size;
        let grad_clip_default = config.trainer.grad_clip.unwrap_or(config.algorithm.optimizer.clip_grad);
        let top_level = config.algorithm.rollout_correction.is_some();
        self.resolve_fsdp_config(config);
        let verl = &mut config.trainer.trainer_config;
        let actor = &mut verl.actor_rollout_ref.actor;
        let at = format!("{AT}.actor_rollout_ref.actor");

        // Trinity-RFT: set_if_none(actor.X, trainer.X), so a veRL value wins over the trainer key.
        if let Some(clip) = actor.grad_clip {
            self.check(clip > 0.0, &format!("{at}.grad_clip"), "must be positive");
            config.trainer.grad_clip = Some(clip);
            config.algorithm.optimizer.clip_grad = clip;
            self.notes.push(format!("`{at}.grad_clip` ({clip}) wins over trainer.grad_clip, as in Trinity-RFT"));
        }
        if let Some(dynamic) = actor.use_dynamic_bsz {
            config.trainer.use_dynamic_bsz = dynamic;
        }
        if let Some(budget) = actor.ppo_max_token_len_per_gpu {
            config.trainer.max_token_len_per_gpu = Some(budget);
            self.notes.push(format!("`{at}.ppo_max_token_len_per_gpu` ({budget}) is the micro-batch token budget"));
        }

        self.check(actor.ppo_epochs >= 1, &format!("{at}.ppo_epochs"), "must be at least 1");
        if let Some(epochs) = verl.critic.ppo_epochs {
            self.check(epochs >= 1, &format!("{AT}.critic.ppo_epochs"), "must be at least 1");
        }
        // A value resolution filled in earlier (a stage re-resolves the resolved global config) follows this
        // train_batch_size; only a value the user wrote is kept.
        let written = self.user_set(&format!("{at}.ppo_mini_batch_size"))
            || self.source.positions.contains_key(&format!("{at}.ppo_mini_batch_size"));
        let mini = actor.ppo_mini_batch_size.filter(|_| written).unwrap_or(train_batch_size);
        if self.check(mini >= 1, &format!("{at}.ppo_mini_batch_size"), "must be at least 1") {
            self.check(
                mini <= train_batch_size && train_batch_size.is_multiple_of(mini),
                &format!("{at}.ppo_mini_batch_size"),
                format!(
                    "{mini} must divide buffer.train_batch_size ({train_batch_size}): each train step is split into \
                     equal mini-batches, one optimizer step each"
                ),
            );
        }
        actor.ppo_mini_batch_size = Some(mini);

        let trainer_keep = config.trainer.max_checkpoints_to_keep;
        if let Some(keep) = verl.trainer.max_actor_ckpt_to_keep {
            let key = format!("{AT}.trainer.max_actor_ckpt_to_keep");
            match trainer_keep {
                Some(_) => self.notes.push(format!("`{key}` is overridden by trainer.max_checkpoints_to_keep")),
                None => {
                    config.trainer.max_checkpoints_to_keep = Some(keep);
                    self.notes.push(format!("`{key}` ({keep}) is used as trainer.max_checkpoints_to_keep"));
                }
            }
        }

        self.check_rollout_correction(&verl.algorithm.rollout_correction, top_level);

        // Trinity-RFT 0.6.0 reads `trainer.critic_warmup`, its legacy veRL trainer the veRL spelling; one value
        // either way, in `trainer.critic_warmup`.
        let verl_warmup = verl.trainer.critic_warmup;
        let key = format!("{AT}.trainer.critic_warmup");
        match (config.trainer.critic_warmup, verl_warmup) {
            (top, v) if top != 0 && v != 0 && top != v => {
                let error = self.invalid(
                    "trainer.critic_warmup",
                    format!("is {top} but `{key}` is {v}: set one of them (Trinity-RFT reads one or the other)"),
                );
                self.record(Err(error));
            }
            (0, v) if v != 0 => config.trainer.critic_warmup = v,
            _ => {}
        }
        let warmup = config.trainer.critic_warmup;
        verl.trainer.critic_warmup = warmup;
        let use_critic = self.catalog.preset(&config.algorithm.algorithm_type).unwrap_or_default().use_critic;
        if warmup > 0 && !use_critic {
            self.notes.push(format!(
                "trainer.critic_warmup ({warmup}) has no effect: algorithm `{}` trains no critic, so the actor is \
                 updated from the first step (as Trinity-RFT's veRL trainer does)",
                config.algorithm.algorithm_type
            ));
        }

        let critic = &mut verl.critic;
        let key = format!("{AT}.critic");
        self.check(critic.cliprange_value >= 0.0, &format!("{key}.cliprange_value"), "must not be negative");
        match critic_optimizer(&critic.optim, grad_clip_default) {
            Ok(optim) => critic.optim_resolved = Some(optim),
            Err(message) => {
                let error = self.invalid(&format!("{key}.optim"), message);
                self.record(Err(error));
            }
        }
    }

    /// Sets an unset top-level option from a veRL value, with a note; a set one wins, also with a note.
    fn fill_option<T>(&mut self, target: &mut Option<T>, value: T, key: &str, top: &str) {
        if target.is_some() {
            self.notes.push(format!("`{key}` is overridden by {top}, which is set"));
        } else {
            *target = Some(value);
            self.notes.push(format!("`{key}` is used as {top}"));
        }
    }

    /// Sets an argument of a component from a veRL value, when the user's arguments lack it and the component
    /// takes it.
    #[allow(clippy::too_many_arguments)]
    fn fill_arg(
        &mut self,
        args: &mut Option<Map<String, Value>>,
        kind: ComponentKind,
        component: &str,
        arg: &str,
        value: f64,
        key: &str,
        top: &str,
    ) {
        let takes = self.catalog.default_args(kind, component).is_some_and(|d| d.contains_key(arg));
        if !takes {
            self.notes.push(format!("`{key}` has no effect: {} `{component}` takes no `{arg}`", kind.label()));
            return;
        }
        let args = args.get_or_insert_with(Map::new);
        if args.get(arg).is_some_and(|v| !v.is_null()) {
            self.notes.push(format!("`{key}` is overridden by algorithm.{top}.{arg}, which is set"));
            return;
        }
        args.insert(arg.to_owned(), Value::from(value));
        self.notes.push(format!("`{key}` is used as algorithm.{top}.{arg}"));
    }

    /// Whether the user wrote `key` (in the file or with `--set`), as opposed to a default.
    fn user_set(&self, key: &str) -> bool {
        let key = self.key(key);
        self.source.positions.contains_key(&key)
            || self.source.overrides.iter().any(|(set, _)| key == *set || key.starts_with(&format!("{set}.")))
    }
}

/// The critic's optimizer as Trinity-RFT builds it: veRL's own critic defaults (not `algorithm.optimizer`,
/// which only the actor reads), the user's `critic.optim` over them, and the trainer's gradient clip (veRL's
/// critic clips at `critic.grad_clip`, which Trinity-RFT sets from `trainer.grad_clip`).
fn critic_optimizer(optim: &crate::verl::CriticOptim, grad_clip: f64) -> Result<OptimizerConfig, String> {
    let defaults = OptimizerConfig { lr: 1e-6, min_lr_ratio: 0.01, ..OptimizerConfig::default() };
    let mut tree = serde_json::to_value(&defaults).map_err(|e| e.to_string())?;
    let user = serde_json::to_value(optim).map_err(|e| e.to_string())?;
    for field in
        ["lr", "lr_warmup_steps", "lr_warmup_steps_ratio", "min_lr_ratio", "lr_scheduler_type", "betas", "weight_decay"]
    {
        if let Some(value) = user.get(field).filter(|v| !v.is_null()) {
            tree[field] = value.clone();
        }
    }
    if let Some(style) = user.get("warmup_style").filter(|v| !v.is_null()) {
        tree["lr_scheduler_type"] = style.clone();
    }
    if let Some(name) = user.get("optimizer").and_then(Value::as_str) {
        tree["optimizer_type"] = Value::from(name.to_lowercase());
    }
    tree["clip_grad"] = user.get("clip_grad").filter(|v| !v.is_null()).cloned().unwrap_or(Value::from(grad_clip));
    let resolved: OptimizerConfig = serde_json::from_value(tree).map_err(|e| e.to_string())?;
    if !(resolved.lr.is_finite() && resolved.lr > 0.0) {
        return Err(format!("lr must be a positive number, got {}", resolved.lr));
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::LrScheduler;
    use crate::verl::CriticOptim;

    const BASE: &str = "model:\n  model_path: /m\n  max_model_len: 64\nbuffer:\n  explorer_input:\n    taskset:\n      \
                        path: /t.jsonl\n";

    #[test]
    fn zero_checkpoints_to_keep_means_keep_all_in_either_spelling() {
        let top = crate::testing::loaded(&format!("{BASE}trainer:\n  max_checkpoints_to_keep: 0\n"));
        assert_eq!(top.config.trainer.max_checkpoints_to_keep, Some(0));
        let verl = crate::testing::loaded(&format!(
            "{BASE}trainer:\n  trainer_config:\n    trainer:\n      max_actor_ckpt_to_keep: 0\n"
        ));
        assert_eq!(verl.config.trainer.max_checkpoints_to_keep, Some(0));
    }

    #[test]
    fn critic_warmup_loads_from_either_spelling_and_conflicting_values_are_refused() {
        let top = crate::testing::loaded(&format!("{BASE}trainer:\n  critic_warmup: 3\n"));
        assert_eq!(top.config.trainer.critic_warmup, 3);
        assert_eq!(top.config.trainer.trainer_config.trainer.critic_warmup, 3);
        // The test catalog's presets train no critic, so the warm-up is noted as having no effect.
        assert!(top.notes.iter().any(|n| n.to_string().contains("critic_warmup (3) has no effect")), "{:?}", top.notes);
        let verl = crate::testing::loaded(&format!(
            "{BASE}trainer:\n  trainer_config:\n    trainer:\n      critic_warmup: 2\n"
        ));
        assert_eq!(verl.config.trainer.critic_warmup, 2);
        let both =
            format!("{BASE}trainer:\n  critic_warmup: 3\n  trainer_config:\n    trainer:\n      critic_warmup: 2\n");
        let error = crate::testing::refusal(&both);
        crate::testing::assert_names(&error, "trainer.critic_warmup", &["is 3", "critic_warmup` is 2"]);
    }

    /// Trinity-RFT 0.6.0's spelling (`algorithm.rollout_correction`, `algorithm.bypass_old_logprobs`) and veRL's
    /// under `trainer.trainer_config` load to the same settings, which the dry run prints.
    #[test]
    fn both_spellings_of_rollout_correction_load_to_the_same_settings() {
        let top = crate::testing::loaded(&format!(
            "{BASE}algorithm:\n  bypass_old_logprobs: false\n  rollout_correction:\n    rollout_is: token\n    \
             rollout_is_threshold: 3.0\n    rollout_rs: token_k1,seq_max_k3\n    rollout_rs_threshold: 0.5_2.0,0.01\n"
        ));
        let verl = crate::testing::loaded(&format!(
            "{BASE}trainer:\n  trainer_config:\n    algorithm:\n      rollout_correction:\n        bypass_mode: false\n        \
             rollout_is: token\n        rollout_is_threshold: 3.0\n        rollout_rs: token_k1,seq_max_k3\n        \
             rollout_rs_threshold: 0.5_2.0,0.01\n"
        ));
        let rc = &top.config.trainer.trainer_config.algorithm.rollout_correction;
        assert_eq!(rc, &verl.config.trainer.trainer_config.algorithm.rollout_correction);
        assert!(!rc.bypass_mode);
        let settings = rc.settings().unwrap();
        assert_eq!(settings.is_level, Some(crate::verl::IsLevel::Token));
        assert_eq!(settings.is_threshold, 3.0);
        let bounds: Vec<_> = settings.rs.iter().map(|c| (c.name.as_str(), c.lower, c.upper)).collect();
        assert_eq!(bounds, [("token_k1", Some(0.5), 2.0), ("seq_max_k3", None, 0.01)]);
        let printed = top.dry_run_yaml();
        for line in [
            "rollout_is: token",
            "rollout_is_threshold: 3.0",
            "rollout_rs: \"token_k1,seq_max_k3\"",
            "bypass_mode: false",
        ] {
            assert!(printed.contains(line), "{line} in:\n{printed}");
        }
        let note = |l: &crate::Loaded, words: &str| l.notes.iter().any(|n| n.to_string().contains(words));
        assert!(note(&top, "`algorithm.rollout_correction.rollout_is` (\"token\") is used as"), "{:?}", top.notes);
        assert!(note(&verl, "per-token importance weights"), "{:?}", verl.notes);
    }

    #[test]
    fn rollout_correction_keys_trinity_cannot_honour_are_refused_with_why() {
        use crate::testing::{assert_names, refusal};
        let top = "algorithm.rollout_correction";
        let rc = |body: &str| format!("{BASE}algorithm:\n  rollout_correction:\n{body}");
        let e = refusal(&rc("    bypass_mode: false\n    rollout_rs: seq_mean_k2\n"));
        assert_names(&e, &format!("{top}.rollout_rs_threshold"), &["must be given"]);
        let e = refusal(&rc("    bypass_mode: false\n    rollout_rs: seq_max_k1\n    rollout_rs_threshold: 2.0\n"));
        assert_names(&e, &format!("{top}.rollout_rs"), &["not a rejection criterion"]);
        let e = refusal(&rc("    bypass_mode: false\n    rollout_rs: token_k3\n    rollout_rs_threshold: 0.1_2\n"));
        assert_names(&e, &format!("{top}.rollout_rs_threshold"), &["one upper bound"]);
        let e = refusal(&rc(
            "    bypass_mode: false\n    rollout_rs: token_k1,token_k2\n    rollout_rs_threshold: 1,2,3\n",
        ));
        assert_names(&e, &format!("{top}.rollout_rs_threshold"), &["or 2"]);
        let e = refusal(&rc("    rollout_is: geometric\n"));
        assert_names(&e, &format!("{top}.rollout_is"), &["token, sequence or null"]);
        let e = refusal(&rc("    rollout_is_threshold: 0\n"));
        assert_names(&e, &format!("{top}.rollout_is_threshold"), &["must be positive"]);
        let e = refusal(&rc("    rollout_rs: token_k1\n    rollout_rs_threshold: 2.0\n"));
        assert_names(&e, &format!("{top}.rollout_rs"), &["bypass mode", "not implemented"]);
        let e = refusal(&rc("    loss_type: reinforce\n"));
        assert_names(&e, &format!("{top}.loss_type"), &["not implemented"]);
        let e = refusal(&rc("    rollout_iss: token\n"));
        assert!(e.to_string().contains("rollout_iss"), "{e}");
        let both = format!(
            "{BASE}algorithm:\n  rollout_correction:\n    rollout_is: token\ntrainer:\n  trainer_config:\n    \
             algorithm:\n      rollout_correction:\n        rollout_is: sequence\n"
        );
        assert_names(&refusal(&both), &format!("{top}.rollout_is"), &["give it once"]);
        let bypass =
            format!("{BASE}algorithm:\n  bypass_old_logprobs: false\n  rollout_correction:\n    bypass_mode: true\n");
        assert_names(&refusal(&bypass), &format!("{top}.bypass_mode"), &["bypass_old_logprobs is false"]);
        // In bypass mode the weights are all 1: accepted, and a note says so.
        let loaded = crate::testing::loaded(&rc("    rollout_is: token\n"));
        assert!(loaded.notes.iter().any(|n| n.to_string().contains("no effect in bypass mode")), "{:?}", loaded.notes);
    }

    #[test]
    fn the_critic_optimizer_starts_from_verl_defaults_not_the_actor_optimizer() {
        let resolved = critic_optimizer(&CriticOptim::default(), 0.7).unwrap();
        assert_eq!(resolved.lr, 1e-6);
        assert_eq!(resolved.min_lr_ratio, 0.01);
        assert_eq!(resolved.clip_grad, 0.7, "the trainer's gradient clip");
        let user = CriticOptim {
            lr: Some(1e-5),
            warmup_style: Some("cosine".into()),
            clip_grad: Some(2.0),
            optimizer: Some("AdamW".into()),
            ..CriticOptim::default()
        };
        let resolved = critic_optimizer(&user, 0.7).unwrap();
        assert_eq!((resolved.lr, resolved.clip_grad), (1e-5, 2.0));
        assert_eq!(resolved.lr_scheduler_type, LrScheduler::Cosine);
        let bad = CriticOptim { lr: Some(-1.0), ..CriticOptim::default() };
        assert!(critic_optimizer(&bad, 1.0).unwrap_err().contains("lr must be a positive number"));
    }
}
