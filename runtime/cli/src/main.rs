//! The `trinity` binary: a thin edge over the runtime crates. Errors become `anyhow` here and nowhere else.

mod algorithm;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod allocator;
mod cli;
mod convert;
mod generate;
mod install;
mod launch;
mod logging;
mod openmp;
mod plugins;
mod progress;
mod registry;
mod report;
mod run;
mod score;
mod studio;
mod wasm;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command, LogLevel};

fn main() -> ExitCode {
    openmp::wait_briefly();
    let cli = Cli::parse();
    let level = cli.log_level;
    let result = match cli.command {
        // `run` starts logging itself once it knows the run directory (the log file goes there).
        Command::Run(args) => run::run(level, args),
        Command::Launch(args) => with_logging(level, || launch::run(level, args)),
        Command::Score(args) => with_logging(level, || score::run(args)),
        Command::Generate(args) => with_logging(level, || generate::run(args)),
        Command::Convert(args) => with_logging(level, || convert::run(args)),
        Command::Algorithm(args) => with_logging(level, || algorithm::run(args)),
        Command::Plugins(args) => with_logging(level, || plugins::run(args)),
        Command::Studio(args) => with_logging(level, || studio::run(args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // A config's errors come one per line, each with its own `error:` like a compiler's, so that an
            // editor or a reader finds each at its line.
            match error.downcast_ref::<trinity_config::ConfigErrors>() {
                Some(errors) => errors.iter().for_each(|error| eprintln!("error: {error}")),
                None => eprintln!("error: {}", report::chain(&error)),
            }
            ExitCode::FAILURE
        }
    }
}

/// Runs a command with console logging.
fn with_logging(level: LogLevel, command: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    let _guard = logging::init(level, None)?;
    command()
}
