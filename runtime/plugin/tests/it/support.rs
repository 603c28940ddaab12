//! Building the plugins the tests load, a tiny model to run workflows against, and a capture of the run log.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use trinity_buffer::{Task, Taskset};
use trinity_config::buffer::{RolloutArgs, TasksetConfig};
use trinity_engine::EngineConfig;
use trinity_explorer::RolloutModel;

const PACKAGES: [&str; 5] =
    ["gsm8k_reward", "frozen_lake", "zero_variance_filter", "hostile_reward", "hostile_workflow"];

/// The `.wasm` file of one of [`PACKAGES`], built (once per test binary) into this target's tmp directory.
pub fn wasm(package: &str) -> PathBuf {
    static BUILT: OnceLock<Result<Vec<PathBuf>, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-plugins");
        trinity_plugin::build::build_plugins(&workspace, &PACKAGES, &target)
    });
    let paths = built.as_ref().unwrap_or_else(|error| panic!("{error}"));
    let index = PACKAGES.iter().position(|p| *p == package).unwrap_or_else(|| panic!("unknown fixture {package}"));
    paths[index].clone()
}

/// A two-layer Llama with its tokenizer and ChatML template (the model crate's fixture) behind a real engine.
pub fn tiny_model() -> Arc<RolloutModel> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/tiny/llama_tied");
    let loaded = trinity_model::load_model(&dir, tch::Kind::Float, tch::Device::Cpu).unwrap();
    let config = EngineConfig { max_model_len: 64, max_num_seqs: 16, ..EngineConfig::default() };
    Arc::new(RolloutModel::start(loaded, config).unwrap())
}

/// One task per row of a taskset run by `workflow`, `repeat_times` rollouts of at most 4 tokens each.
pub fn tasks(rows: Vec<serde_json::Value>, workflow: &str, repeat_times: u32) -> Vec<Task> {
    let config = TasksetConfig {
        name: "hostile".into(),
        default_workflow_type: Some(workflow.into()),
        repeat_times: Some(repeat_times),
        rollout_args: RolloutArgs {
            temperature: Some(1.0),
            max_tokens: Some(4),
            seed: Some(7),
            ..RolloutArgs::default()
        },
        ..TasksetConfig::default()
    };
    let rows = rows.into_iter().map(|r| r.as_object().cloned().unwrap()).collect();
    let taskset = Taskset::from_rows(&config, rows, 0, false, Path::new("hostile.jsonl")).unwrap();
    taskset.all_tasks().unwrap()
}

/// Everything the plugin host logged in this test binary so far (a global subscriber, installed on first use).
pub fn log_text() -> String {
    let log = log_buffer();
    String::from_utf8_lossy(&log.lock().unwrap()).into_owned()
}

fn log_buffer() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    Arc::clone(LOG.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&buffer);
        let subscriber =
            tracing_subscriber::fmt().with_ansi(false).with_writer(move || LogWriter(Arc::clone(&sink))).finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        buffer
    }))
}

/// Installs the log capture (call before the code whose log a test reads).
pub fn capture_log() {
    log_buffer();
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
