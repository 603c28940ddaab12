//! LoRA adapters on a decoder's projections, and PEFT's adapter directory format.
//!
//! An adapted projection computes `W x + b + s · B (A drop(x))` with `A` `[r, in]` and `B` `[out, r]` trainable,
//! `W` and `b` frozen, and `s = alpha / r` (`alpha / √r` with rsLoRA). Fresh adapters start as PEFT starts them:
//! `A` Kaiming-uniform with `a = √5` (uniform in `±1/√in`), `B` zero, so the adapted model starts equal to the
//! base model. Dropout (`lora_dropout` of a loaded adapter) applies only while gradients are recorded, as PEFT's
//! does only in training mode.
//!
//! Invariants, once adapters are attached ([`Decoder::add_lora`], [`Decoder::load_lora`]):
//! - every base parameter has `requires_grad` off, so backward passes record no gradient for it and an optimizer
//!   over [`Decoder::trainable_parameters`] keeps no state for it: that is LoRA's memory saving;
//! - [`Decoder::merged_parameters`] is what the adapted model computes with (`W + s·B A` for adapted weights), so
//!   a generation engine fed those (weight sync, saved HF directories) samples from the trained policy;
//! - the packed decode path is off ([`Decoder::prepare_decode`] declines), because its kernels know no adapters.
//!
//! On disk an adapter is a PEFT directory: `adapter_config.json` (`peft_type: LORA`, `r`, `lora_alpha`,
//! `target_modules`, …) and `adapter_model.safetensors` with PEFT's names
//! (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`), which `peft.PeftModel.from_pretrained`
//! loads onto the transformers model.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use tch::{Kind, Tensor};

use crate::decoder::Decoder;
use crate::error::{ModelError, Result};
use crate::safetensors_io::{SafetensorsWeights, write_safetensors};

/// The name prefix PEFT gives a causal LM's tensors in an adapter file.
const PEFT_PREFIX: &str = "base_model.model.";
/// The adapter's config file in a PEFT directory.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The adapter's weights in a PEFT directory.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// Which projections an adapter covers, as PEFT's `target_modules` / `exclude_modules` say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleSelector {
    /// PEFT's `"all-linear"`: every linear layer but the output head.
    AllLinear,
    /// A string other than `all-linear`: a regular expression the whole module name must match.
    Regex(String),
    /// A list: a module matches when its name is an entry or ends with `.` + an entry.
    Names(Vec<String>),
}

impl ModuleSelector {
    /// The selector a JSON value spells (a string or a list of strings); `what` names the key for errors.
    pub fn from_json(value: &Value, what: &str) -> Result<Self> {
        match value {
            Value::String(s) if s == "all-linear" => Ok(ModuleSelector::AllLinear),
            Value::String(s) => {
                regex::Regex::new(&format!("^(?:{s})$"))
                    .map_err(|e| ModuleSelector::invalid(what, format!("`{s}` is not a regular expression: {e}")))?;
                Ok(ModuleSelector::Regex(s.clone()))
            }
            Value::Array(items) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| ModuleSelector::invalid(what, "entries must be strings"))
                })
                .collect::<Result<Vec<_>>>()
                .map(ModuleSelector::Names),
            other => Err(ModuleSelector::invalid(what, format!("expected a string or a list of strings, got {other}"))),
        }
    }

    fn invalid(what: &str, reason: impl Into<String>) -> ModelError {
        ModelError::UnsupportedConfig { key: what.to_owned(), reason: reason.into() }
    }

    /// Whether the module named `module` (`model.layers.0.self_attn.q_proj`) is selected. Every module asked
    /// about is a linear projection of a layer, so `AllLinear` takes them all.
    fn matches(&self, module: &str) -> bool {
        match self {
            ModuleSelector::AllLinear => true,
            ModuleSelector::Regex(pattern) => {
                // Checked to compile in `from_json`.
                regex::Regex::new(&format!("^(?:{pattern})$")).is_ok_and(|re| re.is_match(module))
            }
            ModuleSelector::Names(names) => {
                names.iter().any(|n| module == n || module.strip_suffix(n.as_str()).is_some_and(|p| p.ends_with('.')))
            }
        }
    }
}

/// How to build adapters: Trinity-RFT's `lora_rank`, `lora_alpha`, `target_modules`, `exclude_modules`, plus the
/// PEFT settings an existing adapter may carry.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSpec {
    /// `r`, the adapters' inner dimension.
    pub rank: i64,
    /// `lora_alpha`.
    pub alpha: f64,
    /// Which projections get an adapter.
    pub target_modules: ModuleSelector,
    /// Projections left alone even when targeted.
    pub exclude_modules: Option<ModuleSelector>,
    /// Dropout on the adapter's input while training.
    pub dropout: f64,
    /// rsLoRA: scale by `alpha / √r` instead of `alpha / r`.
    pub use_rslora: bool,
}

impl LoraSpec {
    /// Adapters of rank `rank` on every projection (PEFT's `all-linear`), scaled by `alpha / rank`, without
    /// dropout: Trinity-RFT's `lora_configs` defaults but for the two numbers every use chooses.
    pub fn all_linear(rank: i64, alpha: f64) -> Self {
        LoraSpec {
            rank,
            alpha,
            target_modules: ModuleSelector::AllLinear,
            exclude_modules: None,
            dropout: 0.0,
            use_rslora: false,
        }
    }

    /// The factor on `B A`.
    pub fn scale(&self) -> f64 {
        if self.use_rslora { self.alpha / (self.rank as f64).sqrt() } else { self.alpha / self.rank as f64 }
    }

    fn check(&self) -> Result<()> {
        if self.rank < 1 {
            return Err(ModelError::UnsupportedConfig { key: "lora_rank".into(), reason: "must be at least 1".into() });
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(ModelError::UnsupportedConfig { key: "lora_alpha".into(), reason: "must be positive".into() });
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ModelError::UnsupportedConfig {
                key: "lora_dropout".into(),
                reason: format!("must be in [0, 1), got {}", self.dropout),
            });
        }
        Ok(())
    }

    fn selects(&self, module: &str) -> bool {
        self.target_modules.matches(module) && !self.exclude_modules.as_ref().is_some_and(|e| e.matches(module))
    }
}

/// One projection's adapter.
#[derive(Debug)]
pub(crate) struct LoraBranch {
    /// `[r, in]`, trainable.
    a: Tensor,
    /// `[out, r]`, trainable.
    b: Tensor,
    scale: f64,
    dropout: f64,
    /// The decoder's switch ([`Decoder::without_lora`]).
    on: Arc<AtomicBool>,
}

impl LoraBranch {
    /// A copy sharing the adapter's tensors, with the decoder's switch as it is now: a recomputed layer
    /// ([`crate::checkpoint`]) must compute in the backward what its forward did, even when the adapters are
    /// switched off in between (scoring the base model).
    pub(crate) fn share(&self) -> LoraBranch {
        LoraBranch {
            a: self.a.shallow_clone(),
            b: self.b.shallow_clone(),
            scale: self.scale,
            dropout: self.dropout,
            on: Arc::new(AtomicBool::new(self.on.load(Ordering::Relaxed))),
        }
    }

    /// `y + s · B A drop(x)`, or `y` while the decoder's adapters are switched off.
    pub(crate) fn add_to(&self, y: Tensor, x: &Tensor) -> Result<Tensor> {
        if !self.on.load(Ordering::Relaxed) {
            return Ok(y);
        }
        // A view of a leaf that requires grad requires grad only while autograd records: the training pass (or
        // the first run of a recomputed layer, whose recomputation will record and must draw the same mask).
        let training = self.dropout > 0.0 && crate::checkpoint::recording(&self.a.f_alias()?);
        let x = if training { x.f_dropout(self.dropout, true)? } else { x.shallow_clone() };
        let branch =
            x.f_to_kind(self.a.kind())?.f_linear::<Tensor>(&self.a, None)?.f_linear::<Tensor>(&self.b, None)?;
        Ok(y + branch.f_mul_scalar(self.scale)?.f_to_kind(x.kind())?)
    }

    /// `s · B A` in fp32, the update merging adds to the base weight.
    fn delta(&self) -> Result<Tensor> {
        let (a, b) = (self.a.f_to_kind(Kind::Float)?, self.b.f_to_kind(Kind::Float)?);
        Ok(b.f_mm(&a)?.f_mul_scalar(self.scale)?)
    }
}

/// Seeded uniform draws (SplitMix64), so a run repeated with the same seed starts from the same adapters whatever
/// else drew from libtorch's global generator.
fn seeded_uniform(seed: u64, n: usize, bound: f64) -> Vec<f32> {
    let mut rng = trinity_rng::SplitMix64::new(seed);
    (0..n).map(|_| ((2.0 * rng.next_unit() - 1.0) * bound) as f32).collect()
}

fn module_name(layer: usize, local: &str) -> String {
    format!("model.layers.{layer}.{local}")
}

impl Decoder {
    /// Whether LoRA adapters are attached.
    pub fn has_lora(&self) -> bool {
        self.layers.iter().any(|l| l.linears().iter().any(|(_, lin)| lin.lora.is_some()))
    }

    /// Attaches fresh adapters (PEFT's initialisation, `A` drawn from `seed`) to every projection `spec` selects
    /// and freezes the base weights. Returns how many projections got one; selecting none is an error, as in PEFT.
    pub fn add_lora(&mut self, spec: &LoraSpec, seed: u64) -> Result<usize> {
        spec.check()?;
        if self.has_lora() {
            return Err(ModelError::InvalidInput("the model already carries LoRA adapters".into()));
        }
        let (kind, device, on) = (self.kind(), self.device(), self.lora_on.clone());
        let mut count = 0;
        for (i, layer) in self.layers.iter_mut().enumerate() {
            for (local, linear) in layer.linears_mut() {
                if !spec.selects(&module_name(i, local)) {
                    continue;
                }
                let [out, inp] = <[i64; 2]>::try_from(linear.weight.size())
                    .map_err(|_| ModelError::InvalidInput(format!("{local}: weight is not a matrix")))?;
                // kaiming_uniform_(a=√5): gain √(2/(1+5)), bound gain·√(3/fan_in) = 1/√fan_in.
                let bound = 1.0 / (inp as f64).sqrt();
                let stream = seed.wrapping_mul(1_000_003).wrapping_add(count as u64);
                let draws = seeded_uniform(stream, (spec.rank * inp) as usize, bound);
                let a = Tensor::f_from_slice(&draws)?.f_reshape([spec.rank, inp])?.f_to_dtype_layout(
                    (kind, device),
                    false,
                    false,
                )?;
                let b = Tensor::f_zeros([out, spec.rank], (kind, device))?;
                linear.lora = Some(LoraBranch {
                    a: a.set_requires_grad(true),
                    b: b.set_requires_grad(true),
                    scale: spec.scale(),
                    dropout: spec.dropout,
                    on: on.clone(),
                });
                count += 1;
            }
        }
        if count == 0 {
            return Err(ModelError::UnsupportedConfig {
                key: "target_modules".into(),
                reason: format!(
                    "{:?} (minus exclude_modules) selects none of the model's projections (q/k/v/o_proj, gate/up/down_proj)",
                    spec.target_modules
                ),
            });
        }
        self.freeze_base();
        Ok(count)
    }

    /// Turns gradients off for every base parameter.
    fn freeze_base(&self) {
        for (_, var) in self.vs.variables() {
            let _ = var.set_requires_grad(false);
        }
    }

    /// The adapters by PEFT module name without PEFT's prefix (`model.layers.0.self_attn.q_proj.lora_A.weight`), in
    /// layer order.
    pub fn lora_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            for (local, linear) in layer.linears() {
                if let Some(lora) = &linear.lora {
                    let m = module_name(i, local);
                    out.push((format!("{m}.lora_A.weight"), lora.a.shallow_clone()));
                    out.push((format!("{m}.lora_B.weight"), lora.b.shallow_clone()));
                }
            }
        }
        out
    }

    /// What an optimizer trains: the adapters when attached, else every parameter.
    pub fn trainable_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        if self.has_lora() { Ok(self.lora_parameters()) } else { self.named_parameters() }
    }

    /// The weights the model computes with, by HF name in [`crate::param_specs`] order: each adapted projection's
    /// weight as `W + s·B A` (a new tensor in the model's dtype), every other parameter as a shallow handle. A
    /// model without adapters gives exactly [`Decoder::named_parameters`].
    pub fn merged_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        let mut params = self.named_parameters()?;
        if !self.has_lora() {
            return Ok(params);
        }
        let mut merged = std::collections::HashMap::new();
        tch::no_grad(|| -> Result<()> {
            for (i, layer) in self.layers.iter().enumerate() {
                for (local, linear) in layer.linears() {
                    if let Some(lora) = &linear.lora {
                        let w = (linear.weight.f_to_kind(Kind::Float)? + lora.delta()?).f_to_kind(self.kind())?;
                        merged.insert(format!("{}.weight", module_name(i, local)), w);
                    }
                }
            }
            Ok(())
        })?;
        for (name, t) in &mut params {
            if let Some(w) = merged.remove(name.as_str()) {
                *t = w;
            }
        }
        Ok(params)
    }

    /// Folds the adapters into the base weights in place and removes them (what `trinity convert` writes and a
    /// rollout engine starting from an adapter generates with). The base weights stay frozen.
    pub fn merge_lora(&mut self) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for layer in &mut self.layers {
                for (_, linear) in layer.linears_mut() {
                    if let Some(lora) = linear.lora.take() {
                        let merged = (linear.weight.f_to_kind(Kind::Float)? + lora.delta()?).f_to_kind(self.kind)?;
                        linear.weight.f_copy_(&merged)?;
                    }
                }
            }
            Ok(())
        })?;
        self.weights_changed()
    }

    /// Runs `work` with the adapters switched off: the base model's outputs (a LoRA run's KL reference, as veRL
    /// scores its reference with the adapter disabled instead of holding a second copy of the model).
    pub fn without_lora<T>(&self, work: impl FnOnce() -> T) -> T {
        struct Restore<'a>(&'a AtomicBool);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        self.lora_on.store(false, Ordering::Relaxed);
        let _restore = Restore(&self.lora_on);
        work()
    }

    /// The settings of the attached adapters (they share one rank, alpha and dropout), `None` without any.
    fn lora_settings(&self) -> Option<(i64, f64, f64)> {
        self.layers
            .iter()
            .flat_map(|l| l.linears())
            .find_map(|(_, lin)| lin.lora.as_ref().map(|lora| (lora.a.size()[0], lora.scale, lora.dropout)))
    }

    /// Writes the adapters as a PEFT directory (`adapter_config.json` + `adapter_model.safetensors`) into `dir`.
    /// `alpha` and `use_rslora` are the spec's (the scale alone cannot tell them apart); `base_model` becomes
    /// `base_model_name_or_path`.
    pub fn save_lora(&self, dir: &Path, spec: &LoraSpec, base_model: &str) -> Result<()> {
        let Some((rank, _, dropout)) = self.lora_settings() else {
            return Err(ModelError::InvalidInput("the model carries no LoRA adapters to save".into()));
        };
        std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
        let tensors: Vec<(String, Tensor)> =
            self.lora_parameters().into_iter().map(|(n, t)| (format!("{PEFT_PREFIX}{n}"), t.detach())).collect();
        write_safetensors(&dir.join(ADAPTER_WEIGHTS), &tensors)?;
        let config = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model,
            "r": rank,
            "lora_alpha": spec.alpha,
            "lora_dropout": dropout,
            "target_modules": self.adapted_modules_json(),
            "exclude_modules": null,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": spec.use_rslora,
            "use_dora": false,
            "init_lora_weights": true,
            "inference_mode": true,
            "modules_to_save": null,
            "layers_to_transform": null,
            "layers_pattern": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "revision": null,
        });
        let text = serde_json::to_string_pretty(&config).map_err(|e| ModelError::InvalidInput(e.to_string()))?;
        let path = dir.join(ADAPTER_CONFIG);
        std::fs::write(&path, text).map_err(|e| ModelError::io(&path, e))
    }

    /// `target_modules` for the saved config, naming exactly the adapted projections: their short names
    /// (`q_proj`, …) when every layer has those and no others, else every full module name. An explicit list
    /// keeps PEFT from resolving a pattern differently on load.
    fn adapted_modules_json(&self) -> Value {
        let mut full = Vec::new();
        let mut short = BTreeSet::new();
        for (i, layer) in self.layers.iter().enumerate() {
            for (local, linear) in layer.linears() {
                if linear.lora.is_some() {
                    full.push(module_name(i, local));
                    short.insert(local.rsplit('.').next().unwrap_or(local).to_owned());
                }
            }
        }
        if full.len() == short.len() * self.layers.len() { json!(short) } else { json!(full) }
    }

    /// Attaches the adapters of the PEFT directory `dir` and freezes the base weights. Returns the adapter's
    /// settings. Refused, naming the file and what to do: DoRA, biases, rank or alpha patterns, extra trained
    /// modules, adapters on anything but the layers' projections, and shapes that do not fit this model.
    pub fn load_lora(&mut self, dir: &Path) -> Result<LoraSpec> {
        let config_path = dir.join(ADAPTER_CONFIG);
        let weights_path = dir.join(ADAPTER_WEIGHTS);
        for path in [&config_path, &weights_path] {
            if !path.is_file() {
                return Err(ModelError::MissingFile { path: path.clone() });
            }
        }
        let text = std::fs::read_to_string(&config_path).map_err(|e| ModelError::io(&config_path, e))?;
        let cfg: Value =
            serde_json::from_str(&text).map_err(|source| ModelError::Json { path: config_path.clone(), source })?;
        let spec = spec_from_peft(&cfg).map_err(|e| ModelError::in_file(&config_path, e))?;
        if self.has_lora() {
            return Err(ModelError::InvalidInput("the model already carries LoRA adapters".into()));
        }
        let file = SafetensorsWeights::open_files(std::slice::from_ref(&weights_path))?;
        let mut pairs: BTreeMap<String, [Option<Tensor>; 2]> = BTreeMap::new();
        for name in file.names() {
            let invalid = |reason: String| ModelError::InvalidFile { path: weights_path.clone(), reason };
            let module_and_part = name.strip_prefix(PEFT_PREFIX).and_then(|rest| {
                rest.strip_suffix(".lora_A.weight")
                    .map(|m| (m, 0))
                    .or_else(|| rest.strip_suffix(".lora_B.weight").map(|m| (m, 1)))
            });
            let Some((module, part)) = module_and_part else {
                return Err(invalid(format!(
                    "tensor `{name}` is not a LoRA A/B matrix of a causal LM (`{PEFT_PREFIX}…lora_A.weight`)"
                )));
            };
            pairs.entry(module.to_owned()).or_default()[part] = Some(file.get(&name)?);
        }
        let (kind, device, on) = (self.kind(), self.device(), self.lora_on.clone());
        let mut modules: BTreeMap<String, &mut crate::decoder::Linear> = BTreeMap::new();
        for (i, layer) in self.layers.iter_mut().enumerate() {
            for (local, linear) in layer.linears_mut() {
                modules.insert(module_name(i, local), linear);
            }
        }
        for (module, [a, b]) in pairs {
            let invalid = |reason: String| ModelError::InvalidFile { path: weights_path.clone(), reason };
            let (Some(a), Some(b)) = (a, b) else {
                return Err(invalid(format!("module `{module}` has only one of lora_A and lora_B")));
            };
            let Some(linear) = modules.get_mut(&module) else {
                return Err(invalid(format!(
                    "module `{module}` is not a projection of this model's layers (trinity adapts q/k/v/o_proj and \
                     gate/up/down_proj; embeddings and the output head cannot carry an adapter)"
                )));
            };
            let (out, inp) = (linear.weight.size()[0], linear.weight.size()[1]);
            if a.size() != [spec.rank, inp] || b.size() != [out, spec.rank] {
                return Err(invalid(format!(
                    "module `{module}`: lora_A {:?} and lora_B {:?} do not fit its weight [{out}, {inp}] at rank {}",
                    a.size(),
                    b.size(),
                    spec.rank
                )));
            }
            let to = |t: Tensor| t.f_to_dtype_layout((kind, device), false, false).map(|t| t.set_requires_grad(true));
            linear.lora =
                Some(LoraBranch { a: to(a)?, b: to(b)?, scale: spec.scale(), dropout: spec.dropout, on: on.clone() });
        }
        drop(modules);
        if !self.has_lora() {
            return Err(ModelError::InvalidFile { path: weights_path, reason: "holds no adapter".into() });
        }
        self.freeze_base();
        Ok(spec)
    }
}

/// The settings of a PEFT `adapter_config.json`, refusing what trinity's adapters cannot represent.
fn spec_from_peft(cfg: &Value) -> Result<LoraSpec> {
    let bad = |key: &str, reason: String| ModelError::UnsupportedConfig { key: key.to_owned(), reason };
    if let Some(t) = cfg.get("peft_type").and_then(Value::as_str)
        && t != "LORA"
    {
        return Err(bad("peft_type", format!("`{t}` adapters are not LoRA; only LoRA adapters load")));
    }
    let rank = cfg.get("r").and_then(Value::as_i64).ok_or_else(|| bad("r", "missing or not an integer".into()))?;
    let alpha = cfg.get("lora_alpha").and_then(Value::as_f64).unwrap_or(8.0);
    let flag = |key: &str| cfg.get(key).and_then(Value::as_bool).unwrap_or(false);
    for key in ["use_dora", "fan_in_fan_out"] {
        if flag(key) {
            return Err(bad(key, "is true; trinity's adapters are plain LoRA on [out, in] weights".into()));
        }
    }
    if let Some(bias) = cfg.get("bias").and_then(Value::as_str)
        && bias != "none"
    {
        return Err(bad("bias", format!("`{bias}`: trained biases are not supported (only `none`)")));
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        if cfg.get(key).and_then(Value::as_object).is_some_and(|m| !m.is_empty()) {
            return Err(bad(key, "per-module ranks or alphas are not supported; one rank and alpha for all".into()));
        }
    }
    if cfg.get("modules_to_save").and_then(Value::as_array).is_some_and(|m| !m.is_empty()) {
        return Err(bad("modules_to_save", "fully trained extra modules are not supported".into()));
    }
    let target_modules = match cfg.get("target_modules") {
        Some(v) if !v.is_null() => ModuleSelector::from_json(v, "target_modules")?,
        _ => ModuleSelector::AllLinear,
    };
    let spec = LoraSpec {
        rank,
        alpha,
        target_modules,
        exclude_modules: None,
        dropout: cfg.get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0),
        use_rslora: flag("use_rslora"),
    };
    spec.check()?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use super::*;
    use crate::config::{Family, ModelConfig};
    use crate::weights::RandomWeights;

    /// The adapters' draws are pinned: a run's LoRA initialisation must not move with a refactor.
    #[test]
    fn seeded_draws_are_pinned() {
        assert_eq!(seeded_uniform(42, 3, 0.5), [0.241_564_88, -0.340_089_62, -0.221_398_88]);
    }

    fn model() -> Decoder {
        tch::manual_seed(0);
        Decoder::load(ModelConfig::tiny(Family::Qwen2), &mut RandomWeights, Kind::Float, Device::Cpu).unwrap()
    }

    fn spec(targets: ModuleSelector) -> LoraSpec {
        LoraSpec { target_modules: targets, ..LoraSpec::all_linear(4, 8.0) }
    }

    fn ids() -> Tensor {
        Tensor::from_slice(&[1i64, 5, 9, 2, 6, 3]).view([2, 3])
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    /// Gives every B random values, so that the adapters change the output.
    fn randomize_b(m: &Decoder) {
        tch::no_grad(|| {
            for (name, t) in m.lora_parameters() {
                if name.contains("lora_B") {
                    t.shallow_clone().copy_(&(Tensor::randn(t.size(), (Kind::Float, Device::Cpu)) * 0.1));
                }
            }
        });
    }

    #[test]
    fn fresh_adapters_leave_the_model_unchanged_and_follow_peft_init() {
        let mut m = model();
        let before = m.forward(&ids(), None).unwrap();
        let n = m.add_lora(&spec(ModuleSelector::AllLinear), 7).unwrap();
        assert_eq!(n, 2 * 7);
        assert!(max_diff(&before, &m.forward(&ids(), None).unwrap()) == 0.0, "B = 0 must leave outputs alone");
        for (name, t) in m.lora_parameters() {
            if name.contains("lora_A") {
                let bound = 1.0 / (t.size()[1] as f64).sqrt();
                assert!(t.abs().max().double_value(&[]) <= bound, "{name} outside ±1/√in");
                assert!(t.abs().max().double_value(&[]) > bound / 2.0, "{name} not spread over its range");
            } else {
                assert!(t.abs().max().double_value(&[]) == 0.0, "{name} must start at zero");
            }
        }
    }

    #[test]
    fn merged_weights_compute_what_the_adapted_model_computes() {
        let mut m = model();
        m.add_lora(&spec(ModuleSelector::Names(vec!["q_proj".into(), "down_proj".into()])), 1).unwrap();
        randomize_b(&m);
        let adapted = m.forward(&ids(), None).unwrap();
        let base = m.without_lora(|| m.forward(&ids(), None).unwrap());
        assert!(max_diff(&adapted, &base) > 1e-3, "the adapters must change the output");

        let mut plain = model();
        plain.copy_weights_from(&m).unwrap();
        assert!(max_diff(&adapted, &plain.forward(&ids(), None).unwrap()) < 1e-5);

        m.merge_lora().unwrap();
        assert!(!m.has_lora());
        assert!(max_diff(&adapted, &m.forward(&ids(), None).unwrap()) < 1e-5);
    }

    #[test]
    fn gradients_reach_only_the_adapters() {
        let mut m = model();
        m.add_lora(&spec(ModuleSelector::AllLinear), 3).unwrap();
        randomize_b(&m);
        let h = m.forward_hidden(&ids(), None).unwrap();
        m.token_logprobs(&h, &ids(), 1.0, 4).unwrap().sum(Kind::Float).backward();
        for (name, t) in m.named_parameters().unwrap() {
            assert!(!t.requires_grad() && !t.grad().defined(), "base parameter {name} got a gradient");
        }
        let trainable = m.trainable_parameters().unwrap();
        assert_eq!(trainable.len(), 2 * 2 * 7);
        for (name, t) in trainable {
            assert!(t.grad().defined() && t.grad().abs().sum(Kind::Float).double_value(&[]) > 0.0, "{name}");
        }
    }

    #[test]
    fn selectors_follow_peft_matching() {
        let s = ModuleSelector::from_json(&json!(["q_proj", "model.layers.1.mlp.up_proj"]), "t").unwrap();
        assert!(s.matches("model.layers.0.self_attn.q_proj"));
        assert!(s.matches("model.layers.1.mlp.up_proj"));
        assert!(!s.matches("model.layers.0.mlp.up_proj"));
        assert!(!s.matches("model.layers.0.self_attn.xq_proj"));
        let r = ModuleSelector::from_json(&json!(r".*\.layers\.1\..*_proj"), "t").unwrap();
        assert!(r.matches("model.layers.1.self_attn.v_proj") && !r.matches("model.layers.0.self_attn.v_proj"));
        let err = ModuleSelector::from_json(&json!("(unclosed"), "model.lora_configs[0].target_modules").unwrap_err();
        assert!(err.to_string().contains("model.lora_configs[0].target_modules"), "{err}");
        assert!(ModuleSelector::from_json(&json!(3), "t").is_err());

        let mut m = model();
        let mut excluding = spec(ModuleSelector::AllLinear);
        excluding.exclude_modules = Some(ModuleSelector::Names(vec!["mlp.down_proj".into(), "o_proj".into()]));
        assert_eq!(m.add_lora(&excluding, 0).unwrap(), 2 * 5);
        let err = model().add_lora(&spec(ModuleSelector::Names(vec!["lm_head".into()])), 0).unwrap_err();
        assert!(err.to_string().contains("selects none"), "{err}");
    }

    #[test]
    fn saved_adapter_loads_back_with_peft_names() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = model();
        let s = spec(ModuleSelector::AllLinear);
        m.add_lora(&s, 5).unwrap();
        randomize_b(&m);
        m.save_lora(dir.path(), &s, "/models/tiny").unwrap();
        let file = SafetensorsWeights::open_files(&[dir.path().join(ADAPTER_WEIGHTS)]).unwrap();
        assert!(file.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
        assert!(file.contains("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
        let cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join(ADAPTER_CONFIG)).unwrap()).unwrap();
        assert_eq!(cfg["r"], 4);
        assert_eq!(cfg["peft_type"], "LORA");
        assert_eq!(cfg["target_modules"].as_array().unwrap().len(), 7);

        let mut loaded = model();
        let got = loaded.load_lora(dir.path()).unwrap();
        assert_eq!((got.rank, got.alpha), (4, 8.0));
        assert!(max_diff(&m.forward(&ids(), None).unwrap(), &loaded.forward(&ids(), None).unwrap()) < 1e-6);

        // A DoRA adapter, or one whose shapes belong to another model, is refused naming the file.
        let mut cfg_dora = cfg.clone();
        cfg_dora["use_dora"] = json!(true);
        std::fs::write(dir.path().join(ADAPTER_CONFIG), cfg_dora.to_string()).unwrap();
        let err = model().load_lora(dir.path()).unwrap_err().to_string();
        assert!(err.contains(ADAPTER_CONFIG) && err.contains("use_dora"), "{err}");
        let mut cfg_rank = cfg;
        cfg_rank["r"] = json!(2);
        std::fs::write(dir.path().join(ADAPTER_CONFIG), cfg_rank.to_string()).unwrap();
        let err = model().load_lora(dir.path()).unwrap_err().to_string();
        assert!(err.contains(ADAPTER_WEIGHTS) && err.contains("do not fit"), "{err}");
    }
}
