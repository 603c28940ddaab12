//! The Trainer: consumes experiences (or dataset rows), applies the algorithm, publishes weights and writes
//! checkpoints.
//!
//! Its interface is narrow on purpose: it takes a train step's experiences ([`Trainer::train_experiences`]) or
//! rows ([`Trainer::train_rows`]) and gives out weights ([`Trainer::weights`]); which experiences come (one explore
//! step in one process, or a buffer shared with other processes) is the mode's business. What it adds to a step's
//! experiences is the sample strategy, a trainer concept in Trinity-RFT: staleness control drops experiences older
//! than `max_staleness` versions, prioritised replay mixes earlier steps back in, and `mix` adds expert rows.
//!
//! Checkpoints (`global_step_N/`) hold the policy as a Hugging Face directory (`hf/`), the optimizer state
//! (`trainer/`) and `meta.json` ([`Meta`]); a resumed trainer reloads all three. A LoRA run (`model.lora_configs`)
//! also writes its adapter as a PEFT directory (`lora_adapter/`, [`crate::lora`]) and resumes from that on top of
//! the base model, while `hf/` holds the merged weights. KL terms are measured against the
//! base model (`model.model_path`) for the whole run, never the checkpoint.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::Kind;
use trinity_buffer::difficulty_estimator::DifficultyEstimator;
use trinity_buffer::{Experience, ReplayBuffer, ReplayTake, SchedulerState};
use trinity_checkpoint::{Checkpoint, CheckpointDir};
use trinity_config::Config;
use trinity_model::{ChatTemplate, LoraSpec, Tokenizer, save_hf_parts};
use trinity_monitor::Metrics;
use trinity_trainer::{Components, StartingModels, TrainRow, Trainer as TrainEngine, TrainerOptions};

use crate::data_parallel::{Header, Leader};
use crate::error::RftError;
use crate::lora::{self, LORA_ADAPTER_DIR};
use crate::mix_strategy::ExpertData;
use crate::models::{self, on_pool};

/// `meta.json` of a checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Meta {
    pub train_step: u64,
    pub syncs: u64,
    /// The explorer's taskset position after the explore step this train step trained (mode `both`); absent in
    /// modes where the trainer runs without an explorer.
    #[serde(default)]
    pub scheduler: Option<SchedulerState>,
    /// The `difficulty_based` selectors' pass-rate beliefs, per taskset (absent in older checkpoints).
    #[serde(default)]
    pub beliefs: Vec<Option<DifficultyEstimator>>,
    /// Rows of the training dataset served so far (SFT and DPO in mode `train`).
    #[serde(default)]
    pub dataset_rows: Option<usize>,
    /// The explore steps made when the checkpoint was written, where they are not the train steps (mode `both`
    /// reading fixed-size batches, [`trinity_config::fixed_size_train_batch`]): the explorer continues after them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explored: Option<u64>,
}

/// The trainer of a run.
pub(crate) struct Trainer {
    engine: TrainEngine,
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    eos_token_ids: Vec<i64>,
    checkpoints: CheckpointDir,
    max_checkpoints_to_keep: Option<u32>,
    expert: Option<ExpertData>,
    replay: Option<ReplayBuffer>,
    staleness: Option<u64>,
    total_steps: u64,
    threads: usize,
    /// Rank 0 of a data-parallel run: announces each step to the other ranks and shares its rows.
    leader: Option<Arc<Leader>>,
    /// The adapters' settings when the run trains LoRA adapters (saved beside each checkpoint).
    lora: Option<LoraSpec>,
    /// `model.model_path`, named in a saved adapter's config as its base model.
    base_model: String,
}

/// Rank 0's part in a data-parallel run ([`crate::data_parallel`]): the channel to the other ranks and the
/// trainers' process group.
#[derive(Debug)]
pub(crate) struct Rank0 {
    pub leader: Arc<Leader>,
    pub group: trinity_collective::ProcessGroup,
    /// This rank's device (`cuda:LOCAL_RANK` or the CPU), which the mode's models go on.
    pub device: tch::Device,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer").field("total_steps", &self.total_steps).finish_non_exhaustive()
    }
}

/// A trainer and the checkpoint it resumed from.
#[derive(Debug)]
pub(crate) struct Started {
    pub trainer: Trainer,
    pub resumed: Option<(Checkpoint, Meta)>,
}

impl Trainer {
    /// Loads the policy (from the latest checkpoint under `job_dir` when `continue_from_checkpoint` and one
    /// exists, else `model.model_path`), the reference model and critic the algorithm needs, and the sample
    /// strategy's state. `plan` gives the run's length as the mode knows it, once the tokenizer is loaded (a
    /// dataset's length needs it) and the steps already trained are known; `mix` shortens it to what its expert
    /// rows can feed ([`Trainer::total_steps`]). With `dp` this is rank 0 of a data-parallel run: the other ranks
    /// learn the run's length and resume step, then take this trainer's state.
    pub(crate) fn start(
        config: &Config,
        job_dir: &Path,
        device: tch::Device,
        threads: usize,
        plan: impl FnOnce(&Tokenizer, Option<&ChatTemplate>, u64) -> Result<u64, RftError>,
        dp: Option<Rank0>,
    ) -> Result<Started, RftError> {
        let checkpoints = CheckpointDir::open(job_dir)?;
        let latest = if config.continue_from_checkpoint { intact_latest(&checkpoints)? } else { None };
        let resumed = match latest {
            Some(checkpoint) => {
                tracing::info!("resuming from {}", checkpoint.path.display());
                let meta: Meta = checkpoint.meta()?;
                Some((checkpoint, meta))
            }
            None => None,
        };
        // A LoRA run trains adapters on the base model, so it always loads the base and takes a checkpoint's
        // adapter from `lora_adapter/`; a full fine-tune resumes from the checkpoint's weights.
        let model_path = match (&resumed, config.model.lora()) {
            (Some((checkpoint, _)), None) => checkpoint.path.join("hf"),
            _ => PathBuf::from(&config.model.model_path),
        };
        let kind = models::trainer_kind(&config.trainer.dtype, device);
        tracing::info!(
            "training precision: {}",
            if kind == Kind::Float { "fp32" } else { "bf16 compute, fp32 master weights" }
        );
        let mut policy = models::load(&model_path, kind, device, threads)?;
        let resumed_adapter = resumed.as_ref().map(|(checkpoint, _)| checkpoint.path.join(LORA_ADAPTER_DIR));
        let lora = on_pool(threads, || lora::attach(config, &mut policy.decoder, resumed_adapter.as_deref()))?;
        let chat_template = models::chat_template(config, &mut policy)?;
        let tokenizer = policy.tokenizer.clone();
        let eos_token_ids = policy.eos_token_ids.clone();

        let trained = resumed.as_ref().map_or(0, |(_, meta)| meta.train_step);
        let expert = ExpertData::from_config(config, &tokenizer, chat_template.as_ref(), trained)?;
        let mut total_steps = plan(&tokenizer, chat_template.as_ref(), trained)?;
        if let Some(expert) = &expert
            && trained + expert.steps_left() < total_steps
        {
            total_steps = trained + expert.steps_left();
            tracing::warn!("the expert rows last for {total_steps} train steps: the run stops there");
        }
        let components = Components::from_config(&config.algorithm)?;
        let options = TrainerOptions { total_steps: Some(total_steps), ..TrainerOptions::from_config(config) };
        let vocab = policy.decoder.config().vocab_size;
        let models = starting_models(config, &components, resumed.is_some(), (kind, device, vocab), threads)?;
        let decoder = policy.decoder;
        let optimizer = &config.algorithm.optimizer;
        let mut engine =
            on_pool(threads, move || TrainEngine::with_models(decoder, models, components, optimizer, options))?;
        let leader = match dp {
            Some(Rank0 { leader, group, .. }) => {
                leader.header(Header { total_steps, resumed_step: resumed.as_ref().map(|(_, m)| m.train_step) })?;
                engine = on_pool(threads, move || engine.with_process_group(group))?;
                Some(leader)
            }
            None => None,
        };
        if let Some((checkpoint, meta)) = &resumed {
            engine.load_state(&checkpoint.path.join("trainer"), meta.train_step)?;
        }
        let experience_buffer = config.buffer.trainer_input.experience_buffer.clone().unwrap_or_default();
        let replay = match experience_buffer.replay_buffer.enable {
            true => Some(ReplayBuffer::from_config(
                &experience_buffer.replay_buffer,
                experience_buffer.capacity,
                config.explorer.rollout_model.seed,
            )?),
            false => None,
        };
        let trainer = Trainer {
            engine,
            tokenizer,
            chat_template,
            eos_token_ids,
            checkpoints,
            max_checkpoints_to_keep: config.trainer.max_checkpoints_to_keep,
            expert,
            replay,
            staleness: max_staleness(config),
            total_steps,
            threads,
            leader,
            lora,
            base_model: config.model.model_path.clone(),
        };
        Ok(Started { trainer, resumed })
    }

    /// Train steps the run makes in all (the planned length, or fewer when `mix`'s expert rows run out).
    pub(crate) fn total_steps(&self) -> u64 {
        self.total_steps
    }

    /// Sample strategy `staleness_control`: train step `step` keeps only experiences sampled with model version
    /// `step − max_staleness` or newer (Trinity-RFT's `min_model_version`).
    pub(crate) fn min_model_version(&self, step: u64) -> Option<u64> {
        self.staleness.map(|max| step.saturating_sub(max))
    }

    /// Trains step `step` on `batch` after the sample strategy (staleness, replay, expert rows); returns the tokens
    /// trained. Metrics go under `train/`, `buffer/` and `replay/`.
    pub(crate) fn train_experiences(
        &mut self,
        step: u64,
        mut batch: Vec<Experience>,
        metrics: &mut Metrics,
    ) -> Result<usize, RftError> {
        let min_version = self.min_model_version(step);
        if let Some(replay) = &mut self.replay {
            batch = draw_replay(replay, batch, step, min_version, metrics)?;
        } else if let Some(min_version) = min_version {
            let before = batch.len();
            batch.retain(|e| e.model_version >= min_version);
            metrics.insert("buffer/stale_dropped".into(), (before - batch.len()) as f64);
        }
        if let Some(oldest) = batch.iter().map(|e| e.model_version).min() {
            metrics.insert("buffer/oldest_model_version".into(), oldest as f64);
        }
        let mut rows: Vec<TrainRow> = batch.iter().map(train_row).collect();
        if let Some(expert) = &mut self.expert {
            rows.extend(expert.rows_for(step)?);
        }
        self.train_rows(step, &rows, metrics)
    }

    /// Trains step `step` on `rows` (one or more optimizer steps, as `ppo_epochs` and mini-batches say); returns the
    /// tokens trained. A step whose rows have no trained token is skipped with a warning.
    pub(crate) fn train_rows(
        &mut self,
        step: u64,
        rows: &[TrainRow],
        metrics: &mut Metrics,
    ) -> Result<usize, RftError> {
        let started = Instant::now();
        let mut tokens = 0;
        if rows.iter().any(|r| r.action_mask.contains(&true)) {
            tokens = rows.iter().map(|r| r.tokens.len()).sum();
            let world = self.engine.world_size();
            let failed = |e: trinity_trainer::TrainerError| match world {
                1 => RftError::Trainer(e),
                _ => RftError::DataParallel(format!("train step {step} across {world} ranks: {e}")),
            };
            let rows = match (&self.leader, self.engine.process_group()) {
                (Some(leader), Some(group)) => {
                    leader.train(step)?;
                    Cow::Owned(trinity_trainer::share_rows(group, 0, Some(rows)).map_err(failed)?)
                }
                _ => Cow::Borrowed(rows),
            };
            let engine = &mut self.engine;
            let step_metrics = on_pool(self.threads, || engine.train_step(&rows)).map_err(failed)?;
            // The engine reports veRL's `actor/...` names; the run's metrics are `train/...` (pg_loss, kl_loss,
            // entropy, grad_norm, lr, ...).
            metrics.extend(
                step_metrics.into_iter().map(|(k, v)| (format!("train/{}", k.strip_prefix("actor/").unwrap_or(&k)), v)),
            );
        } else if rows.is_empty() {
            tracing::warn!("train step {step} skipped: it has no experience (every group was dropped)");
        } else {
            // Every row is a masked placeholder (prompts over the limit): there is no token to train on.
            tracing::warn!("train step {step} skipped: none of its {} experiences has a trained token", rows.len());
        }
        let seconds = started.elapsed().as_secs_f64();
        metrics.insert("time/train_s".into(), seconds);
        metrics.insert("perf/train_tokens_per_s".into(), tokens as f64 / seconds.max(1e-9));
        Ok(tokens)
    }

    /// The policy's parameters by HF name, all at once (shallow handles: valid until the next train step changes
    /// them). With LoRA these are the base weights with the adapters merged in (new tensors), which the rollout
    /// engine then generates with: one path for every `sync_method`, and an engine that needs no adapter support.
    /// Under ZeRO stage 3 they are copies gathered from the ranks' shards (the other ranks join on rank 0's
    /// command), the model whole once on this rank: a weight sync takes them part by part instead
    /// ([`Trainer::weight_parts`]).
    pub(crate) fn weights(&self) -> Result<Vec<(String, tch::Tensor)>, RftError> {
        let mut out = Vec::new();
        let collected = self.weight_parts(|part| -> Result<(), std::convert::Infallible> {
            out.extend(part);
            Ok(())
        })?;
        let Ok(()) = collected;
        Ok(out)
    }

    /// The names, dtypes and shapes [`Trainer::weight_parts`] hands out, in its order.
    pub(crate) fn weight_layout(&self) -> Result<Vec<trinity_model::TensorSpec>, RftError> {
        Ok(self.engine.policy_layout()?)
    }

    /// Hands the policy's weights to `consume` part by part ([`trinity_trainer::Trainer::policy_parts`]): all of
    /// them in one part, or under ZeRO stage 3 one decoder layer at a time as the ranks gather it (they join on
    /// rank 0's command), so a weight sync never holds a second whole model here. `consume`'s first error is the
    /// inner result; the gathers still end on every rank.
    pub(crate) fn weight_parts<E>(
        &self,
        consume: impl FnMut(Vec<(String, tch::Tensor)>) -> Result<(), E>,
    ) -> Result<Result<(), E>, RftError> {
        if let Some(leader) = &self.leader
            && self.engine.fully_sharded()
        {
            leader.weights()?;
        }
        let engine = &self.engine;
        engine.policy_parts(consume).map_err(|e| match engine.world_size() {
            1 => RftError::Trainer(e),
            world => RftError::DataParallel(format!("gather the policy's weights across {world} ranks: {e}")),
        })
    }

    /// Writes checkpoint `global_step_<step>` with `meta`, then prunes to `max_checkpoints_to_keep`.
    pub(crate) fn save(&mut self, meta: &Meta) -> Result<(), RftError> {
        let (engine, tokenizer, template, eos) =
            (&self.engine, &self.tokenizer, self.chat_template.as_ref(), &self.eos_token_ids);
        let (lora, base_model) = (self.lora.as_ref(), self.base_model.as_str());
        if let Some(leader) = &self.leader {
            leader.save(meta.train_step)?;
        }
        self.checkpoints.save(meta.train_step, meta, |dir| {
            // `hf/` holds the adapted model (adapters merged) so that evaluation, later stages and conversion
            // read a checkpoint the same way with or without LoRA; `lora_adapter/` is what training resumes from.
            // Under ZeRO stage 3 the parameters are gathered into the policy for the export (the other ranks join
            // through `share_state_for_save`) and freed after.
            engine
                .with_whole_policy(|policy| save_hf_parts(policy, tokenizer, template, eos, &dir.join("hf")))
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            if let Some(spec) = lora {
                engine.policy().save_lora(&dir.join(LORA_ADAPTER_DIR), spec, base_model).map_err(|e| e.to_string())?;
            }
            let state = dir.join("trainer");
            std::fs::create_dir_all(&state).map_err(|e| e.to_string())?;
            engine.save_state(&state).map_err(|e| e.to_string())
        })?;
        // 0 keeps every checkpoint (Trinity-RFT 0.6.0's and veRL's meaning).
        if let Some(keep) = self.max_checkpoints_to_keep.filter(|&keep| keep > 0) {
            self.checkpoints.prune(keep as usize)?;
        }
        Ok(())
    }
}

/// The training engine of a data-parallel rank other than 0 ([`crate::data_parallel`]): built from the config as
/// rank 0 builds its own, from `model.model_path` (rank 0's state, a checkpoint's too, arrives by broadcast), for
/// `total_steps` steps, and joined to `group`.
pub(crate) fn follower_engine(
    config: &Config,
    device: tch::Device,
    threads: usize,
    total_steps: u64,
    group: trinity_collective::ProcessGroup,
) -> Result<TrainEngine, RftError> {
    let kind = models::trainer_kind(&config.trainer.dtype, device);
    let mut policy = models::load(Path::new(&config.model.model_path), kind, device, threads)?;
    // The adapters' shapes must match rank 0's, whose values then arrive by broadcast.
    on_pool(threads, || lora::attach(config, &mut policy.decoder, None))?;
    let components = Components::from_config(&config.algorithm)?;
    let options = TrainerOptions { total_steps: Some(total_steps), ..TrainerOptions::from_config(config) };
    let vocab = policy.decoder.config().vocab_size;
    let models = starting_models(config, &components, false, (kind, device, vocab), threads)?;
    let decoder = policy.decoder;
    let optimizer = &config.algorithm.optimizer;
    let engine = on_pool(threads, move || {
        TrainEngine::with_models(decoder, models, components, optimizer, options)?.with_process_group(group)
    })?;
    Ok(engine)
}

/// `max_staleness` of sample strategy `staleness_control`; `None` for other strategies or no limit.
/// The checkpoint a resumed run starts from: the newest one whose files verify. Each newer damaged one is set
/// aside (kept, renamed) with a warning naming it, what is wrong with it and where it went, so the run goes on
/// from the last good state instead of failing the same way on every restart.
pub(crate) fn intact_latest(checkpoints: &CheckpointDir) -> Result<Option<Checkpoint>, RftError> {
    let resume = checkpoints.latest_intact()?;
    for skipped in &resume.skipped {
        tracing::warn!(
            "skipping checkpoint global_step_{}: {}; moved to {}",
            skipped.step,
            skipped.error,
            skipped.moved_to.display()
        );
    }
    Ok(resume.checkpoint)
}

fn max_staleness(config: &Config) -> Option<u64> {
    config.algorithm.resolved.sample_strategy.max_staleness()
}

/// The rows train step `step` trains with prioritised replay: the step's experiences enter the replay buffer as one
/// item (Trinity-RFT's `put_batch`), then the step reads as many experiences as came in, by priority: fresh ones
/// first, earlier steps' again once their cooldown has passed and their priority ranks them. When fewer are
/// readable (Trinity's reader would wait, which in one process would wait forever), the step trains on those that
/// are.
fn draw_replay(
    replay: &mut ReplayBuffer,
    fresh: Vec<Experience>,
    step: u64,
    min_version: Option<u64>,
    metrics: &mut Metrics,
) -> Result<Vec<Experience>, RftError> {
    let wanted = fresh.len();
    let now = Instant::now();
    replay.put(fresh, now)?;
    let batch = match replay.take(wanted, now, min_version) {
        ReplayTake::Batch(batch) => batch,
        ReplayTake::Short { available, .. } => {
            tracing::warn!(
                "train step {step}: replay has {available} of {wanted} experiences readable; training on those"
            );
            match replay.take(available, now, min_version) {
                ReplayTake::Batch(batch) => batch,
                ReplayTake::Short { .. } => Vec::new(),
            }
        }
    };
    let reused = batch.iter().filter(|e| e.info.get("use_count").and_then(serde_json::Value::as_u64) > Some(1)).count();
    let stats = replay.stats();
    metrics.insert("replay/reused_experiences".into(), reused as f64);
    metrics.insert("replay/queued_items".into(), replay.queued_items() as f64);
    metrics.insert("replay/items_evicted".into(), stats.items_evicted as f64);
    Ok(batch)
}

/// The trainer's view of an experience.
pub(crate) fn train_row(experience: &Experience) -> TrainRow {
    TrainRow {
        tokens: experience.tokens.iter().map(|&t| i64::from(t)).collect(),
        prompt_length: experience.prompt_length,
        action_mask: experience.action_mask.clone(),
        logprobs: experience.logprobs.clone(),
        reward: Some(experience.reward as f32),
        token_level_rewards: experience.token_level_rewards.clone(),
        advantages: experience.advantages.clone(),
        teacher_logprobs: experience.teacher_logprobs.clone(),
        expert: false,
        group_id: Some(experience.eid.tid()),
        run_id: Some(format!("{}/{}", experience.eid.tid(), experience.eid.run)),
        step: Some(experience.eid.batch as i64),
        routed_experts: experience.routed_experts.as_ref().map(|r| trinity_trainer::RoutedExperts {
            layers: r.layers,
            top_k: r.top_k,
            ids: r.ids.clone(),
        }),
    }
}

/// The reference model and critic backbone the trainer starts from, where copying the policy would be wrong.
///
/// KL terms are measured against the base model (`model.model_path`) for the whole run: a resumed run's policy
/// comes from its checkpoint, so the base model is loaded for the reference (a fresh run's policy is the base
/// model, and copying it saves a load). The critic starts from `model.critic_model_path` when that names another
/// model; on resume its trained weights then come from the checkpoint's trainer state.
fn starting_models(
    config: &Config,
    components: &Components,
    resuming: bool,
    (kind, device, vocab): (Kind, tch::Device, i64),
    threads: usize,
) -> Result<StartingModels, RftError> {
    let load = |path: &Path, kind: Kind| models::load(path, kind, device, threads).map(|m| m.decoder);
    let base = Path::new(&config.model.model_path);
    // A LoRA policy's base weights are never trained: they are the reference (scored with the adapters off).
    let reference = if components.needs_reference() && resuming && config.model.lora().is_none() {
        tracing::info!("reference model: {} (the base model, not the checkpoint)", base.display());
        Some(load(base, kind)?)
    } else {
        None
    };
    let critic_path = Path::new(&config.model.critic_model_path);
    let critic = if components.use_critic && !critic_path.as_os_str().is_empty() && critic_path != base {
        tracing::info!("critic starts from {}", critic_path.display());
        let critic = load(critic_path, Kind::Float)?;
        // The critic scores the policy's token ids, so it must read the same vocabulary.
        if critic.config().vocab_size != vocab {
            return Err(RftError::Setting {
                key: "model.critic_model_path",
                message: format!(
                    "{} has a vocabulary of {} tokens, the policy's has {vocab}; the critic must use the policy's \
                     tokenizer",
                    critic_path.display(),
                    critic.config().vocab_size
                ),
            });
        }
        Some(critic)
    } else {
        None
    };
    Ok(StartingModels { reference, critic })
}
