//! The tiny model configurations the workspace's test suites, examples and benches build their random models
//! from. One definition, so a new [`ModelConfig`] field is one line here rather than an edit of every suite's
//! literal; a suite that needs another shape overrides the fields it cares about with struct-update syntax
//! (`ModelConfig { vocab_size: 40, ..ModelConfig::tiny(Family::Llama) }`).
//!
//! Public but hidden from the docs, not behind a cargo feature: a `testing` feature turned on by the suites'
//! dev-dependencies would give this crate (and its C++ kernels) a second build in every test build.

use crate::config::{Family, ModelConfig, MoeConfig, RopeScaling};

impl ModelConfig {
    /// A two-layer model of `family` small enough for unit tests: vocabulary 32, hidden 32, MLP 48, 4 query
    /// and 2 key/value heads of 8, tied embeddings, 128 positions, end of sequence at id 1; the family's own
    /// biases and norms (Qwen2's q/k/v bias, Qwen3's q/k norm). Qwen3-MoE gets [`ModelConfig::tiny_moe`]'s
    /// experts.
    #[doc(hidden)]
    pub fn tiny(family: Family) -> ModelConfig {
        ModelConfig {
            family,
            vocab_size: 32,
            hidden_size: 32,
            intermediate_size: 48,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 8,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            max_position_embeddings: 128,
            tie_word_embeddings: true,
            qkv_bias: family == Family::Qwen2,
            o_bias: false,
            mlp_bias: false,
            qk_norm: matches!(family, Family::Qwen3 | Family::Qwen3Moe),
            bos_token_id: None,
            eos_token_ids: vec![1],
            torch_dtype: None,
            moe: (family == Family::Qwen3Moe).then(|| MoeConfig {
                num_experts: 4,
                num_experts_per_tok: 2,
                moe_intermediate_size: 8,
                norm_topk_prob: true,
                decoder_sparse_step: 1,
                mlp_only_layers: vec![1],
                router_aux_loss_coef: 0.001,
                output_router_logits: false,
            }),
        }
    }

    /// [`ModelConfig::tiny`] of Qwen3-MoE: layer 0 sparse (4 experts of MLP width 8, top 2, renormalised),
    /// layer 1 dense.
    #[doc(hidden)]
    pub fn tiny_moe() -> ModelConfig {
        ModelConfig::tiny(Family::Qwen3Moe)
    }
}
