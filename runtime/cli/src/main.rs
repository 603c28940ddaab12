//! The `trinity` binary: a thin edge over the runtime crates. Errors become `anyhow` here and nowhere else.

mod algorithm;
mod cli;
mod convert;
mod logging;
mod registry;
mod run;
mod score;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = logging::init(cli.log_level, None).and_then(|_guard| match cli.command {
        Command::Run(args) => run::run(args),
        Command::Score(args) => score::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Algorithm(args) => algorithm::run(args),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
