//! `buffer:` — where tasks come from and where experiences go.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Reads `null` as an empty string.
fn null_as_empty<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(deserializer)?.unwrap_or_default())
}

/// Whether `path` names a database that processes on one or several machines can share: `sqlite:///…`, or
/// PostgreSQL in SQLAlchemy's URL forms as Trinity-RFT configs write them (`postgresql://`, `postgres://`,
/// `postgresql+psycopg2://`, any `+driver`).
pub fn is_database_url(path: &str) -> bool {
    path.starts_with("sqlite:///") || is_postgres_url(path)
}

/// Whether `path` names a PostgreSQL database (see [`is_database_url`]).
pub fn is_postgres_url(path: &str) -> bool {
    let Some((scheme, _)) = path.split_once("://") else {
        return false;
    };
    let base = scheme.split_once('+').map_or(scheme, |(base, _driver)| base);
    matches!(base, "postgresql" | "postgres")
}

/// Batch sizes, epochs and the explorer's and trainer's inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct BufferConfig {
    /// Tasks per explore step (each run `repeat_times` times); not multiplied by `repeat_times`.
    pub batch_size: u32,
    /// Experiences per train step; 0 means `batch_size × repeat_times`.
    pub train_batch_size: u32,
    /// Passes over the taskset.
    pub total_epochs: u32,
    /// Explore steps in all; overrides `total_epochs` when set.
    pub total_steps: Option<u64>,
    /// Tasksets the explorer reads.
    pub explorer_input: ExplorerInput,
    /// Buffers the trainer reads.
    pub trainer_input: TrainerInput,
}

impl Default for BufferConfig {
    fn default() -> Self {
        BufferConfig {
            batch_size: 1,
            train_batch_size: 0,
            total_epochs: 1,
            total_steps: None,
            explorer_input: ExplorerInput::default(),
            trainer_input: TrainerInput::default(),
        }
    }
}

/// The explorer's tasksets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ExplorerInput {
    /// The training taskset (use `tasksets` for several).
    pub taskset: Option<TasksetConfig>,
    /// Several training tasksets, mixed; mutually exclusive with `taskset`.
    pub tasksets: Vec<TasksetConfig>,
    /// Tasksets evaluated every `explorer.eval_interval` steps.
    pub eval_tasksets: Vec<TasksetConfig>,
    /// Workflow of tasksets that name none.
    pub default_workflow_type: Option<String>,
    /// Workflow of eval tasksets that name none; falls back to `default_workflow_type`.
    pub default_eval_workflow_type: Option<String>,
    /// Reward function of tasksets that name none.
    pub default_reward_fn_type: Option<String>,
    /// System prompt of tasksets whose `format` names none.
    pub system_prompt: Option<String>,
    /// Reply prefix of tasksets whose `format` names none.
    pub reply_prefix: Option<String>,
}

/// Where task rows are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StorageType {
    /// A JSONL / JSON / Parquet file or a Hugging Face dataset directory.
    File,
    /// A database: `sqlite:///path` (tasksets, experience buffers) or `postgresql://…` (experience buffers).
    Sql,
    /// A queue of experiences: in memory without a `path`, in a shared database with one (experience buffers
    /// only).
    Queue,
}

/// One taskset: rows, how to read them, and how to roll them out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TasksetConfig {
    /// Name used in metrics (`eval/<name>/accuracy`); empty means `taskset_<i>` / `eval_taskset_<i>`.
    pub name: String,
    /// Storage kind.
    pub storage_type: StorageType,
    /// A file, a dataset directory, or a `sqlite:///` URL. `null` (as Trinity-RFT's templates leave it) is
    /// read as unset, so resolution names the missing path.
    #[serde(deserialize_with = "null_as_empty")]
    pub path: String,
    /// Dataset subset (`<path>/<subset_name>/<split>-*.parquet`).
    pub subset_name: Option<String>,
    /// Dataset split.
    pub split: String,
    /// Which row fields hold the prompt, the answer, the system prompt, ...
    pub format: FormatConfig,
    /// Sampling parameters of rollouts; unset fields come from `model`.
    pub rollout_args: RolloutArgs,
    /// Arguments passed to the workflow.
    pub workflow_args: Map<String, Value>,
    /// Arguments passed to the reward function.
    pub reward_fn_args: Map<String, Value>,
    /// Workflow for this taskset's rows.
    pub default_workflow_type: Option<String>,
    /// Reward function for this taskset's rows.
    pub default_reward_fn_type: Option<String>,
    /// Order in which tasks are drawn.
    pub task_selector: Option<SelectorConfig>,
    /// Order in which tasks are drawn (Trinity-RFT's newer name of `task_selector`).
    pub data_selector: Option<SelectorConfig>,
    /// Rollouts per task for eval tasksets; training tasksets use `algorithm.repeat_times`.
    pub repeat_times: Option<u32>,
    /// Show a progress bar while reading the rows.
    pub enable_progress_bar: bool,
    /// Retries of a failed SQL read.
    pub max_retry_times: u32,
    /// Seconds between SQL read retries.
    pub max_retry_interval: u32,
}

impl Default for TasksetConfig {
    fn default() -> Self {
        TasksetConfig {
            name: String::new(),
            storage_type: StorageType::File,
            path: String::new(),
            subset_name: None,
            split: "train".to_owned(),
            format: FormatConfig::default(),
            rollout_args: RolloutArgs::default(),
            workflow_args: Map::new(),
            reward_fn_args: Map::new(),
            default_workflow_type: None,
            default_reward_fn_type: None,
            task_selector: None,
            data_selector: None,
            repeat_times: None,
            enable_progress_bar: false,
            max_retry_times: 3,
            max_retry_interval: 1,
        }
    }
}

/// How rows map to prompts and answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct FormatConfig {
    /// `messages` (chat rows) or `plaintext` (prompt/response rows), for SFT and DPO data; CPT data
    /// (`algorithm_type: cpt`) must be `plaintext`, as Trinity-RFT's CPT formatter reads no other layout.
    pub prompt_type: PromptType,
    /// Row field with the user prompt; for CPT data, the field with the text to train on.
    pub prompt_key: String,
    /// Row field with the reference answer.
    pub response_key: String,
    /// Row field with a per-row system prompt; wins over `system_prompt`.
    pub system_prompt_key: Option<String>,
    /// System prompt of every row.
    pub system_prompt: Option<String>,
    /// Row field with a message list.
    pub messages_key: String,
    /// Row field with tool definitions.
    pub tools_key: String,
    /// Text that starts the assistant's reply (pre-filled turn).
    pub reply_prefix: Option<String>,
    /// Row field naming a per-row workflow.
    pub workflow_key: String,
    /// Row field naming a per-row reward function.
    pub reward_fn_key: String,
    /// Row field with the preferred response (DPO).
    pub chosen_key: String,
    /// Row field with the rejected response (DPO).
    pub rejected_key: String,
    /// Train on every assistant turn of a multi-turn SFT row, not just the last.
    pub enable_concatenated_multi_turn: bool,
    /// Chat template for this data; unset means `model.custom_chat_template`.
    pub chat_template: Option<String>,
    /// Passed to chat templates that understand it (Qwen3).
    pub enable_thinking: Option<bool>,
}

impl Default for FormatConfig {
    fn default() -> Self {
        FormatConfig {
            prompt_type: PromptType::Messages,
            prompt_key: "prompt".to_owned(),
            response_key: "response".to_owned(),
            system_prompt_key: None,
            system_prompt: None,
            messages_key: "message".to_owned(),
            tools_key: "tools".to_owned(),
            reply_prefix: None,
            workflow_key: String::new(),
            reward_fn_key: String::new(),
            chosen_key: "chosen".to_owned(),
            rejected_key: "rejected".to_owned(),
            enable_concatenated_multi_turn: false,
            chat_template: None,
            enable_thinking: None,
        }
    }
}

/// Row layouts of SFT and DPO data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PromptType {
    /// A list of chat messages.
    Messages,
    /// Separate prompt and response strings.
    Plaintext,
}

/// Sampling parameters of one taskset's rollouts. Unset fields are filled from `model` at resolution.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutArgs {
    /// Softmax temperature; 0 samples greedily. The trainer scales logits by the same value.
    pub temperature: Option<f64>,
    /// Nucleus-sampling mass.
    pub top_p: Option<f64>,
    /// Top-k; -1 disables it.
    pub top_k: Option<i64>,
    /// Minimum probability relative to the most likely token; 0 disables it.
    pub min_p: Option<f64>,
    /// Longest response, in tokens.
    pub max_tokens: Option<u32>,
    /// Shortest response before end-of-sequence may be sampled.
    pub min_tokens: Option<u32>,
    /// Top logprobs besides the sampled token's; above 0 is noted: experiences keep the sampled token's only.
    pub logprobs: Option<u32>,
    /// Samples per task; set from `repeat_times`, do not set it here.
    pub n: Option<u32>,
    /// Seed of the sampler; the same seed and inputs give the same tokens.
    pub seed: Option<u64>,
    /// Strings that end a response (not included in it).
    pub stop: Vec<String>,
}

/// Order in which tasks are drawn from a taskset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SelectorConfig {
    /// `sequential`, `shuffle` (new order every epoch), `random` (with replacement), `difficulty_based` (BOTS) or
    /// `offline_easy2hard` (easiest rows first by `feature_keys`).
    pub selector_type: String,
    /// Seed of `shuffle` and `random`.
    pub seed: u64,
    /// Row fields a selector reads (difficulty-based selection).
    pub feature_keys: Vec<String>,
    /// Extra arguments of the selector.
    pub kwargs: Map<String, Value>,
}

impl Default for SelectorConfig {
    fn default() -> Self {
        SelectorConfig {
            selector_type: "sequential".to_owned(),
            seed: 42,
            feature_keys: Vec::new(),
            kwargs: Map::new(),
        }
    }
}

/// The trainer's inputs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerInput {
    /// The buffer between explorer and trainer; unset means an in-memory queue named `experience_buffer`.
    pub experience_buffer: Option<ExperienceBufferConfig>,
    /// Extra named buffers (e.g. `sft_dataset` for the `mix` algorithm).
    pub auxiliary_buffers: IndexMap<String, ExperienceBufferConfig>,
}

/// A buffer of experiences (or of SFT / DPO rows read from a file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ExperienceBufferConfig {
    /// Name used in file names and logs.
    pub name: String,
    /// `queue` (in memory, or a shared database with a `path`), `sql` (a database) or `file` (rows for SFT / DPO).
    pub storage_type: StorageType,
    /// For a queue or `sql`, a database explorers and trainers share (`sqlite:///file.db` on one machine,
    /// `postgresql://user:password@host:port/db` across machines; modes `explore` and `train` need one), or for a
    /// queue a `.jsonl` file that keeps a copy; for `file`, the rows.
    pub path: Option<String>,
    /// Most experiences held before the explorer waits (back-pressure; up to `synchronizer.sync_timeout`, then the
    /// step fails naming the buffer). In modes `both` / `colocate` it holds up to `sync_offset + 1` explore steps
    /// at once, and the run is refused before it starts when that does not fit.
    pub capacity: u32,
    /// Seconds the trainer waits for a batch before giving up.
    pub max_read_timeout: f64,
    /// Prioritised replay of experiences.
    pub replay_buffer: ReplayBufferConfig,
    /// Dataset split (file inputs).
    pub split: String,
    /// Dataset subset (file inputs).
    pub subset_name: Option<String>,
    /// Which row fields hold what (file inputs).
    pub format: FormatConfig,
    /// Show a progress bar while reading rows (file inputs).
    pub enable_progress_bar: bool,
    /// Row type of the buffer (`experience`, `sft` or `dpo`), derived from the algorithm as Trinity-RFT does (`sft`
    /// for auxiliary SFT data).
    pub schema_type: Option<String>,
    /// Passes over a file input; in mode `train` the main buffer's is `buffer.total_epochs` (Trinity-RFT copies it).
    pub total_epochs: Option<u32>,
    /// Order in which rows of a file input are drawn.
    pub data_selector: Option<SelectorConfig>,
}

impl Default for ExperienceBufferConfig {
    fn default() -> Self {
        ExperienceBufferConfig {
            name: "experience_buffer".to_owned(),
            storage_type: StorageType::Queue,
            path: None,
            capacity: 10000,
            max_read_timeout: 1800.0,
            replay_buffer: ReplayBufferConfig::default(),
            split: "train".to_owned(),
            subset_name: None,
            format: FormatConfig::default(),
            enable_progress_bar: false,
            schema_type: None,
            total_epochs: None,
            data_selector: None,
        }
    }
}

/// Prioritised experience replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayBufferConfig {
    /// Reuse experiences by priority instead of consuming each once.
    pub enable: bool,
    /// Priority function.
    pub priority_fn: String,
    /// Seconds before an experience may be drawn again.
    pub reuse_cooldown_time: Option<f64>,
    /// Arguments of the priority function.
    pub priority_fn_args: Map<String, Value>,
}

impl Default for ReplayBufferConfig {
    fn default() -> Self {
        let mut priority_fn_args = Map::new();
        priority_fn_args.insert("decay".to_owned(), Value::from(2.0));
        ReplayBufferConfig {
            enable: false,
            priority_fn: "linear_decay".to_owned(),
            reuse_cooldown_time: None,
            priority_fn_args,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls_are_sqlite_or_postgres_in_sqlalchemy_forms() {
        for url in
            ["sqlite:///gsm8k.db", "postgresql://u:p@h:5432/db", "postgres://u@h/db", "postgresql+psycopg2://u:p@h/db"]
        {
            assert!(is_database_url(url), "{url}");
        }
        for path in ["buffer.jsonl", "", "sqlite://relative.db", "mysql://u@h/db", "/data/postgresql/x.db"] {
            assert!(!is_database_url(path), "{path}");
        }
    }
}
