//! `trinity run`: load a config, then run its mode.

use anyhow::{Context, Result, bail};

use crate::cli::RunArgs;
use crate::registry::Registry;

pub(crate) fn run(args: RunArgs) -> Result<()> {
    let registry = Registry::builtin();
    let cwd = std::env::current_dir().context("cannot read the working directory")?;
    let env = |var: &str| std::env::var(var).ok();
    let options = trinity_config::LoadOptions { overrides: &args.overrides, env: &env, catalog: &registry, cwd: &cwd };
    let loaded = trinity_config::load_file(&args.config, options)?;
    for note in &loaded.notes {
        tracing::warn!("{note}");
    }
    if args.dry_run {
        print!("{}", loaded.config.to_yaml());
        return Ok(());
    }
    bail!(
        "{}: mode `{}` needs the RFT loop (explorer, trainer, synchronizer), which this build of trinity does \
         not have yet; `--dry-run` checks and prints the config",
        args.config.display(),
        loaded.config.mode.name()
    )
}
