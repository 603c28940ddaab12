//! The `mix` sample strategy (algorithms `mix` and `mix_chord`): each train step's batch is the explore step's
//! experiences plus expert rows from an SFT dataset, as Trinity-RFT's `MixSampleStrategy` builds it.
//!
//! Of `buffer.train_batch_size` rows, `ceil(expert_data_ratio · train_batch_size)` are expert rows read in order
//! from the auxiliary buffer named by `sft_dataset_name` (default `sft_dataset`); the rest are the explore step's
//! experiences, so they must number `batch_size × repeat_times` (config resolution checks it). Expert rows have
//! reward 0, zero rollout logprobs and zero advantages, and are marked expert: the policy loss trains them with its
//! SFT term and the usual rows with its PPO term.

use trinity_config::Config;
use trinity_config::algorithm::SampleStrategy;
use trinity_model::{ChatTemplate, Tokenizer};
use trinity_trainer::TrainRow;

use crate::error::RftError;
use crate::sft_data::SftRows;

/// The expert rows of a `mix` run and how many go into each train step.
#[derive(Debug)]
pub(crate) struct ExpertData {
    rows: SftRows,
    per_step: usize,
}

impl ExpertData {
    /// The expert data of `config` when its sample strategy is `mix`, positioned after `trained` train steps;
    /// `None` for every other strategy. `template` is the run's chat template (the dataset's `format.chat_template`
    /// wins over it).
    pub(crate) fn from_config(
        config: &Config,
        tokenizer: &Tokenizer,
        template: Option<&ChatTemplate>,
        trained: u64,
    ) -> Result<Option<ExpertData>, RftError> {
        let strategy = &config.algorithm.resolved.sample_strategy;
        let SampleStrategy::Mix { sft_dataset_name: name, .. } = strategy else {
            return Ok(None);
        };
        // Resolution has set train_batch_size (batch_size × repeat_times when the config leaves it unset).
        let per_step = strategy.expert_rows(config.buffer.train_batch_size).map_or(0, |(rows, _)| rows as usize);
        let setting = |message: String| RftError::Setting { key: "algorithm.sample_strategy_args", message };
        let buffer = config.buffer.trainer_input.auxiliary_buffers.get(name).ok_or_else(|| {
            setting(format!("sample strategy `mix` reads expert rows from buffer.trainer_input.auxiliary_buffers.{name}, which is not configured"))
        })?;
        // The dataset's own template and `enable_thinking` win over the model's.
        let source =
            buffer.format.chat_template.as_deref().or(template.map(ChatTemplate::source)).ok_or_else(|| {
                setting(format!(
                    "the SFT rows of `{name}` need a chat template; the model has none, set model.custom_chat_template"
                ))
            })?;
        let template = ChatTemplate::new(source, tokenizer.bos_token(), tokenizer.eos_token())
            .map_err(|e| setting(format!("{name}.format.chat_template: {e}")))?
            .with_enable_thinking(buffer.format.enable_thinking.or(config.model.enable_thinking));
        let max_model_len = config.model.resolved.max_model_len as usize;
        let mut rows = SftRows::load_sft(
            buffer,
            "buffer.trainer_input.auxiliary_buffers",
            buffer.total_epochs.unwrap_or(1),
            (tokenizer, &template),
            max_model_len,
        )?;
        rows.skip_to(per_step * trained as usize);
        tracing::info!(
            "sample strategy `mix`: {per_step} expert rows of `{name}` per train step, {} left",
            rows.remaining()
        );
        Ok(Some(ExpertData { rows, per_step }))
    }

    /// Train steps the remaining expert rows can feed.
    pub(crate) fn steps_left(&self) -> u64 {
        (self.rows.remaining() / self.per_step.max(1)) as u64
    }

    /// The expert rows of train step `step`.
    pub(crate) fn rows_for(&mut self, step: u64) -> Result<Vec<TrainRow>, RftError> {
        let mut rows = self.rows.take(self.per_step)?;
        for row in &mut rows {
            let length = row.response_length();
            row.reward = Some(0.0);
            row.advantages = Some(vec![0.0; length]);
            row.expert = true;
            row.step = Some(step as i64);
        }
        Ok(rows)
    }
}
