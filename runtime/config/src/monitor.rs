//! `monitor:` and `log:` — where metrics and logs go.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Metric sinks. `metrics.jsonl` is always written; `monitor_type` adds one more sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MonitorConfig {
    /// `tensorboard` (event files), `csv`, or `jsonl` (only metrics.jsonl).
    pub monitor_type: String,
    /// Arguments of the monitor.
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
