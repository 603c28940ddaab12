//! `monitor:` and `log:` — where metrics and logs go.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Metric sinks. `metrics.jsonl` is always written; `monitor_type` adds one more sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MonitorConfig {
    /// `tensorboard` (event files), `csv`, `jsonl` (only metrics.jsonl), or a hosted service through its official
    /// Python client (`TRINITY_PYTHON` or `python3`): `wandb`, `mlflow`, `swanlab`.
    pub monitor_type: String,
    /// Arguments of a hosted monitor, as Trinity-RFT reads them: wandb `base_url`, `api_key`; mlflow `uri`
    /// (default `http://localhost:5000`), `username`, `password`; swanlab `mode` (default `cloud`), `logdir`,
    /// `tags`, `experiment_name`, `workspace`, `description`, `settings`, `id`, `resume`, `reinit`.
    pub monitor_args: Map<String, Value>,
    /// Also record per-taskset and per-component statistics.
    pub detailed_stats: bool,
    /// Ray's timeline trace of the run.
    pub enable_ray_timeline: bool,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            monitor_type: "tensorboard".to_owned(),
            monitor_args: Map::new(),
            detailed_stats: false,
            enable_ray_timeline: false,
        }
    }
}

/// The `monitor_args` keys each hosted monitor reads, with the JSON type each takes (`null` is always accepted:
/// Trinity-RFT's defaults are nulls), as Trinity-RFT 0.6.0's `trinity/utils/monitor.py` reads them.
pub const MONITOR_ARGS: &[(&str, &[(&str, ArgKind)])] = &[
    ("wandb", &[("base_url", ArgKind::Text), ("api_key", ArgKind::Text)]),
    ("mlflow", &[("uri", ArgKind::Text), ("username", ArgKind::Text), ("password", ArgKind::Text)]),
    (
        "swanlab",
        &[
            ("mode", ArgKind::Text),
            ("logdir", ArgKind::Text),
            ("tags", ArgKind::TextList),
            ("experiment_name", ArgKind::Text),
            ("workspace", ArgKind::Text),
            ("description", ArgKind::Text),
            ("settings", ArgKind::Object),
            ("id", ArgKind::Text),
            ("resume", ArgKind::TextOrBool),
            ("reinit", ArgKind::Bool),
        ],
    ),
];

/// The JSON type of a `monitor_args` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    Text,
    TextList,
    Object,
    Bool,
    TextOrBool,
}

impl ArgKind {
    /// Whether `value` has this type (or is `null`).
    pub fn accepts(self, value: &Value) -> bool {
        match (self, value) {
            (_, Value::Null) => true,
            (ArgKind::Text | ArgKind::TextOrBool, Value::String(_)) => true,
            (ArgKind::Bool | ArgKind::TextOrBool, Value::Bool(_)) => true,
            (ArgKind::TextList, Value::Array(items)) => items.iter().all(Value::is_string),
            (ArgKind::Object, Value::Object(_)) => true,
            _ => false,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            ArgKind::Text => "a string",
            ArgKind::TextList => "a list of strings",
            ArgKind::Object => "a mapping",
            ArgKind::Bool => "true or false",
            ArgKind::TextOrBool => "a string or true/false",
        }
    }
}

/// Logging.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `DEBUG`, `INFO`, `WARNING` or `ERROR`; `--log-level` and `RUST_LOG` take precedence.
    pub level: String,
    /// Trinity-RFT writes one log folder per node.
    pub group_by_node: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { level: "INFO".to_owned(), group_by_node: false }
    }
}
