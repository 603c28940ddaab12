//! Engine settings and how they size the KV cache.
//!
//! The cache is allocated once, as `slots × (max_model_len + 1)` positions per layer (see
//! [`trinity_model::KvCache`]). `slots` is `max_num_seqs`, lowered to what `kv_cache_bytes` holds when a budget
//! is given; a budget that does not hold one slot is an error at start-up, not an out-of-memory later.

use serde::Deserialize;
use tch::Kind;
use trinity_model::ModelConfig;

use crate::error::{EngineError, Result};

/// How big the engine is and how it batches.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Most tokens per sequence, prompt plus response (Trinity's `model.max_model_len`); the KV-cache
    /// capacity of one slot.
    pub max_model_len: usize,
    /// Most sequences decoded at once (KV-cache slots); samples of one request count one each.
    pub max_num_seqs: usize,
    /// Memory budget for the KV cache in bytes; `None` allocates `max_num_seqs` slots.
    pub kv_cache_bytes: Option<u64>,
    /// Longest prompt accepted (Trinity's `model.max_prompt_tokens`); `None` allows `max_model_len - 1`.
    pub max_prompt_tokens: Option<usize>,
    /// `max_tokens` of a request that sets none (Trinity's `model.max_response_tokens`, the default its vLLM engine
    /// samples with); a request's own `max_tokens` is bounded by `max_model_len` only.
    pub max_response_tokens: Option<usize>,
    /// Most (padded) prompt tokens prefilled in one forward pass; a longer single prompt still runs alone.
    pub max_prefill_tokens: usize,
    /// libtorch intra-op threads for the engine thread; `None` keeps the starting thread's setting.
    pub num_threads: Option<usize>,
    /// Return the experts a mixture-of-experts model routed every token to ([`crate::Completion::routed_experts`],
    /// Trinity-RFT's `rollout_model.enable_return_routed_experts`), for routing replay in training. Every prompt
    /// is then prefilled in full (no prefix cache, no shared prefix: a reused start has no routing to report);
    /// off, nothing is recorded. A dense model refuses it at start-up.
    pub return_routed_experts: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_model_len: 4096,
            max_num_seqs: 64,
            kv_cache_bytes: None,
            max_prompt_tokens: None,
            max_response_tokens: None,
            max_prefill_tokens: 8192,
            num_threads: None,
            return_routed_experts: false,
        }
    }
}

impl EngineConfig {
    /// Bytes one KV-cache slot takes for `model` in `kind`.
    pub fn bytes_per_slot(&self, model: &ModelConfig, kind: Kind) -> u64 {
        let per_position = 2 * model.num_hidden_layers * model.num_key_value_heads * model.head_dim;
        per_position as u64 * (self.max_model_len as u64 + 1) * kind.elt_size_in_bytes() as u64
    }

    /// The number of KV-cache slots: `max_num_seqs`, or fewer when the budget holds fewer.
    pub fn num_slots(&self, model: &ModelConfig, kind: Kind) -> Result<usize> {
        if self.max_model_len < 2 {
            return Err(EngineError::InvalidConfig {
                key: "max_model_len",
                reason: format!("{} leaves no room for a prompt and a token", self.max_model_len),
            });
        }
        if self.max_num_seqs == 0 {
            return Err(EngineError::InvalidConfig { key: "max_num_seqs", reason: "must be at least 1".into() });
        }
        if self.max_prefill_tokens == 0 {
            return Err(EngineError::InvalidConfig { key: "max_prefill_tokens", reason: "must be at least 1".into() });
        }
        let per_slot = self.bytes_per_slot(model, kind);
        match self.kv_cache_bytes {
            None => Ok(self.max_num_seqs),
            Some(budget) => {
                let fit = (budget / per_slot.max(1)) as usize;
                if fit == 0 {
                    return Err(EngineError::KvBudgetTooSmall {
                        budget_bytes: budget,
                        per_slot_bytes: per_slot,
                        max_model_len: self.max_model_len,
                    });
                }
                Ok(fit.min(self.max_num_seqs))
            }
        }
    }

    /// The longest prompt that can start, and the setting that imposes it.
    pub(crate) fn prompt_limit(&self) -> (usize, &'static str) {
        let by_len = self.max_model_len - 1;
        match self.max_prompt_tokens {
            Some(p) if p < by_len => (p, "max_prompt_tokens"),
            _ => (by_len, "max_model_len - 1"),
        }
    }
}
