//! `trinity launch`: this machine's processes of a data-parallel job, each running a trinity command with
//! torchrun's environment (see `trinity_collective::launch`).

use std::ffi::OsString;
use std::time::Duration;

use anyhow::{Context, Result};
use trinity_collective::LaunchOptions;

use crate::cli::{LaunchArgs, LogLevel};

pub(crate) fn run(log_level: LogLevel, args: LaunchArgs) -> Result<()> {
    let program = std::env::current_exe().context("cannot find the trinity binary to launch")?;
    // The children log as the launcher was asked to.
    let mut command: Vec<OsString> = vec!["--log-level".into(), log_level.directive().into()];
    command.extend(args.command);
    let options = LaunchOptions {
        nproc_per_node: args.nproc_per_node,
        nnodes: args.nnodes,
        node_rank: args.node_rank,
        master_addr: args.master_addr,
        master_port: args.master_port,
        grace: Duration::from_secs(args.grace),
    };
    tracing::info!(
        "launching {} process(es) on node {} of {} (world size {}), store at {}:{}",
        options.nproc_per_node,
        options.node_rank,
        options.nnodes,
        options.nproc_per_node * options.nnodes,
        options.master_addr,
        options.master_port
    );
    trinity_collective::launch(&options, &program.into_os_string(), &command)?;
    Ok(())
}
