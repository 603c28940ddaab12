//! `trinity plugins`: what is registered, by name, kind, version and origin; and loading the plugins a run
//! asks for (`--plugin`, the config's `plugins:`).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use trinity_config::config::PluginSpec;

/// Inspect plugins and every registered name.
#[derive(Debug, Args)]
pub(crate) struct PluginsArgs {
    #[command(subcommand)]
    pub(crate) command: PluginsCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum PluginsCommand {
    /// Every registered workflow, reward function, operator and algorithm component, one per line: kind, name,
    /// version and origin (`built-in` or the plugin file).
    List {
        /// Load this plugin first (a `.wasm` component, an algorithm library or an installed name); repeatable.
        #[arg(long = "plugin", value_name = "PATH")]
        plugins: Vec<PathBuf>,
        /// Print one JSON object per line: `{"kind", "name", "version", "origin"}`.
        #[arg(long)]
        json: bool,
    },
    /// Install a plugin from a registry index: fetch it, verify its sha256, store it under `.trinity/plugins/` and
    /// pin it in `trinity-plugins.lock`; runs then load it by name (`--plugin NAME`, `plugins: [NAME]`).
    Install(crate::install::InstallArgs),
    /// Trust a publisher's ed25519 public key (64 hex digits) for installs into this project: it is pinned in
    /// `trinity-plugins.lock`, and `install` accepts only releases whose index entry that key (or another
    /// trusted one) signed.
    Trust {
        /// The publisher's public key, 64 hex digits (as `trinity plugins keygen` prints it).
        #[arg(value_name = "KEY")]
        key: String,
        /// The project folder that holds `trinity-plugins.lock`; the working directory by default.
        #[arg(long, value_name = "DIR")]
        project: Option<PathBuf>,
    },
    /// For publishers: make a signing key. Writes its secret (64 hex digits) to FILE, readable by you alone, and
    /// prints the public key that projects pass to `trinity plugins trust`.
    Keygen {
        /// Where to write the secret key; an existing file is never overwritten.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// For publishers: sign every release of a registry index with the secret key in FILE (rewrites INDEX with
    /// each entry's `signature`).
    Sign {
        /// The index file to sign in place.
        #[arg(value_name = "INDEX")]
        index: PathBuf,
        /// The secret key file `trinity plugins keygen` wrote.
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
    },
}

pub(crate) fn run(args: PluginsArgs) -> Result<()> {
    match args.command {
        PluginsCommand::List { plugins, json } => {
            let specs: Vec<PluginSpec> = plugins.iter().map(|path| spec_for(path)).collect();
            load(&specs)?;
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            for row in listing() {
                if json {
                    let value = serde_json::json!({
                        "kind": row.kind, "name": row.name, "version": row.version, "origin": row.origin,
                    });
                    writeln!(out, "{value}")?;
                } else {
                    writeln!(out, "{:<20} {:<24} {:<10} {}", row.kind, row.name, row.version, row.origin)?;
                }
            }
        }
        PluginsCommand::Install(args) => crate::install::run(args)?,
        PluginsCommand::Trust { key, project } => {
            let cwd = std::env::current_dir().context("cannot read the working directory")?;
            let project = project.map_or_else(|| cwd.clone(), |p| cwd.join(p));
            let mut lock = trinity_registry::Lock::read(&project)?;
            let new = lock.trust(&key)?;
            lock.write()?;
            let state = if new { "now trusted" } else { "already trusted" };
            println!("publisher key {} {state} in {}", key.trim().to_lowercase(), lock.path().display());
        }
        PluginsCommand::Keygen { out } => keygen(&out)?,
        PluginsCommand::Sign { index, key } => {
            let secret = std::fs::read_to_string(&key).with_context(|| format!("cannot read {}", key.display()))?;
            let secret = trinity_registry::parse_secret_key(&secret).with_context(|| key.display().to_string())?;
            let text = std::fs::read_to_string(&index).with_context(|| format!("cannot read {}", index.display()))?;
            let signed = trinity_registry::Index::sign(&text, &secret)?;
            let tmp = index.with_extension("toml.signing");
            std::fs::write(&tmp, signed).with_context(|| format!("cannot write {}", tmp.display()))?;
            std::fs::rename(&tmp, &index).with_context(|| format!("cannot replace {}", index.display()))?;
            println!("signed {} with key {}", index.display(), trinity_registry::public_key_hex(&secret));
        }
    }
    Ok(())
}

/// Writes a new secret key (32 bytes from the kernel's random source, as hex) to `out`, created with mode 0600
/// and never over an existing file, and prints its public key.
fn keygen(out: &Path) -> Result<()> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut seed))
        .context("cannot read /dev/urandom")?;
    let hex: String = seed.iter().map(|b| format!("{b:02x}")).collect();
    let secret = trinity_registry::parse_secret_key(&hex)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("cannot create {} (an existing key file is never overwritten)", out.display()))?;
    writeln!(file, "{hex}").with_context(|| format!("cannot write {}", out.display()))?;
    println!("{}", trinity_registry::public_key_hex(&secret));
    Ok(())
}

/// A `--plugin PATH` argument as a plugin entry with default limits.
pub(crate) fn spec_for(path: &Path) -> PluginSpec {
    PluginSpec {
        path: path.display().to_string(),
        override_builtin: false,
        allow_dir: None,
        max_memory_mib: None,
        timeout_s: None,
        max_model_calls: None,
        max_model_tokens: None,
    }
}

/// Loads and registers every plugin, in order; the first failure stops (a run with a missing plugin would fail
/// later with a less helpful message).
pub(crate) fn load(specs: &[PluginSpec]) -> Result<()> {
    let cwd = std::env::current_dir().context("cannot read the working directory")?;
    for spec in specs {
        // An installed plugin's name becomes its (re-verified) stored file.
        let path = &crate::install::resolve(&spec.path, &cwd)?;
        if path.extension().is_none_or(|extension| extension != "wasm") {
            refuse_native_limits(path, &sandbox_keys(spec))?;
            trinity_algorithm_library::register_file(path)?;
            continue;
        }
        crate::wasm::load(path, spec)?;
    }
    Ok(())
}

/// Refuses sandbox limits given for a native library (an algorithm `.so`): it runs unsandboxed inside trinity's
/// process, so a memory cap, deadline or directory grant could not be enforced, and ignoring them silently would
/// let a config promise isolation it does not get. `keys` are the limit keys the config set; none is fine.
fn refuse_native_limits(path: &Path, keys: &[&str]) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let keys = keys.join(", ");
    bail!(
        "plugin {}: {keys} cannot apply to a native library: it runs unsandboxed inside trinity's process, so no \
         memory cap, deadline or directory grant can be enforced on it; remove {keys} from its `plugins:` entry, or \
         build the code as a WASM plugin",
        path.display()
    )
}

/// The sandbox keys a `plugins:` entry sets: a native library cannot honour any of them.
fn sandbox_keys(spec: &PluginSpec) -> Vec<&'static str> {
    let set = [
        ("allow_dir", spec.allow_dir.is_some()),
        ("max_memory_mib", spec.max_memory_mib.is_some()),
        ("timeout_s", spec.timeout_s.is_some()),
        ("max_model_calls", spec.max_model_calls.is_some()),
        ("max_model_tokens", spec.max_model_tokens.is_some()),
    ];
    set.into_iter().filter(|(_, given)| *given).map(|(key, _)| key).collect()
}

/// One line of `trinity plugins list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) origin: String,
}

/// Built-ins (workflows, rewards, algorithm components) then plugins, each group sorted by kind and name.
pub(crate) fn listing() -> Vec<Row> {
    let version = env!("CARGO_PKG_VERSION");
    let builtin = |kind: &str, name: &str| Row {
        kind: kind.to_owned(),
        name: name.to_owned(),
        version: version.to_owned(),
        origin: "built-in".to_owned(),
    };
    let mut rows: Vec<Row> = Vec::new();
    rows.extend(trinity_explorer::builtin_workflows().into_iter().map(|entry| builtin("workflow", entry.name)));
    rows.extend(trinity_reward::registry::entries().into_iter().map(|entry| builtin("reward", entry.name)));
    rows.extend(trinity_explorer::builtin_operators().into_iter().map(|entry| builtin("operator", entry.name)));
    let algorithms = trinity_algorithm::list().into_iter().filter(|item| item.library.is_none());
    rows.extend(algorithms.map(|item| builtin(&item.kind.to_string(), &item.name)));
    rows.sort_by(|a, b| (&a.kind, &a.name).cmp(&(&b.kind, &b.name)));
    let mut plugins: Vec<Row> = crate::wasm::registered();
    for library in trinity_algorithm_library::loaded() {
        plugins.extend(library.components.into_iter().map(|c| Row {
            kind: c.kind.to_string(),
            name: c.name,
            version: library.version.clone(),
            origin: library.path.display().to_string(),
        }));
    }
    plugins.sort_by(|a, b| (&a.kind, &a.name).cmp(&(&b.kind, &b.name)));
    rows.extend(plugins);
    // Installed plugins (the working directory's lock file), whether or not this command loaded them.
    if let Ok(lock) =
        std::env::current_dir().map_err(anyhow::Error::from).and_then(|cwd| Ok(trinity_registry::Lock::read(&cwd)?))
    {
        rows.extend(lock.plugins.into_iter().map(|p| Row {
            kind: format!("installed {}", p.kind),
            name: p.name,
            version: p.version,
            origin: lock.project.join(&p.path).display().to_string(),
        }));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_limits_on_a_native_library_are_refused_before_it_loads() {
        let mut spec = spec_for(Path::new("/nonexistent/libalgo.so"));
        spec.timeout_s = Some(5.0);
        spec.max_memory_mib = Some(64);
        let error = load(&[spec]).unwrap_err().to_string();
        assert!(error.contains("/nonexistent/libalgo.so") && error.contains("max_memory_mib, timeout_s"), "{error}");
        assert!(error.contains("cannot apply to a native library"), "{error}");
    }

    #[test]
    fn a_missing_library_is_an_error_naming_it() {
        let error = load(&[spec_for(Path::new("/nonexistent/libalgo.so"))]).unwrap_err().to_string();
        assert!(error.contains("/nonexistent/libalgo.so"), "{error}");
    }

    #[test]
    fn the_listing_shows_built_ins() {
        let rows = listing();
        assert!(rows.iter().any(|r| r.kind == "workflow" && r.name == "math_workflow" && r.origin == "built-in"));
        assert!(rows.iter().any(|r| r.kind == "reward" && r.name == "math_reward"));
    }
}
