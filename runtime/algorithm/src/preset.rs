//! Presets (`algorithm_type`): which components an algorithm uses by default, and how the trainer runs it
//! (Trinity-RFT's `algorithm.py`).
//!
//! A preset only names what it sets; the rest falls back to Trinity-RFT's global defaults
//! ([`trinity_config::algorithm::FALLBACK_COMPONENTS`], the one table of them, which the config crate fills
//! configs from): `policy_loss_fn: ppo`, `advantage_fn: ppo`, `kl_penalty_fn: none`, `kl_loss_fn: k2`,
//! `entropy_loss_fn: default`, `sample_strategy: warmup`, `loss_agg_mode: token-mean`. DPO's `check_config`
//! forces `repeat_times = 2` (a pair) and a KL loss (`k2` when `none`); the preset below says the first and the
//! config layer applies the second.

use serde_json::{Map, Value};
use trinity_config::{ExperienceSchema, Preset};

/// A registered preset.
#[derive(Debug)]
pub struct PresetEntry {
    pub name: &'static str,
    pub preset: fn() -> Preset,
}

inventory::collect!(PresetEntry);

/// The common shape of the RL presets: explorer-side advantage, reference model, `default` sampling.
fn rl(repeat: u32, advantage: &str, policy_loss: &str, kl_loss: &str, entropy: &str) -> Preset {
    Preset {
        repeat_times: Some(repeat),
        sample_strategy: Some("default".into()),
        advantage_fn: Some(advantage.into()),
        policy_loss_fn: Some(policy_loss.into()),
        kl_penalty_fn: Some("none".into()),
        kl_loss_fn: Some(kl_loss.into()),
        entropy_loss_fn: Some(entropy.into()),
        use_reference: true,
        ..Preset::default()
    }
}

fn args(pairs: &[(&str, Value)]) -> Option<Map<String, Value>> {
    Some(pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect())
}

fn ppo() -> Preset {
    Preset { use_critic: true, compute_advantage_in_trainer: true, ..rl(1, "ppo", "ppo", "k2", "default") }
}
fn grpo() -> Preset {
    rl(2, "grpo", "ppo", "k2", "default")
}
fn grpo_verl() -> Preset {
    Preset { compute_advantage_in_trainer: true, ..grpo() }
}
fn dapo() -> Preset {
    Preset { use_reference: false, ..rl(16, "grpo", "ppo", "none", "default") }
}
fn reinforceplusplus() -> Preset {
    Preset { compute_advantage_in_trainer: true, ..rl(2, "reinforceplusplus", "ppo", "k2", "default") }
}
fn rloo() -> Preset {
    Preset { compute_advantage_in_trainer: true, ..rl(2, "rloo", "ppo", "k2", "default") }
}
fn opmd() -> Preset {
    rl(2, "opmd", "opmd", "k2", "default")
}
fn asymre() -> Preset {
    Preset { use_reference: false, ..rl(2, "asymre", "opmd", "none", "none") }
}
fn topr() -> Preset {
    rl(2, "reinforce", "topr", "k2", "default")
}
fn cispo() -> Preset {
    rl(2, "grpo", "cispo", "k2", "default")
}
fn gspo() -> Preset {
    rl(2, "grpo", "gspo", "k2", "default")
}
fn sapo() -> Preset {
    rl(2, "grpo", "sapo", "k2", "default")
}
fn sppo() -> Preset {
    Preset { use_reference: false, ..rl(2, "opmd", "sppo", "none", "none") }
}
fn rec() -> Preset {
    rl(2, "rec", "rec", "k2", "default")
}
fn multi_step_grpo() -> Preset {
    rl(8, "step_wise_grpo", "ppo", "k2", "default")
}
/// GiGPO's `default_config()` (0.6.0): its advantage and PPO clip arguments are written out as the class does.
fn gigpo() -> Preset {
    Preset {
        advantage_fn_args: args(&[
            ("omega", Value::from(1.0)),
            ("gamma", Value::from(1.0)),
            ("fnorm", Value::from("none")),
            ("epsilon", Value::from(1e-6)),
        ]),
        policy_loss_fn_args: args(&[
            ("clip_range_low", Value::from(0.2)),
            ("clip_range_high", Value::from(0.2)),
            ("loss_agg_mode", Value::from("token-mean")),
        ]),
        ..rl(8, "gigpo", "ppo", "k2", "default")
    }
}
/// MIX and MIX-CHORD leave the KL functions to the global fallback.
fn mix_like(policy_loss: &str) -> Preset {
    Preset {
        repeat_times: Some(8),
        sample_strategy: Some("mix".into()),
        advantage_fn: Some("grpo".into()),
        policy_loss_fn: Some(policy_loss.into()),
        entropy_loss_fn: Some("mix".into()),
        use_reference: true,
        ..Preset::default()
    }
}
fn mix() -> Preset {
    mix_like("mix")
}
fn mix_chord() -> Preset {
    mix_like("mix_chord")
}
/// SFT-like presets: no advantage, no KL, no entropy bonus.
fn sft_like(schema: ExperienceSchema) -> Preset {
    Preset {
        sample_strategy: Some("default".into()),
        policy_loss_fn: Some("sft".into()),
        kl_loss_fn: Some("none".into()),
        entropy_loss_fn: Some("none".into()),
        schema,
        ..Preset::default()
    }
}
fn sft() -> Preset {
    sft_like(ExperienceSchema::Sft)
}
/// CPT (0.6.0's `CPTAlgorithm`) is SFT's class with schema `cpt`: the same `sft` loss (-logprob, token-mean), on
/// plain-text rows whose first token is the only prompt.
fn cpt() -> Preset {
    sft_like(ExperienceSchema::Cpt)
}
fn raft() -> Preset {
    sft_like(ExperienceSchema::Experience)
}
fn dpo() -> Preset {
    Preset {
        repeat_times: Some(2),
        sample_strategy: Some("default".into()),
        policy_loss_fn: Some("dpo".into()),
        kl_loss_fn: Some("k2".into()),
        entropy_loss_fn: Some("default".into()),
        use_reference: true,
        schema: ExperienceSchema::Dpo,
        ..Preset::default()
    }
}
/// Distillation presets: trainer-side advantage from teacher logprobs, no reference model, no KL or entropy.
fn distill(advantage: &str, advantage_args: Option<Map<String, Value>>) -> Preset {
    Preset {
        use_reference: false,
        compute_advantage_in_trainer: true,
        advantage_fn_args: advantage_args,
        ..rl(8, advantage, "ppo", "none", "none")
    }
}
fn on_policy_distill() -> Preset {
    distill("on_policy_distill", args(&[("kl_coef", Value::from(1.0))]))
}
fn jsd() -> Preset {
    distill("jsd", args(&[("kl_coef", Value::from(1.0)), ("lambda_coef", Value::from(0.5))]))
}

inventory::submit! { PresetEntry { name: "ppo", preset: ppo } }
inventory::submit! { PresetEntry { name: "grpo", preset: grpo } }
inventory::submit! { PresetEntry { name: "grpo_verl", preset: grpo_verl } }
inventory::submit! { PresetEntry { name: "dapo", preset: dapo } }
inventory::submit! { PresetEntry { name: "reinforceplusplus", preset: reinforceplusplus } }
inventory::submit! { PresetEntry { name: "rloo", preset: rloo } }
inventory::submit! { PresetEntry { name: "opmd", preset: opmd } }
inventory::submit! { PresetEntry { name: "asymre", preset: asymre } }
inventory::submit! { PresetEntry { name: "topr", preset: topr } }
inventory::submit! { PresetEntry { name: "cispo", preset: cispo } }
inventory::submit! { PresetEntry { name: "gspo", preset: gspo } }
inventory::submit! { PresetEntry { name: "sapo", preset: sapo } }
inventory::submit! { PresetEntry { name: "sppo", preset: sppo } }
inventory::submit! { PresetEntry { name: "rec", preset: rec } }
inventory::submit! { PresetEntry { name: "multi_step_grpo", preset: multi_step_grpo } }
inventory::submit! { PresetEntry { name: "gigpo", preset: gigpo } }
inventory::submit! { PresetEntry { name: "mix", preset: mix } }
inventory::submit! { PresetEntry { name: "mix_chord", preset: mix_chord } }
inventory::submit! { PresetEntry { name: "sft", preset: sft } }
inventory::submit! { PresetEntry { name: "cpt", preset: cpt } }
inventory::submit! { PresetEntry { name: "raft", preset: raft } }
inventory::submit! { PresetEntry { name: "dpo", preset: dpo } }
inventory::submit! { PresetEntry { name: "on_policy_distill", preset: on_policy_distill } }
inventory::submit! { PresetEntry { name: "jsd", preset: jsd } }

#[cfg(test)]
mod tests {
    use crate::registry::{self, Kind};

    #[test]
    fn presets_name_registered_components() {
        for entry in inventory::iter::<super::PresetEntry> {
            let p = (entry.preset)();
            let check = |kind: Kind, name: &Option<String>| {
                if let Some(name) = name {
                    assert!(registry::names(kind).contains(name), "preset {} names unknown {kind} {name}", entry.name);
                }
            };
            check(Kind::AdvantageFn, &p.advantage_fn);
            check(Kind::PolicyLoss, &p.policy_loss_fn);
            check(Kind::KlFn, &p.kl_loss_fn);
            check(Kind::KlFn, &p.kl_penalty_fn);
            check(Kind::EntropyLoss, &p.entropy_loss_fn);
            check(Kind::SampleStrategy, &p.sample_strategy);
        }
    }

    #[test]
    fn the_config_parses_every_registered_sample_strategy_and_falls_back_to_registered_components() {
        use trinity_config::algorithm::{SampleStrategy, fallback_component};
        let registered = registry::names(Kind::SampleStrategy);
        let parsed: Vec<&str> = registered.iter().map(|n| SampleStrategy::parse(n, None).unwrap().name()).collect();
        let mut accepted = SampleStrategy::NAMES.to_vec();
        accepted.sort_unstable();
        assert_eq!(parsed, accepted, "the registry and the config's SampleStrategy name the same strategies");
        for (key, kind) in [
            ("sample_strategy", Kind::SampleStrategy),
            ("policy_loss_fn", Kind::PolicyLoss),
            ("advantage_fn", Kind::AdvantageFn),
            ("kl_penalty_fn", Kind::KlFn),
            ("kl_loss_fn", Kind::KlFn),
            ("entropy_loss_fn", Kind::EntropyLoss),
        ] {
            let name = fallback_component(key).unwrap().to_owned();
            assert!(registry::names(kind).contains(&name), "fallback {key}: {name} is not registered");
        }
    }

    #[test]
    fn table_matches_trinity() {
        let p = |n: &str| registry::preset(n).unwrap();
        assert!(p("ppo").use_critic && p("ppo").compute_advantage_in_trainer && p("ppo").repeat_times == Some(1));
        assert!(!p("grpo").compute_advantage_in_trainer && p("grpo").use_reference);
        assert_eq!(p("multi_step_grpo").advantage_fn.as_deref(), Some("step_wise_grpo"));
        assert_eq!(p("mix").kl_loss_fn, None);
        assert_eq!(p("sft").schema, trinity_config::ExperienceSchema::Sft);
        // CPT is SFT on plain text: the same components, its own schema.
        let (cpt, sft) = (p("cpt"), p("sft"));
        assert_eq!(cpt.schema, trinity_config::ExperienceSchema::Cpt);
        assert_eq!(
            (cpt.policy_loss_fn, cpt.kl_loss_fn, cpt.entropy_loss_fn, cpt.sample_strategy, cpt.advantage_fn),
            (sft.policy_loss_fn, sft.kl_loss_fn, sft.entropy_loss_fn, sft.sample_strategy, sft.advantage_fn)
        );
        assert!(!cpt.use_reference && !cpt.use_critic && !cpt.compute_advantage_in_trainer);
        assert_eq!(p("dpo").repeat_times, Some(2));
        assert!(!p("asymre").use_reference && p("asymre").entropy_loss_fn.as_deref() == Some("none"));
        assert_eq!(p("jsd").advantage_fn_args.unwrap()["lambda_coef"], 0.5);
        // GiGPO (0.6.0's `GiGPOAlgorithm`): explorer-side advantage, reference model, 8 runs per task.
        let g = p("gigpo");
        assert!(g.use_reference && !g.use_critic && !g.compute_advantage_in_trainer && g.repeat_times == Some(8));
        assert_eq!(g.advantage_fn_args.unwrap()["fnorm"], "none");
        assert_eq!(g.policy_loss_fn_args.unwrap()["clip_range_high"], 0.2);
        assert_eq!((g.kl_loss_fn.as_deref(), g.sample_strategy.as_deref()), (Some("k2"), Some("default")));
    }
}
