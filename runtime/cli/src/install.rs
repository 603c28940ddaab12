//! `trinity plugins install NAME[@VERSION]`: install a plugin from a registry index into the project (its file
//! under `.trinity/plugins/`, its pin in `trinity-plugins.lock`), and resolve installed plugins by name when a
//! run asks for them (`--plugin NAME`, `plugins: [NAME]`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use trinity_registry::{Lock, Request, Version};

/// Install a plugin from a registry index, verifying its sha256 and pinning it in the lock file.
#[derive(Debug, Args)]
pub(crate) struct InstallArgs {
    /// The plugin, optionally with an exact version (`my_algo` or `my_algo@0.2.0`); without one, the newest
    /// release that works with this trinity.
    #[arg(value_name = "NAME[@VERSION]")]
    pub(crate) plugin: String,

    /// The registry index: a path, a `file://` URL or an `http(s)://` URL (see docs/plugins-registry.md).
    #[arg(long, env = "TRINITY_PLUGIN_REGISTRY", value_name = "PATH|URL")]
    pub(crate) registry: String,

    /// The project folder that holds `trinity-plugins.lock` and `.trinity/plugins/`; the working directory by
    /// default (where `trinity run` looks for them).
    #[arg(long, value_name = "DIR")]
    pub(crate) project: Option<PathBuf>,
}

pub(crate) fn run(args: InstallArgs) -> Result<()> {
    let cwd = std::env::current_dir().context("cannot read the working directory")?;
    let project = args.project.map_or_else(|| cwd.clone(), |p| cwd.join(p));
    let request = Request::parse(&args.plugin)?;
    let pinned = trinity_registry::install(&request, &args.registry, &project, &host_api)?;
    println!(
        "installed {} {} ({}) at {}; pinned in {}",
        pinned.name,
        pinned.version,
        pinned.kind,
        project.join(&pinned.path).display(),
        project.join(trinity_registry::LOCK_FILE).display()
    );
    Ok(())
}

/// The plugin API version this trinity offers to plugins of `kind`, or `None` for kinds it cannot load.
pub(crate) fn host_api(kind: &str) -> Option<Version> {
    let version = match kind {
        "algorithm" => trinity_algorithm_library::API_VERSION,
        "reward" | "workflow" | "operator" => crate::wasm::WIT_VERSION?,
        _ => return None,
    };
    Version::parse(version).ok()
}

/// A plugin as a run names it: when no file exists at `plugin` and its file name is a bare name (no extension)
/// installed in the project's lock file, the installed file, after its sha256 is checked again; otherwise the path
/// itself. (The config layer makes `plugins:` entries absolute, so a bare name arrives as `CWD/NAME`.)
pub(crate) fn resolve(plugin: &str, project: &Path) -> Result<PathBuf> {
    let path = PathBuf::from(plugin);
    if path.exists() {
        return Ok(path);
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or(plugin);
    if !name.contains('.')
        && let Some(installed) = Lock::read(project)?.resolve(name)?
    {
        return Ok(installed);
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_plugin_kind_has_an_api_version() {
        for kind in ["algorithm", "reward", "workflow", "operator"] {
            assert!(host_api(kind).is_some(), "{kind}");
        }
        assert!(host_api("theme").is_none());
    }

    #[test]
    fn paths_stay_paths_and_unknown_names_too() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(resolve("./libx.so", dir.path()).unwrap(), PathBuf::from("./libx.so"));
        assert_eq!(resolve("not_installed", dir.path()).unwrap(), PathBuf::from("not_installed"));
    }
}
