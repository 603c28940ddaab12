//! `trinity algorithm`: list the registered algorithm components, or evaluate some on a recorded batch.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

/// Inspect and evaluate algorithm components without a model.
#[derive(Debug, Args)]
pub(crate) struct AlgorithmArgs {
    /// Load an algorithm library (or an installed plugin by name) first, so its components can be listed and
    /// evaluated by name; repeatable.
    #[arg(long = "plugin", value_name = "PATH|NAME", global = true)]
    pub(crate) plugins: Vec<PathBuf>,

    #[command(subcommand)]
    pub(crate) command: AlgorithmCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum AlgorithmCommand {
    /// Every registered preset, advantage function, policy loss, KL function, entropy loss and sample
    /// strategy, with its default arguments (one line each; JSON lines with `--json`).
    List {
        /// Print one JSON object per component: `{"kind", "name", "default_args"}`.
        #[arg(long)]
        json: bool,
    },
    /// Evaluate components on a recorded batch and print advantages, losses, metrics and ∂loss/∂logprob as
    /// JSON.
    Eval {
        /// The input document: optional `algorithm_type`, component names with `*_args`, `loss_agg_mode` and a
        /// padded `batch` (`logprob`, `old_logprob`, `ref_logprob`, `action_mask`, `reward`, `group_id`, …).
        #[arg(long, value_name = "FILE.json")]
        input: PathBuf,
    },
}

pub(crate) fn run(args: AlgorithmArgs) -> anyhow::Result<()> {
    let specs: Vec<_> = args.plugins.iter().map(|path| crate::plugins::spec_for(path)).collect();
    crate::plugins::load(&specs)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match args.command {
        AlgorithmCommand::List { json } => {
            for item in trinity_algorithm::list() {
                if json {
                    writeln!(out, "{}", serde_json::to_string(&item)?)?;
                } else {
                    let args = serde_json::to_string(&item.default_args)?;
                    writeln!(out, "{:<20} {:<20} {args}", item.kind.to_string(), item.name)?;
                }
            }
        }
        AlgorithmCommand::Eval { input } => {
            let text = std::fs::read_to_string(&input).with_context(|| format!("cannot read {}", input.display()))?;
            let output =
                trinity_algorithm::eval_str(&text).with_context(|| format!("evaluating {}", input.display()))?;
            writeln!(out, "{}", serde_json::to_string_pretty(&output)?)?;
        }
    }
    Ok(())
}
