//! What a caller asks of one generation request: how many samples, how to sample, when to stop.
//!
//! Field names and defaults follow Trinity-RFT / vLLM so that configs and workflow code read the same:
//! `temperature` 1.0, `top_p` 1.0, `top_k` off, `min_p` off, `n` 1, no seed, `max_tokens` the engine's
//! `max_response_tokens`, and no length limit beyond `max_model_len`.

use serde::Deserialize;

use crate::constraint::Constraint;
use crate::error::{EngineError, Result};

/// Sampling and stopping parameters of one request.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// Independent samples of the prompt; they share one prefill and occupy `n` KV-cache slots.
    pub n: usize,
    /// Softmax temperature; `0` means greedy (argmax). Logprobs use this temperature (1 when greedy).
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose probability reaches `top_p`.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables.
    pub top_k: usize,
    /// Drop tokens less likely than `min_p` times the most likely one; `0` disables.
    pub min_p: f32,
    /// Seed of this request's random stream: the same seed, prompt and parameters give the same tokens,
    /// whichever other requests share the batch. `None` draws a fresh seed.
    pub seed: Option<u64>,
    /// Most new tokens per sample (bounded by the room `max_model_len` leaves); `None` takes the engine's
    /// `max_response_tokens`.
    pub max_tokens: Option<usize>,
    /// End-of-sequence and stop token ids are masked until this many tokens are generated.
    pub min_tokens: usize,
    /// Extra token ids that end a sample (finish reason `stop`); they are kept in the returned tokens.
    pub stop_token_ids: Vec<u32>,
    /// Strings that end a sample when they appear in its decoded text (finish reason `stop`); the returned
    /// text stops before the string, the returned tokens run through the token that completed it.
    pub stop: Vec<String>,
    /// Do not stop at the model's end-of-sequence ids (forced-length generation for benchmarks).
    pub ignore_eos: bool,
    /// How many of the most likely tokens to report at each generated position, with their logprobs
    /// (OpenAI's `top_logprobs`); only streamed requests receive them ([`crate::StreamedToken`]). 0 computes
    /// nothing extra.
    pub top_logprobs: usize,
    /// Which tokens each sample may choose at each step (a JSON schema, a grammar); `None` samples freely.
    /// Logprobs stay those of the unmasked distribution (the crate docs' *Constrained sampling*). Not part
    /// of the serialized form: a constraint is built by the caller in code.
    #[serde(skip)]
    pub constraint: Option<Constraint>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            max_tokens: None,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            ignore_eos: false,
            top_logprobs: 0,
            constraint: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        Self { temperature: 0.0, max_tokens: Some(max_tokens), ..Self::default() }
    }

    /// Whether tokens are chosen by argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The temperature logprobs are computed with: the sampling temperature, or 1 for greedy decoding.
    pub fn logprob_temperature(&self) -> f32 {
        if self.is_greedy() { 1.0 } else { self.temperature }
    }

    /// Checks ranges and consistency; `request` names the request in the error.
    pub(crate) fn validate(&self, request: u64, vocab_size: usize, has_tokenizer: bool) -> Result<()> {
        let bad = |param, reason: String| Err(EngineError::InvalidParams { request, param, reason });
        if self.n == 0 {
            return bad("n", "must be at least 1".into());
        }
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad("temperature", format!("{} is not a finite number >= 0", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("{} is not in (0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("{} is not in [0, 1]", self.min_p));
        }
        if let Some(max) = self.max_tokens {
            if max == 0 {
                return bad("max_tokens", "must be at least 1".into());
            }
            if self.min_tokens > max {
                return bad("min_tokens", format!("{} is more than max_tokens = {max}", self.min_tokens));
            }
        }
        if let Some(&id) = self.stop_token_ids.iter().find(|&&id| id as usize >= vocab_size) {
            return bad("stop_token_ids", format!("{id} is outside the vocabulary of {vocab_size}"));
        }
        if self.top_logprobs > vocab_size {
            return bad("top_logprobs", format!("{} is more than the vocabulary of {vocab_size}", self.top_logprobs));
        }
        if self.stop.iter().any(String::is_empty) {
            return bad("stop", "stop strings must not be empty".into());
        }
        if !self.stop.is_empty() && !has_tokenizer {
            return bad("stop", "stop strings need an engine with a tokenizer".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_trinity_and_parse_from_json() {
        let p: SamplingParams = serde_json::from_str(r#"{"temperature": 0.7, "n": 4, "stop": ["\n\n"]}"#).unwrap();
        assert_eq!((p.n, p.temperature, p.top_p, p.top_k), (4, 0.7, 1.0, 0));
        assert_eq!(p.stop, vec!["\n\n".to_owned()]);
        assert!(serde_json::from_str::<SamplingParams>(r#"{"temprature": 1}"#).is_err());
        assert_eq!(SamplingParams::greedy(3).logprob_temperature(), 1.0);
    }

    #[test]
    fn validation_names_the_parameter() {
        let check = |p: SamplingParams| match p.validate(7, 100, false) {
            Err(EngineError::InvalidParams { request: 7, param, .. }) => param,
            other => panic!("{other:?}"),
        };
        assert_eq!(check(SamplingParams { n: 0, ..Default::default() }), "n");
        assert_eq!(check(SamplingParams { temperature: -1.0, ..Default::default() }), "temperature");
        assert_eq!(check(SamplingParams { top_p: 0.0, ..Default::default() }), "top_p");
        assert_eq!(check(SamplingParams { min_p: 2.0, ..Default::default() }), "min_p");
        assert_eq!(check(SamplingParams { max_tokens: Some(2), min_tokens: 3, ..Default::default() }), "min_tokens");
        assert_eq!(check(SamplingParams { stop_token_ids: vec![100], ..Default::default() }), "stop_token_ids");
        assert_eq!(check(SamplingParams { stop: vec!["x".into()], ..Default::default() }), "stop");
        assert_eq!(check(SamplingParams { top_logprobs: 101, ..Default::default() }), "top_logprobs");
        assert!(SamplingParams::default().validate(7, 100, false).is_ok());
    }
}
