//! The root of a config file.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::algorithm::AlgorithmConfig;
use crate::buffer::BufferConfig;
use crate::explorer::ExplorerConfig;
use crate::model::{ClusterConfig, ModelConfig};
use crate::monitor::{LogConfig, MonitorConfig};
use crate::synchronizer::SynchronizerConfig;
use crate::trainer::TrainerConfig;

/// A Trinity-RFT configuration: same keys, same meaning, same defaults where they are sane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// What to run: `both` (explore and train in one process), `explore`, `train`, `bench`, `serve`, `colocate`.
    pub mode: Mode,
    /// Project name; the second level of the checkpoint directory.
    pub project: String,
    /// Optional group between project and name in the checkpoint directory.
    pub group: String,
    /// Experiment name; the last level of the checkpoint directory.
    pub name: String,
    /// Root of `<project>/[<group>/]<name>/` where checkpoints, logs, metrics and buffers go; made absolute
    /// against the working directory.
    pub checkpoint_root_dir: String,
    /// Resume from the latest complete checkpoint of this experiment; when false and the experiment directory
    /// is not empty, a timestamp is appended to `name`.
    pub continue_from_checkpoint: bool,
    /// The RL algorithm.
    pub algorithm: AlgorithmConfig,
    /// Experience and task pipelines.
    pub data_processor: DataProcessorConfig,
    /// The policy model.
    pub model: ModelConfig,
    /// The machines.
    pub cluster: ClusterConfig,
    /// Tasksets and experience buffers.
    pub buffer: BufferConfig,
    /// The explorer.
    pub explorer: ExplorerConfig,
    /// The trainer.
    pub trainer: TrainerConfig,
    /// Metric sinks.
    pub monitor: MonitorConfig,
    /// Weight synchronisation.
    pub synchronizer: SynchronizerConfig,
    /// Logging.
    pub log: LogConfig,
    /// Stages run in order, each starting from the previous stage's weights (e.g. SFT warm-up, then GRPO).
    pub stages: Vec<StageConfig>,
    /// WASM components and algorithm libraries to load, besides `--plugin`.
    pub plugins: Vec<PluginEntry>,
    /// Trinity-RFT's Ray namespace.
    pub ray_namespace: Option<String>,
    /// Silences Trinity-RFT's GPU-memory estimator.
    pub ignore_validator_suggestions: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::Both,
            project: "Trinity-RFT".to_owned(),
            group: String::new(),
            name: "rft".to_owned(),
            checkpoint_root_dir: "checkpoints".to_owned(),
            continue_from_checkpoint: true,
            algorithm: AlgorithmConfig::default(),
            data_processor: DataProcessorConfig::default(),
            model: ModelConfig::default(),
            cluster: ClusterConfig::default(),
            buffer: BufferConfig::default(),
            explorer: ExplorerConfig::default(),
            trainer: TrainerConfig::default(),
            monitor: MonitorConfig::default(),
            synchronizer: SynchronizerConfig::default(),
            log: LogConfig::default(),
            stages: Vec::new(),
            plugins: Vec::new(),
            ray_namespace: None,
            ignore_validator_suggestions: false,
        }
    }
}

/// Run modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Explorer and trainer in one process, synchronised every `sync_interval` steps.
    Both,
    /// Only the explorer: experiences go to a shared database buffer (`sqlite:///`, `postgresql://`) that a
    /// `train` process reads; new weights come from the trainer's checkpoints (asynchronous RL).
    Explore,
    /// Only the trainer: reads the shared buffer the explorers fill, or an SFT / DPO dataset.
    Train,
    /// Evaluate the base model (`explorer.eval_on_startup`) and every `global_step_N` checkpoint of this experiment
    /// on the eval tasksets (only the latest with `explorer.bench_on_latest_checkpoint`).
    Bench,
    /// Serve the rollout model over an OpenAI-compatible API and record experiences.
    Serve,
    /// Explorer and trainer sharing one device (what `both` does on one device).
    Colocate,
}

impl Mode {
    /// The name configs use.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Both => "both",
            Mode::Explore => "explore",
            Mode::Train => "train",
            Mode::Bench => "bench",
            Mode::Serve => "serve",
            Mode::Colocate => "colocate",
        }
    }
}

/// `data_processor:` — pipelines over experiences.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DataProcessorConfig {
    /// Operators applied to experiences between explorer and trainer.
    pub experience_pipeline: ExperiencePipelineConfig,
}

/// Experience operators, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ExperiencePipelineConfig {
    /// Operators applied in order; each names a registered operator.
    pub operators: Vec<OperatorConfig>,
    /// Keep a copy of the pipeline's input experiences.
    pub save_input: bool,
    /// Where that copy goes (`.jsonl` or `sqlite:///`); unset means the run's buffer directory.
    pub input_save_path: Option<String>,
}

impl Default for ExperiencePipelineConfig {
    fn default() -> Self {
        ExperiencePipelineConfig { operators: Vec::new(), save_input: true, input_save_path: None }
    }
}

/// One operator of the experience pipeline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OperatorConfig {
    /// Registered operator name.
    pub name: String,
    /// Arguments of the operator.
    pub args: Map<String, Value>,
}

/// One stage of a multi-stage run. A section given here replaces the whole top-level section (what it leaves out
/// takes the default, not the top-level value); each stage starts from the previous stage's final weights.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct StageConfig {
    /// Stage name; the stage's experiment name is `<name>/<stage_name>`.
    pub stage_name: String,
    /// Mode of this stage.
    pub mode: Option<Mode>,
    /// Algorithm of this stage.
    pub algorithm: Option<AlgorithmConfig>,
    /// Buffer of this stage.
    pub buffer: Option<BufferConfig>,
    /// Pipelines of this stage.
    pub data_processor: Option<DataProcessorConfig>,
    /// Explorer of this stage.
    pub explorer: Option<ExplorerConfig>,
    /// Trainer of this stage.
    pub trainer: Option<TrainerConfig>,
}

/// A plugin file to load: a path, or a path with options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum PluginEntry {
    /// Path of a `.wasm` component or an algorithm library.
    Path(String),
    /// Path with options.
    Detailed(PluginSpec),
}

/// A plugin file with options. The sandbox keys (`allow_dir`, `max_memory_mib`, `timeout_s`, `max_model_calls`,
/// `max_model_tokens`) apply to WASM plugins; given for a native algorithm library, they are refused, since native
/// code runs unsandboxed in trinity's process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PluginSpec {
    /// Path of a `.wasm` component or an algorithm library.
    pub path: String,
    /// Let this plugin's names replace built-ins of the same name.
    #[serde(default)]
    pub override_builtin: bool,
    /// A directory the plugin may read (read-only), mounted at `/data` inside the sandbox; none by default.
    #[serde(default)]
    pub allow_dir: Option<String>,
    /// Most memory one plugin instance may use, all its linear memories and tables together, in MiB; a larger
    /// allocation traps the plugin (default 512).
    #[serde(default)]
    pub max_memory_mib: Option<u64>,
    /// Longest one plugin call may run, in seconds (workflows: the plugin's own time, not the model's);
    /// default 60.
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// Workflow plugins: most model requests (`chat` / `generate` calls) one task run may make; the request past
    /// it fails the task (default 1024). Waiting for the model does not count toward `timeout_s`, so this is what
    /// stops a workflow that keeps the engine busy without end.
    #[serde(default)]
    pub max_model_calls: Option<u32>,
    /// Workflow plugins: most tokens the model may generate for one task run, over all its requests and samples
    /// (default 4194304: 8 rollouts of 128 turns of 4096 tokens).
    #[serde(default)]
    pub max_model_tokens: Option<u64>,
}

impl PluginEntry {
    /// The plugin's path, whichever form the entry has.
    pub fn spec(&self) -> PluginSpec {
        match self {
            PluginEntry::Path(path) => PluginSpec {
                path: path.clone(),
                override_builtin: false,
                allow_dir: None,
                max_memory_mib: None,
                timeout_s: None,
                max_model_calls: None,
                max_model_tokens: None,
            },
            PluginEntry::Detailed(spec) => spec.clone(),
        }
    }
}
