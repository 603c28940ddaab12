//! The command line, in one place: every flag is documented by its doc comment, which `--help` shows.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Reinforcement fine-tuning of LLMs: explorer, buffer, trainer and synchronizer in one native binary.
///
/// Configs are Trinity-RFT's YAML files: same keys, same meaning.
#[derive(Debug, Parser)]
#[command(name = "trinity", version, propagate_version = true)]
pub(crate) struct Cli {
    /// Log verbosity; `RUST_LOG` (e.g. `trinity=debug`) takes precedence when set.
    #[arg(long, global = true, value_enum, default_value_t = LogLevel::Info)]
    pub(crate) log_level: LogLevel,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Load, validate and run a config.
    Run(RunArgs),
    /// Start this machine's processes of a data-parallel job, as torchrun does (e.g. `trinity launch
    /// --nproc-per-node 2 -- run --config X`): each runs the command with torchrun's environment (WORLD_SIZE, RANK,
    /// LOCAL_RANK, MASTER_ADDR, MASTER_PORT); when one fails, the others are stopped and the launch fails.
    Launch(LaunchArgs),
    /// Per-token logprobs of responses under a model (HF directory or GGUF file).
    Score(crate::score::ScoreArgs),
    /// Generate completions with logprobs for a file of prompts (continuous batching).
    Generate(crate::generate::GenerateArgs),
    /// Convert a GGUF file into a Hugging Face model directory.
    Convert(crate::convert::ConvertArgs),
    /// List algorithm components, or evaluate them offline on a recorded batch.
    Algorithm(crate::algorithm::AlgorithmArgs),
    /// Inspect plugins: every registered name with its kind, version and origin.
    Plugins(crate::plugins::PluginsArgs),
    /// Serve the studio: a web page to watch the runs under a checkpoint root (status, curves, rollouts), validate
    /// and edit configs, and see the plugins; prints its address and runs until stopped (Ctrl-C).
    Studio(crate::studio::StudioArgs),
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The Trinity-RFT YAML config.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub(crate) config: PathBuf,

    /// Override one key, typed like YAML (e.g. `--set algorithm.optimizer.lr=1e-5`); repeatable, applied in
    /// order after the file is read and before `${oc.env:...}` interpolation.
    #[arg(long = "set", value_name = "KEY.PATH=VALUE")]
    pub(crate) overrides: Vec<String>,

    /// Load, interpolate and validate the config, print it with every default filled in, and exit.
    #[arg(long)]
    pub(crate) dry_run: bool,

    /// Load a plugin before the config, so the config can name its components: a `.wasm` component (workflow,
    /// reward function, operator), an algorithm library (`.so`), or the name of an installed plugin;
    /// repeatable, loaded before the config's own `plugins:`.
    #[arg(long = "plugin", value_name = "PATH")]
    pub(crate) plugins: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct LaunchArgs {
    /// Processes on this machine (one per device; on a CPU the cores are divided among them).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) nproc_per_node: usize,

    /// Machines in the job; each runs the same launch with its own `--node-rank`.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) nnodes: usize,

    /// This machine's index, 0 ..= nnodes − 1; node 0 runs rank 0, which hosts the job's store.
    #[arg(long, value_name = "I", default_value_t = 0)]
    pub(crate) node_rank: usize,

    /// Address of node 0, where every process meets (rank 0 hosts the store there).
    #[arg(long, value_name = "HOST", default_value = "127.0.0.1")]
    pub(crate) master_addr: String,

    /// Port of the job's store on node 0 (torchrun's default); 0 on a single machine picks a free one.
    #[arg(long, value_name = "PORT", default_value_t = trinity_collective::launch::DEFAULT_MASTER_PORT)]
    pub(crate) master_port: u16,

    /// Seconds the processes get between SIGTERM and SIGKILL when the launch stops them.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub(crate) grace: u64,

    /// The trinity command each process runs, after `--` (e.g. `-- run --config X`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub(crate) command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub(crate) fn directive(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}
