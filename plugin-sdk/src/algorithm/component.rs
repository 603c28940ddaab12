//! What a plugin author writes: components as plain Rust functions on `tch::Tensor`s, declared with their
//! arguments and defaults.
//!
//! Nothing here knows about the ABI: [`super::abi`] turns these declarations into the exported root module and
//! calls the functions through it. The same [`Batch`], [`Args`], [`Loss`] and [`Advantages`] types appear on the
//! host side of a call, so a component reads the batch exactly as a built-in reads trinity-algorithm's `Batch`.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};
use tch::{Kind, Tensor};

/// Metric name → value, as components report them (sorted, so output is stable).
pub type Metrics = BTreeMap<String, f64>;

/// A failure inside a component; the host reports it with the library and component names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    message: String,
}

impl Error {
    /// An error with this message (lowercase, no trailing period, as every trinity error).
    pub fn new(message: impl Into<String>) -> Self {
        Error { message: message.into() }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<tch::TchError> for Error {
    fn from(e: tch::TchError) -> Self {
        Error::new(format!("libtorch: {e}"))
    }
}

impl From<String> for Error {
    fn from(message: String) -> Self {
        Error { message }
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Self {
        Error::new(message)
    }
}

/// Rows of padded response tokens, borrowed from the host for one call: a plugin reads these tensors (and may
/// build autograd graphs on them) but never owns them.
///
/// Field names and meanings are trinity-algorithm's (Trinity-RFT's): every token field has the shape of
/// `action_mask` (rows × tokens), every row field one entry per row.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// 1 for tokens the model produced and is trained on, 0 for padding and environment tokens.
    pub action_mask: &'a Tensor,
    /// The current policy's logprobs; losses are differentiated with respect to this tensor.
    pub logprob: Option<&'a Tensor>,
    /// Logprobs of the policy that sampled the rows.
    pub old_logprob: Option<&'a Tensor>,
    /// The reference model's logprobs.
    pub ref_logprob: Option<&'a Tensor>,
    /// Per-token advantages (given, or computed by the advantage function).
    pub advantages: Option<&'a Tensor>,
    /// Per-token rewards.
    pub token_level_rewards: Option<&'a Tensor>,
    /// Critic values.
    pub values: Option<&'a Tensor>,
    /// Per-token entropy of the current policy.
    pub entropy: Option<&'a Tensor>,
    /// A teacher's logprobs of the sampled tokens.
    pub teacher_logprob: Option<&'a Tensor>,
    /// One scalar reward per row.
    pub reward: Option<&'a [f64]>,
    /// Per-row reward baselines.
    pub reward_baselines: Option<&'a [f64]>,
    /// The task group of each row.
    pub group_id: Option<&'a [&'a str]>,
    /// The run of each row within its task.
    pub run_id: Option<&'a [&'a str]>,
    /// The training step of each row.
    pub step: Option<&'a [i64]>,
    /// Rows that come from an expert (SFT) dataset.
    pub expert_mask: Option<&'a [bool]>,
}

impl<'a> Batch<'a> {
    /// A batch of `action_mask` only; fill the other fields with struct update syntax.
    pub fn new(action_mask: &'a Tensor) -> Self {
        Batch {
            action_mask,
            logprob: None,
            old_logprob: None,
            ref_logprob: None,
            advantages: None,
            token_level_rewards: None,
            values: None,
            entropy: None,
            teacher_logprob: None,
            reward: None,
            reward_baselines: None,
            group_id: None,
            run_id: None,
            step: None,
            expert_mask: None,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.action_mask.size().first().copied().unwrap_or(0) as usize
    }

    /// A token field the component cannot do without, by its name (`logprob`, `old_logprob`, `advantages`, …).
    pub fn need(&self, field: &str) -> Result<&'a Tensor, Error> {
        let value = match field {
            "action_mask" => Some(self.action_mask),
            "logprob" => self.logprob,
            "old_logprob" => self.old_logprob,
            "ref_logprob" => self.ref_logprob,
            "advantages" => self.advantages,
            "token_level_rewards" => self.token_level_rewards,
            "values" => self.values,
            "entropy" => self.entropy,
            "teacher_logprob" => self.teacher_logprob,
            other => return Err(Error::new(format!("`{other}` is not a token field of the batch"))),
        };
        value.ok_or_else(|| Error::new(format!("needs batch field `{field}`")))
    }

    /// The scalar reward of every row, required.
    pub fn need_reward(&self) -> Result<&'a [f64], Error> {
        self.reward.ok_or_else(|| Error::new("needs batch field `reward`"))
    }
}

/// A component's resolved arguments: the host has filled every default and rejected unknown names, so a
/// getter only fails on a wrong type.
#[derive(Debug, Clone, Default)]
pub struct Args {
    values: Map<String, Value>,
}

impl Args {
    /// Arguments from a JSON object.
    pub fn from_map(values: Map<String, Value>) -> Self {
        Args { values }
    }

    /// Parses the JSON object text the host sends.
    pub fn parse(json: &str) -> Result<Self, Error> {
        match serde_json::from_str(json) {
            Ok(Value::Object(values)) => Ok(Args { values }),
            Ok(other) => Err(Error::new(format!("arguments must be a JSON object, got {other}"))),
            Err(e) => Err(Error::new(format!("arguments are not JSON: {e}"))),
        }
    }

    /// Every value, defaults included.
    pub fn values(&self) -> &Map<String, Value> {
        &self.values
    }

    fn get(&self, name: &str) -> &Value {
        self.values.get(name).unwrap_or(&Value::Null)
    }

    fn wrong(name: &str, want: &str, got: &Value) -> Error {
        Error::new(format!("argument `{name}` must be {want}, got {got}"))
    }

    /// A number, or `None` for null.
    pub fn opt_f64(&self, name: &str) -> Result<Option<f64>, Error> {
        match self.get(name) {
            Value::Null => Ok(None),
            Value::Number(n) => n.as_f64().map(Some).ok_or_else(|| Self::wrong(name, "a number", &Value::Null)),
            other => Err(Self::wrong(name, "a number", other)),
        }
    }

    /// A number that must be present.
    pub fn f64(&self, name: &str) -> Result<f64, Error> {
        self.opt_f64(name)?.ok_or_else(|| Self::wrong(name, "a number", &Value::Null))
    }

    /// An integer, or `None` for null.
    pub fn opt_i64(&self, name: &str) -> Result<Option<i64>, Error> {
        match self.get(name) {
            Value::Null => Ok(None),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Ok(Some(i)),
                None => match n.as_f64() {
                    Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(Some(f as i64)),
                    _ => Err(Self::wrong(name, "an integer", self.get(name))),
                },
            },
            other => Err(Self::wrong(name, "an integer", other)),
        }
    }

    /// An integer that must be present.
    pub fn i64(&self, name: &str) -> Result<i64, Error> {
        self.opt_i64(name)?.ok_or_else(|| Self::wrong(name, "an integer", &Value::Null))
    }

    /// A boolean that must be present.
    pub fn bool(&self, name: &str) -> Result<bool, Error> {
        match self.get(name) {
            Value::Bool(b) => Ok(*b),
            other => Err(Self::wrong(name, "true or false", other)),
        }
    }

    /// A string, or `None` for null.
    pub fn opt_str(&self, name: &str) -> Result<Option<&str>, Error> {
        match self.get(name) {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s)),
            other => Err(Self::wrong(name, "a string", other)),
        }
    }

    /// A string that must be present.
    pub fn str(&self, name: &str) -> Result<&str, Error> {
        self.opt_str(name)?.ok_or_else(|| Self::wrong(name, "a string", &Value::Null))
    }
}

/// What a policy loss or an entropy loss returns.
#[derive(Debug)]
pub struct Loss {
    /// A scalar; for a policy loss, connected to `batch.logprob` so gradients flow back to the host's model.
    pub loss: Tensor,
    /// Metrics under the names the component reports (logged as `train/NAME`).
    pub metrics: Metrics,
}

/// What an advantage function returns.
#[derive(Debug)]
pub struct Advantages {
    /// Per-token advantages, rows × tokens, in input row order.
    pub advantages: Tensor,
    /// Per-token returns (critic targets); often a copy of `advantages`.
    pub returns: Tensor,
    /// Metrics under the names the component reports.
    pub metrics: Metrics,
    /// The rows that go on to training, as indices into the input (drop or repeat rows); `None`: every row.
    pub rows: Option<Vec<i64>>,
}

/// A policy loss: `(batch, args) → scalar loss + metrics`.
pub type PolicyLossFn = fn(&Batch<'_>, &Args) -> Result<Loss, Error>;
/// An advantage function: `(batch, args) → advantages, returns, metrics`.
pub type AdvantageFn = fn(&Batch<'_>, &Args) -> Result<Advantages, Error>;
/// A KL estimator: `(logprob, ref_logprob, old_logprob?, args) → per-token KL` (rows × tokens). The host applies
/// `kl_coef`, the aggregation, the reward penalty and the adaptive controller, as it does for built-in KL functions.
pub type KlFn = fn(&Tensor, &Tensor, Option<&Tensor>, &Args) -> Result<Tensor, Error>;
/// An entropy loss: `(batch, loss_agg_mode, args) → unscaled aggregate + metrics`. The host multiplies by
/// `entropy_coef` and subtracts the result from the loss, as for built-in entropy losses.
pub type EntropyLossFn = fn(&Batch<'_>, &str, &Args) -> Result<Loss, Error>;

/// The kinds of component a library can export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ComponentKind {
    /// An `algorithm_type` preset.
    Preset,
    /// An advantage function (`advantage_fn`).
    AdvantageFn,
    /// A policy loss (`policy_loss_fn`).
    PolicyLoss,
    /// A KL function (`kl_loss_fn`, `kl_penalty_fn`).
    KlFn,
    /// An entropy loss (`entropy_loss_fn`).
    EntropyLoss,
}

impl ComponentKind {
    /// Every kind, in listing order.
    pub const ALL: [ComponentKind; 5] = [
        ComponentKind::Preset,
        ComponentKind::AdvantageFn,
        ComponentKind::PolicyLoss,
        ComponentKind::KlFn,
        ComponentKind::EntropyLoss,
    ];

    /// The configuration key that names a component of this kind.
    pub fn config_key(self) -> &'static str {
        match self {
            ComponentKind::Preset => "algorithm_type",
            ComponentKind::AdvantageFn => "advantage_fn",
            ComponentKind::PolicyLoss => "policy_loss_fn",
            ComponentKind::KlFn => "kl_fn",
            ComponentKind::EntropyLoss => "entropy_loss_fn",
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            ComponentKind::Preset => 0,
            ComponentKind::AdvantageFn => 1,
            ComponentKind::PolicyLoss => 2,
            ComponentKind::KlFn => 3,
            ComponentKind::EntropyLoss => 4,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        ComponentKind::ALL.into_iter().find(|k| k.code() == code)
    }
}

impl fmt::Display for ComponentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.config_key())
    }
}

/// An `algorithm_type` preset: which components an algorithm uses and how the trainer runs it. Unset names fall
/// back to the user's config and then to Trinity-RFT's global defaults, as for built-in presets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Preset {
    /// Rollouts per task (`algorithm.repeat_times`).
    pub repeat_times: Option<u32>,
    /// How the buffer samples (`default`, `warmup`, `staleness_control`, `mix`).
    pub sample_strategy: Option<String>,
    /// The advantage function's name (built-in or from a library).
    pub advantage_fn: Option<String>,
    /// The policy loss's name.
    pub policy_loss_fn: Option<String>,
    /// The KL function applied to rewards (trainer-side advantages only).
    pub kl_penalty_fn: Option<String>,
    /// The KL function added to the loss.
    pub kl_loss_fn: Option<String>,
    /// The entropy loss's name.
    pub entropy_loss_fn: Option<String>,
    /// The loss aggregation mode.
    pub loss_agg_mode: Option<String>,
    /// Arguments the preset sets for its advantage function, merged over the function's defaults.
    pub advantage_fn_args: Option<Map<String, Value>>,
    /// Arguments the preset sets for its policy loss.
    pub policy_loss_fn_args: Option<Map<String, Value>>,
    /// The algorithm trains a critic (value head).
    pub use_critic: bool,
    /// The algorithm needs reference-model logprobs.
    pub use_reference: bool,
    /// The advantage runs in the trainer rather than at the end of the explorer's pipeline.
    pub compute_advantage_in_trainer: bool,
    /// What rows the algorithm trains on: `experience` (default), `sft` or `dpo`.
    pub schema: Option<String>,
}

impl Preset {
    /// The preset as the JSON object that crosses the boundary (unset fields omitted).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.to_owned(), v);
            }
        };
        put("repeat_times", self.repeat_times.map(Value::from));
        for (key, value) in [
            ("sample_strategy", &self.sample_strategy),
            ("advantage_fn", &self.advantage_fn),
            ("policy_loss_fn", &self.policy_loss_fn),
            ("kl_penalty_fn", &self.kl_penalty_fn),
            ("kl_loss_fn", &self.kl_loss_fn),
            ("entropy_loss_fn", &self.entropy_loss_fn),
            ("loss_agg_mode", &self.loss_agg_mode),
            ("schema", &self.schema),
        ] {
            put(key, value.clone().map(Value::from));
        }
        put("advantage_fn_args", self.advantage_fn_args.clone().map(Value::Object));
        put("policy_loss_fn_args", self.policy_loss_fn_args.clone().map(Value::Object));
        put("use_critic", Some(Value::Bool(self.use_critic)));
        put("use_reference", Some(Value::Bool(self.use_reference)));
        put("compute_advantage_in_trainer", Some(Value::Bool(self.compute_advantage_in_trainer)));
        Value::Object(m)
    }

    /// Reads [`Preset::to_json`]'s object back; unknown keys are errors, so a newer plugin's preset is not
    /// half-understood.
    pub fn from_json(value: &Value) -> Result<Self, Error> {
        let object = value.as_object().ok_or_else(|| Error::new("a preset must be a JSON object"))?;
        let mut p = Preset::default();
        for (key, v) in object {
            let string =
                || v.as_str().map(str::to_owned).ok_or_else(|| Error::new(format!("`{key}` must be a string")));
            let flag = || v.as_bool().ok_or_else(|| Error::new(format!("`{key}` must be true or false")));
            let args = || v.as_object().cloned().ok_or_else(|| Error::new(format!("`{key}` must be an object")));
            match key.as_str() {
                "repeat_times" => {
                    let n = v.as_u64().and_then(|n| u32::try_from(n).ok());
                    p.repeat_times = Some(n.ok_or_else(|| Error::new("`repeat_times` must be a count"))?);
                }
                "sample_strategy" => p.sample_strategy = Some(string()?),
                "advantage_fn" => p.advantage_fn = Some(string()?),
                "policy_loss_fn" => p.policy_loss_fn = Some(string()?),
                "kl_penalty_fn" => p.kl_penalty_fn = Some(string()?),
                "kl_loss_fn" => p.kl_loss_fn = Some(string()?),
                "entropy_loss_fn" => p.entropy_loss_fn = Some(string()?),
                "loss_agg_mode" => p.loss_agg_mode = Some(string()?),
                "schema" => p.schema = Some(string()?),
                "advantage_fn_args" => p.advantage_fn_args = Some(args()?),
                "policy_loss_fn_args" => p.policy_loss_fn_args = Some(args()?),
                "use_critic" => p.use_critic = flag()?,
                "use_reference" => p.use_reference = flag()?,
                "compute_advantage_in_trainer" => p.compute_advantage_in_trainer = flag()?,
                other => return Err(Error::new(format!("unknown preset key `{other}`"))),
            }
        }
        Ok(p)
    }
}

/// The function behind a component.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Body {
    Preset,
    Advantage(AdvantageFn),
    PolicyLoss(PolicyLossFn),
    Kl(KlFn),
    Entropy(EntropyLossFn),
}

/// One exported component: its kind, name, documentation, accepted arguments with defaults, and function.
///
/// ```text
/// Component::policy_loss("clipped_nll", clipped_nll).doc("NLL with a clipped ratio").arg("clip", 0.2)
/// ```
#[derive(Debug, Clone)]
pub struct Component {
    pub(crate) name: String,
    pub(crate) doc: String,
    pub(crate) args: Map<String, Value>,
    pub(crate) compute_in_trainer: bool,
    pub(crate) preset: Option<Preset>,
    pub(crate) body: Body,
}

impl Component {
    fn with(name: &str, body: Body) -> Self {
        Component {
            name: name.to_owned(),
            doc: String::new(),
            args: Map::new(),
            compute_in_trainer: false,
            preset: None,
            body,
        }
    }

    /// A policy loss under `name`.
    pub fn policy_loss(name: &str, f: PolicyLossFn) -> Self {
        Component::with(name, Body::PolicyLoss(f))
    }

    /// An advantage function under `name`; explorer-side (grouped, like `grpo`) unless [`Component::in_trainer`].
    pub fn advantage(name: &str, f: AdvantageFn) -> Self {
        Component::with(name, Body::Advantage(f))
    }

    /// A KL function under `name`. It accepts the arguments every KL function has (`kl_coef`, `adaptive`,
    /// `target_kl`, `horizon`, handled by the host) besides the ones declared with [`Component::arg`].
    pub fn kl(name: &str, f: KlFn) -> Self {
        Component::with(name, Body::Kl(f))
    }

    /// An entropy loss under `name`. It accepts `entropy_coef` (applied by the host) besides its own arguments.
    pub fn entropy_loss(name: &str, f: EntropyLossFn) -> Self {
        Component::with(name, Body::Entropy(f))
    }

    /// An `algorithm_type` preset under `name`.
    pub fn preset(name: &str, preset: Preset) -> Self {
        Component { preset: Some(preset), ..Component::with(name, Body::Preset) }
    }

    /// One line of documentation, shown by `trinity plugins list`.
    pub fn doc(mut self, doc: &str) -> Self {
        self.doc = doc.to_owned();
        self
    }

    /// An accepted argument and its default (`Value::Null` for "no value").
    pub fn arg(mut self, name: &str, default: impl Into<Value>) -> Self {
        self.args.insert(name.to_owned(), default.into());
        self
    }

    /// Marks an advantage function as trainer-side (runs after the KL reward penalty, like `ppo` or `rloo`).
    pub fn in_trainer(mut self) -> Self {
        self.compute_in_trainer = true;
        self
    }

    /// The component's kind.
    pub fn kind(&self) -> ComponentKind {
        match self.body {
            Body::Preset => ComponentKind::Preset,
            Body::Advantage(_) => ComponentKind::AdvantageFn,
            Body::PolicyLoss(_) => ComponentKind::PolicyLoss,
            Body::Kl(_) => ComponentKind::KlFn,
            Body::Entropy(_) => ComponentKind::EntropyLoss,
        }
    }

    /// The component's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Trinity-RFT's loss aggregation (`token-mean`, `seq-mean-token-sum`, `seq-mean-token-mean`,
/// `seq-mean-token-sum-norm`) of per-token `values` under `mask`, the same formulas as trinity-algorithm's
/// built-ins use, so a plugin loss honours `loss_agg_mode` like theirs.
pub fn aggregate(values: &Tensor, mask: &Tensor, mode: &str) -> Result<Tensor, Error> {
    let masked_sum = |dim: Option<i64>| -> Tensor {
        let valid = values.where_scalarother(&mask.gt(0.0), 0.0) * mask;
        match dim {
            None => valid.sum(Kind::Float),
            Some(d) => valid.sum_dim_intlist(d, false, Kind::Float),
        }
    };
    Ok(match mode {
        "token-mean" => masked_sum(None) / (mask.sum(Kind::Float) + 1e-8),
        "seq-mean-token-sum" => masked_sum(Some(-1)).mean(Kind::Float),
        "seq-mean-token-mean" => {
            (masked_sum(Some(-1)) / (mask.sum_dim_intlist(-1, false, Kind::Float) + 1e-8)).mean(Kind::Float)
        }
        "seq-mean-token-sum-norm" => {
            let len = mask.size().last().copied().unwrap_or(0) as f64;
            masked_sum(None) / (len + 1e-8)
        }
        other => {
            return Err(Error::new(format!(
                "invalid loss_agg_mode `{other}`; choose from token-mean, seq-mean-token-sum, seq-mean-token-mean, \
                 seq-mean-token-sum-norm"
            )));
        }
    })
}

/// A scalar tensor as `f64`, for metrics.
pub fn scalar(t: &Tensor) -> f64 {
    t.double_value(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preset_round_trips_and_rejects_unknown_keys() {
        let p = Preset {
            repeat_times: Some(4),
            policy_loss_fn: Some("clipped".into()),
            use_reference: true,
            policy_loss_fn_args: serde_json::json!({"clip": 0.1}).as_object().cloned(),
            ..Preset::default()
        };
        assert_eq!(Preset::from_json(&p.to_json()).unwrap(), p);
        let err = Preset::from_json(&serde_json::json!({"critic": true})).unwrap_err();
        assert!(err.message().contains("`critic`"), "{err}");
    }

    #[test]
    fn args_name_the_argument_on_a_wrong_type() {
        let args = Args::parse(r#"{"clip": "wide", "n": 2.0, "flag": null}"#).unwrap();
        assert!(args.f64("clip").unwrap_err().message().contains("`clip`"));
        assert_eq!(args.i64("n").unwrap(), 2);
        assert!(args.bool("flag").is_err());
        assert!(Args::parse("[1]").is_err());
    }

    #[test]
    fn aggregation_modes_by_hand() {
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).view([2, 3]);
        let m = Tensor::from_slice(&[1.0f32, 1.0, 0.0, 1.0, 0.0, 0.0]).view([2, 3]);
        let close = |mode: &str, want: f64| {
            let got = scalar(&aggregate(&x, &m, mode).unwrap());
            assert!((got - want).abs() < 1e-5, "{mode}: {got} vs {want}");
        };
        close("token-mean", 7.0 / 3.0);
        close("seq-mean-token-sum", 3.5);
        close("seq-mean-token-mean", (1.5 + 4.0) / 2.0);
        close("seq-mean-token-sum-norm", 7.0 / 3.0);
        assert!(aggregate(&x, &m, "mean").unwrap_err().message().contains("token-mean"));
    }

    #[test]
    fn missing_batch_field_is_named() {
        let mask = Tensor::ones([1, 2], (Kind::Float, tch::Device::Cpu));
        let batch = Batch::new(&mask);
        assert_eq!(batch.rows(), 1);
        assert!(batch.need("old_logprob").unwrap_err().message().contains("`old_logprob`"));
        assert!(batch.need_reward().is_err());
    }
}
