//! `stages`: a multi-stage run (an SFT warm-up, then RL), each stage resolved as Trinity-RFT resolves it.
//!
//! A stage's config is the top-level config *as written*, with every section the stage sets (`mode`,
//! `algorithm`, `buffer`, `data_processor`, `explorer`, `trainer`) replacing the top-level section whole: what
//! the stage's section leaves out takes the schema default, not the top-level value (so the SFT stage of
//! Trinity-RFT's `examples/grpo_gsm8k/gsm8k.yaml` runs at the default lr, not the top-level one). Its `name` is
//! `<name>/<stage_name>` and it always writes Hugging Face weights at its end (`save_hf_checkpoint: last`), which
//! the next stage starts from.
//!
//! Each stage is resolved on its own from the config as written, never from the resolved top level: resolution
//! derives values from other keys (`train_batch_size` from `batch_size × repeat_times`, sync corrections from
//! the algorithm, component arguments from the preset), and a stage with its own algorithm must derive them
//! again. The run replaces a stage's `model.model_path` with the previous stage's checkpoint; it calls
//! [`Loaded::stage_with_model_path`], which resolves the stage again with that path, as Trinity-RFT's launcher
//! does (only `model.critic_model_path`, when unset, derives from it today; re-resolving keeps that true
//! whatever is added later).

use std::path::Path;

use crate::Loaded;
use crate::catalog::Catalog;
use crate::config::Config;
use crate::error::ConfigErrors;
use crate::resolve::{Note, Resolver};
use crate::source::Source;

/// One stage of a multi-stage run, resolved.
#[derive(Debug, Clone)]
pub struct Stage {
    /// Position in `stages` (errors and notes name `stages[<index>]`).
    pub index: usize,
    /// `stage_name`.
    pub name: String,
    /// The config the stage runs with, fully resolved (its `name` is `<name>/<stage_name>`).
    pub config: Config,
    /// What resolving this stage corrected or mapped, each starting with `stages[<index>] (<name>)`; log them
    /// when the stage starts.
    pub notes: Vec<Note>,
    pub(crate) scope: Scope,
}

/// Where the config being checked sits, so messages name the key a user would look for: the top level, or a
/// stage (keys prefixed `stages[i].`, with a hint when the stage keeps a top-level section).
#[derive(Debug, Clone, Default)]
pub(crate) struct Scope {
    stage: Option<StageScope>,
}

#[derive(Debug, Clone)]
struct StageScope {
    index: usize,
    name: String,
    /// The sections the stage sets; every other section comes from the top level.
    sets: Vec<&'static str>,
}

impl Scope {
    /// The top level of the config.
    pub(crate) fn top() -> Scope {
        Scope::default()
    }

    fn stage(config: &Config, index: usize) -> Scope {
        let Some(stage) = config.stages.get(index) else {
            return Scope::top();
        };
        let sets = [
            ("mode", stage.mode.is_some()),
            ("algorithm", stage.algorithm.is_some()),
            ("buffer", stage.buffer.is_some()),
            ("data_processor", stage.data_processor.is_some()),
            ("explorer", stage.explorer.is_some()),
            ("trainer", stage.trainer.is_some()),
        ]
        .into_iter()
        .filter_map(|(section, set)| set.then_some(section))
        .collect();
        Scope { stage: Some(StageScope { index, name: stage.stage_name.clone(), sets }) }
    }

    /// `key` as the user finds it in the file: `stages[i].key` inside a stage.
    pub(crate) fn key(&self, key: &str) -> String {
        match &self.stage {
            Some(stage) => format!("stages[{}].{key}", stage.index),
            None => key.to_owned(),
        }
    }

    /// `message`, plus, inside a stage, which stage it is and where a section the stage does not set comes from.
    pub(crate) fn explain(&self, key: &str, message: String) -> String {
        let Some(stage) = &self.stage else {
            return message;
        };
        let section = key.split(['.', '[']).next().unwrap_or(key);
        if stage.sets.contains(&section) {
            format!("{message} (stage `{}`)", stage.name)
        } else {
            format!("{message} (stage `{}` does not set `{section}`, so it uses the top-level one)", stage.name)
        }
    }

    /// The key a value of this scope's config is written at in the file: inside a stage, `stages[i].key` when the
    /// stage sets the key's section (which replaces the top-level one whole), else the top-level `key`.
    pub(crate) fn file_key(&self, key: &str) -> String {
        let section = key.split(['.', '[']).next().unwrap_or(key);
        match &self.stage {
            Some(stage) if stage.sets.contains(&section) => format!("stages[{}].{key}", stage.index),
            _ => key.to_owned(),
        }
    }

    fn note_prefix(&self) -> String {
        match &self.stage {
            Some(stage) => format!("stages[{}] ({}): ", stage.index, stage.name),
            None => String::new(),
        }
    }
}

/// The config stage `index` runs with, before resolution: `config` (as written) with the sections the stage
/// sets replacing the top-level ones whole. Out of range: `config` without its stages.
pub fn stage_config(config: &Config, index: usize) -> Config {
    let mut staged = config.clone();
    staged.stages = Vec::new();
    let Some(stage) = config.stages.get(index) else {
        return staged;
    };
    staged.name = format!("{}/{}", config.name, stage.stage_name);
    staged.trainer.save_hf_checkpoint = "last".to_owned();
    if let Some(mode) = stage.mode {
        staged.mode = mode;
    }
    if let Some(algorithm) = &stage.algorithm {
        staged.algorithm = algorithm.clone();
    }
    if let Some(buffer) = &stage.buffer {
        staged.buffer = buffer.clone();
    }
    if let Some(data_processor) = &stage.data_processor {
        staged.data_processor = data_processor.clone();
    }
    if let Some(explorer) = &stage.explorer {
        staged.explorer = explorer.clone();
    }
    if let Some(trainer) = &stage.trainer {
        staged.trainer = trainer.clone();
        // Trinity-RFT sets it after the replacement too: the next stage starts from these weights.
        staged.trainer.save_hf_checkpoint = "last".to_owned();
    }
    staged
}

/// Resolves every stage of `raw` (the config as written), in order; names must be present and unique. Each
/// stage is resolved even when an earlier one has errors, so that all of them are reported.
pub(crate) fn resolve_stages(
    raw: &Config,
    source: &Source,
    catalog: &dyn Catalog,
    cwd: &Path,
) -> Result<Vec<Stage>, ConfigErrors> {
    let mut top = Resolver::new(source, catalog, cwd, Scope::top());
    let mut stages: Vec<Stage> = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for (index, stage) in raw.stages.iter().enumerate() {
        let key = format!("stages[{index}].stage_name");
        let named = top.check(
            !stage.stage_name.trim().is_empty(),
            &key,
            "a stage needs a name (its experiment is `<name>/<stage_name>`)",
        );
        if named {
            top.check(
                !names.contains(&stage.stage_name.as_str()),
                &key,
                format!(
                    "stage `{}` appears twice; stage names must be unique (each names its own experiment)",
                    stage.stage_name
                ),
            );
        }
        names.push(&stage.stage_name);
        match resolve_stage(raw, index, None, source, catalog, cwd) {
            Ok(resolved) => stages.push(resolved),
            Err(errors) => top.errors.extend(errors),
        }
    }
    match ConfigErrors::new(top.errors) {
        Some(errors) => Err(errors),
        None => Ok(stages),
    }
}

fn resolve_stage(
    raw: &Config,
    index: usize,
    model_path: Option<&str>,
    source: &Source,
    catalog: &dyn Catalog,
    cwd: &Path,
) -> Result<Stage, ConfigErrors> {
    let mut config = stage_config(raw, index);
    if let Some(path) = model_path {
        config.model.model_path = path.to_owned();
    }
    let scope = Scope::stage(raw, index);
    let mut resolver = Resolver::new(source, catalog, cwd, scope.clone());
    resolver.resolve(&mut config)?;
    let prefix = scope.note_prefix();
    let notes = resolver.notes.into_iter().map(|note| format!("{prefix}{note}")).collect();
    let name = raw.stages.get(index).map(|s| s.stage_name.clone()).unwrap_or_default();
    Ok(Stage { index, name, config, notes, scope })
}

impl Loaded {
    /// Stage `index` resolved again with `model.model_path` replaced, as the run starts it from the previous
    /// stage's checkpoint (Trinity-RFT's launcher sets the path, then validates the stage). `catalog` is the one
    /// the config was loaded with.
    pub fn stage_with_model_path(
        &self,
        index: usize,
        model_path: &str,
        catalog: &dyn Catalog,
    ) -> Result<Stage, ConfigErrors> {
        resolve_stage(&self.raw, index, Some(model_path), &self.source, catalog, &self.cwd)
    }

    /// What `--dry-run` prints: the resolved config; with `stages`, one YAML document per stage (what each stage
    /// runs with, in order), each headed by a comment naming the stage. The top level of a staged config is not
    /// printed on its own: only its stages run.
    pub fn dry_run_yaml(&self) -> String {
        if self.stages.is_empty() {
            return self.config.to_yaml();
        }
        let mut out = String::new();
        for stage in &self.stages {
            if stage.index > 0 {
                out.push_str("---\n");
            }
            out.push_str(&format!("# stages[{}]: {}\n", stage.index, stage.name));
            out.push_str(&stage.config.to_yaml());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::catalog::AnyName;
    use crate::synchronizer::SyncMethod;
    use crate::testing::{assert_names, loaded, refusal};
    use crate::{LoadOptions, Loaded, load_str};

    /// Trinity-RFT's `examples/grpo_gsm8k/gsm8k.yaml` with its commented SFT warm-up stage uncommented.
    fn gsm8k_with_stages() -> Loaded {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/trinity-rft-0.5.2/examples/grpo_gsm8k/gsm8k.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let (head, stages) = text.split_at(text.find("# stages:").expect("the example keeps its stages comment"));
        let stages: String = stages.lines().map(|l| format!("{}\n", l.strip_prefix("# ").unwrap_or(l))).collect();
        let env = |var: &str| (var == "TRINITY_SFT_DATASET_PATH").then(|| "/data/sft.jsonl".to_owned());
        let options = LoadOptions { overrides: &[], env: &env, catalog: &AnyName, cwd: Path::new("/work") };
        load_str(&format!("{head}{stages}"), &path, options).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_stage_section_replaces_the_top_level_one_whole_and_derives_again() {
        let loaded = gsm8k_with_stages();
        let [sft, rft] = loaded.stages.as_slice() else { panic!("two stages: {:?}", loaded.stages.len()) };
        assert_eq!((sft.index, sft.name.as_str(), rft.name.as_str()), (0, "sft_warmup", "rft"));
        assert_eq!(sft.config.name, "qwen2.5-1.5B-gsm8k/sft_warmup");
        // The stage's algorithm section replaces the top level's: lr is the default, not the top-level 1e-5.
        assert_eq!(sft.config.algorithm.optimizer.lr, 1e-6);
        assert_eq!(rft.config.algorithm.optimizer.lr, 1e-5);
        assert_eq!(sft.config.algorithm.repeat_times, Some(1));
        assert_eq!(sft.config.buffer.train_batch_size, 128);
        assert_eq!(sft.config.buffer.total_steps, Some(10));
        assert!(sft.config.buffer.explorer_input.tasksets.is_empty(), "the stage's buffer has no taskset");
        // Derived for the stage on its own: SFT syncs by checkpoint every save_interval; RL keeps nccl → memory.
        assert_eq!(sft.config.synchronizer.sync_method, SyncMethod::Checkpoint);
        assert_eq!(sft.config.synchronizer.sync_interval, 100);
        assert_eq!(rft.config.buffer.train_batch_size, 96 * 8);
        assert_eq!(rft.config.trainer.save_hf_checkpoint, "last");
        assert!(sft.notes.iter().all(|n| n.starts_with("stages[0] (sft_warmup): ")), "{:?}", sft.notes);
        assert!(
            sft.notes.iter().any(|n| n.contains("sync_interval is set to trainer.save_interval (100)")),
            "{:?}",
            sft.notes
        );
        loaded.check_runnable().unwrap();
    }

    #[test]
    fn a_stage_resolves_again_from_the_previous_stage_checkpoint() {
        let loaded = gsm8k_with_stages();
        let rft =
            loaded.stage_with_model_path(1, "/ckpt/sft_warmup/global_step_10/actor/huggingface", &AnyName).unwrap();
        assert_eq!(rft.config.model.model_path, "/ckpt/sft_warmup/global_step_10/actor/huggingface");
        assert_eq!(rft.config.model.critic_model_path, rft.config.model.model_path, "the critic follows when unset");
        let mut expected = loaded.stages[1].config.clone();
        expected.model.model_path = rft.config.model.model_path.clone();
        expected.model.critic_model_path = rft.config.model.model_path.clone();
        assert_eq!(rft.config, expected, "nothing else changes");
    }

    #[test]
    fn dry_run_prints_each_stage_as_its_own_document() {
        let text = gsm8k_with_stages().dry_run_yaml();
        let documents: Vec<&str> = text.split("---\n").collect();
        assert_eq!(documents.len(), 2, "{text}");
        assert!(documents[0].starts_with("# stages[0]: sft_warmup\n"), "{text}");
        assert!(documents[1].starts_with("# stages[1]: rft\n"), "{text}");
        assert!(documents[0].contains("name: qwen2.5-1.5B-gsm8k/sft_warmup"), "{text}");
        assert!(!documents[0].contains("stage_name"), "stages are resolved away: {text}");
        let plain = loaded(
            "model:\n  model_path: /m\n  max_model_len: 64\nbuffer:\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n",
        );
        assert_eq!(plain.dry_run_yaml(), plain.config.to_yaml());
    }

    #[test]
    fn stage_names_are_required_and_unique() {
        let base = "model:\n  model_path: /m\n  max_model_len: 64\nbuffer:\n  explorer_input:\n    taskset:\n      \
                    path: /t.jsonl\n";
        assert_names(&refusal(&format!("{base}stages:\n  - mode: both\n")), "stages[0].stage_name", &["needs a name"]);
        let twice = refusal(&format!("{base}stages:\n  - stage_name: a\n  - stage_name: a\n"));
        assert_names(&twice, "stages[1].stage_name", &["appears twice"]);
    }

    #[test]
    fn errors_inside_a_stage_name_the_stage_and_the_section_it_sets() {
        let base = "model:\n  model_path: /m\n  max_model_len: 64\nbuffer:\n  explorer_input:\n    taskset:\n      \
                    path: /t.jsonl\n";
        let error = refusal(&format!("{base}stages:\n  - stage_name: hot\n    algorithm:\n      repeat_times: 0\n"));
        assert_names(&error, "stages[0].algorithm.repeat_times", &["must be at least 1 (stage `hot`)"]);
    }
}
