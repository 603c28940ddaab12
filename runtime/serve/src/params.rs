//! Request bodies: JSON objects checked against the fields each endpoint knows, and the sampling fields both
//! endpoints share turned into engine [`SamplingParams`].
//!
//! An unknown field is a 400 naming it (OpenAI's API refuses unknown arguments too): a misspelled `max_token`
//! silently ignored would be a wrong experiment. Fields that would change the sampled distribution and that the
//! engine cannot honour (penalties, logit bias, constrained output) are refused the same way, unless they hold
//! their neutral value; fields that change nothing (`user`, `metadata`, ...) are accepted.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use trinity_engine::SamplingParams;

use crate::error::ApiError;

/// Sampling and output fields shared by `/v1/chat/completions` and `/v1/completions` (OpenAI's names plus the
/// vLLM extras agent frameworks send).
pub(crate) const COMMON_FIELDS: &[&str] = &[
    "model",
    "n",
    "temperature",
    "top_p",
    "max_tokens",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "repetition_penalty",
    "return_token_ids",
    "top_k",
    "min_p",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "skip_special_tokens",
    "user",
    "metadata",
    "store",
    "service_tier",
];

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub(crate) include_usage: Option<bool>,
    /// vLLM's per-chunk usage; accepted, not produced.
    #[serde(default, rename = "continuous_usage_stats")]
    _continuous_usage_stats: Option<bool>,
}

/// The shared fields, typed.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct CommonParams {
    pub(crate) model: Option<String>,
    pub(crate) n: Option<usize>,
    pub(crate) temperature: Option<f32>,
    pub(crate) top_p: Option<f32>,
    pub(crate) max_tokens: Option<usize>,
    pub(crate) stop: Option<Stop>,
    pub(crate) seed: Option<i64>,
    pub(crate) stream: Option<bool>,
    pub(crate) stream_options: Option<StreamOptions>,
    pub(crate) presence_penalty: Option<f32>,
    pub(crate) frequency_penalty: Option<f32>,
    pub(crate) logit_bias: Option<Map<String, Value>>,
    pub(crate) repetition_penalty: Option<f32>,
    pub(crate) return_token_ids: Option<bool>,
    pub(crate) top_k: Option<i64>,
    pub(crate) min_p: Option<f32>,
    pub(crate) min_tokens: Option<usize>,
    pub(crate) ignore_eos: Option<bool>,
    pub(crate) stop_token_ids: Option<Vec<u32>>,
    pub(crate) skip_special_tokens: Option<bool>,
}

/// Parses a body into a JSON object.
pub(crate) fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::invalid(None, "the request body must be a JSON object")),
        Err(error) => Err(ApiError::invalid(None, format!("the request body is not valid JSON: {error}"))),
    }
}

/// Refuses any field outside `COMMON_FIELDS` and `own`.
pub(crate) fn check_known(map: &Map<String, Value>, own: &[&str]) -> Result<(), ApiError> {
    match map.keys().find(|k| !COMMON_FIELDS.contains(&k.as_str()) && !own.contains(&k.as_str())) {
        Some(unknown) => Err(ApiError {
            code: Some("unknown_parameter"),
            ..ApiError::invalid(Some(unknown.clone()), format!("unrecognized request argument supplied: {unknown}"))
        }),
        None => Ok(()),
    }
}

/// Deserializes the object into `T`, naming the offending field on a type error.
pub(crate) fn typed<T: DeserializeOwned>(map: &Map<String, Value>) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(Value::Object(map.clone())).map_err(|error| {
        let path = error.path().to_string();
        let param = (path != ".").then_some(path);
        let message = match &param {
            Some(p) => format!("invalid `{p}`: {}", error.inner()),
            None => format!("invalid request: {}", error.inner()),
        };
        ApiError::invalid(param, message)
    })
}

impl CommonParams {
    /// The engine parameters; `max_tokens` is the endpoint's resolved limit, `top_logprobs` how many
    /// alternatives to compute.
    pub(crate) fn sampling(
        &self,
        forced_temperature: Option<f32>,
        max_tokens: Option<usize>,
        top_logprobs: usize,
    ) -> Result<SamplingParams, ApiError> {
        let neutral = |param: &str, value: Option<f32>, neutral: f32| match value {
            Some(v) if v != neutral => Err(ApiError::unsupported(
                param,
                format!(
                    "`{param}` = {v} is not supported (the engine samples without penalties); leave it at {neutral}"
                ),
            )),
            _ => Ok(()),
        };
        neutral("presence_penalty", self.presence_penalty, 0.0)?;
        neutral("frequency_penalty", self.frequency_penalty, 0.0)?;
        neutral("repetition_penalty", self.repetition_penalty, 1.0)?;
        if self.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
            return Err(ApiError::unsupported("logit_bias", "`logit_bias` is not supported"));
        }
        if self.skip_special_tokens == Some(false) {
            return Err(ApiError::unsupported("skip_special_tokens", "returned text always skips special tokens"));
        }
        let n = self.n.unwrap_or(1);
        if n == 0 {
            return Err(ApiError::invalid_param("n", "`n` must be at least 1"));
        }
        if max_tokens == Some(0) {
            return Err(ApiError::invalid_param("max_tokens", "`max_tokens` must be at least 1"));
        }
        let temperature = match forced_temperature {
            Some(forced) => forced,
            None => self.temperature.unwrap_or(1.0),
        };
        if !temperature.is_finite() || temperature < 0.0 {
            return Err(ApiError::invalid_param("temperature", format!("{temperature} is not a number >= 0")));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid_param("stop", "stop strings must not be empty"));
        }
        Ok(SamplingParams {
            n,
            temperature,
            top_p: self.top_p.unwrap_or(1.0),
            top_k: self.top_k.filter(|&k| k > 0).map_or(0, |k| k as usize),
            min_p: self.min_p.unwrap_or(0.0),
            // A negative seed (Python ints) wraps: any value picks a fixed stream.
            seed: self.seed.map(|s| s as u64),
            max_tokens,
            min_tokens: self.min_tokens.unwrap_or(0),
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            stop,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            top_logprobs,
            constraint: None,
        })
    }
}
