//! The WASM plugin host, when this binary has it (the `wasm` feature, on by default).
//!
//! `cargo xtask quickstart` builds the binary without it: wasmtime's compiler (cranelift) is about a quarter of a
//! cold release build's CPU time, and the quickstart loads no plugin. Such a binary names the feature when a run
//! asks for a `.wasm` plugin, instead of failing later on a workflow or reward name it does not know.

use std::path::Path;

use anyhow::Result;
use trinity_config::config::PluginSpec;

use crate::plugins::Row;

/// The WIT version offered to reward, workflow and operator plugins; `None` without the host.
#[cfg(feature = "wasm")]
pub(crate) const WIT_VERSION: Option<&str> = Some(trinity_plugin::WIT_VERSION);
#[cfg(not(feature = "wasm"))]
pub(crate) const WIT_VERSION: Option<&str> = None;

/// Loads the component at `path` with the limits of its `plugins:` entry and registers its name.
#[cfg(feature = "wasm")]
pub(crate) fn load(path: &Path, spec: &PluginSpec) -> Result<()> {
    trinity_plugin::load_and_register(path, host::limits(spec)?, spec.override_builtin)?;
    Ok(())
}

#[cfg(not(feature = "wasm"))]
pub(crate) fn load(path: &Path, _spec: &PluginSpec) -> Result<()> {
    anyhow::bail!(
        "plugin {}: this trinity was built without the WASM plugin host (the `wasm` feature; `cargo xtask \
         quickstart` leaves it out to build faster): build it with `cargo build --release --bin trinity`",
        path.display()
    )
}

/// The registered WASM plugins, as `trinity plugins list` prints them.
pub(crate) fn registered() -> Vec<Row> {
    #[cfg(feature = "wasm")]
    return trinity_plugin::registered()
        .into_iter()
        .map(|info| Row {
            kind: info.kind.label().to_owned(),
            name: info.name,
            version: info.version,
            origin: info.path.display().to_string(),
        })
        .collect();
    #[cfg(not(feature = "wasm"))]
    Vec::new()
}

#[cfg(feature = "wasm")]
mod host {
    use std::path::PathBuf;
    use std::time::Duration;

    use anyhow::{Context, Result, bail};
    use trinity_config::config::PluginSpec;
    use trinity_plugin::PluginLimits;

    /// The sandbox limits of a `plugins:` entry over the host's defaults, each checked.
    pub(super) fn limits(spec: &PluginSpec) -> Result<PluginLimits> {
        let mut limits = PluginLimits::default();
        if let Some(mib) = spec.max_memory_mib {
            if mib == 0 {
                bail!("plugin {}: max_memory_mib must be positive", spec.path);
            }
            limits.memory_bytes = mib.checked_mul(1 << 20).context("max_memory_mib is too large")?;
        }
        if let Some(seconds) = spec.timeout_s {
            if !(seconds.is_finite() && seconds > 0.0) {
                bail!("plugin {}: timeout_s must be a positive number of seconds, found {seconds}", spec.path);
            }
            limits.call_timeout = Duration::from_secs_f64(seconds);
        }
        if let Some(calls) = spec.max_model_calls {
            if calls == 0 {
                bail!("plugin {}: max_model_calls must be positive", spec.path);
            }
            limits.max_model_calls = calls;
        }
        if let Some(tokens) = spec.max_model_tokens {
            if tokens == 0 {
                bail!("plugin {}: max_model_tokens must be positive", spec.path);
            }
            limits.max_model_tokens = tokens;
        }
        limits.allow_dir = spec.allow_dir.as_ref().map(PathBuf::from);
        Ok(limits)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn limits_come_from_the_entry_and_bad_ones_are_refused() {
            let mut spec = crate::plugins::spec_for(std::path::Path::new("x.wasm"));
            assert_eq!(limits(&spec).unwrap(), PluginLimits::default());
            spec.max_memory_mib = Some(64);
            spec.timeout_s = Some(1.5);
            spec.allow_dir = Some("/srv/data".into());
            let set = limits(&spec).unwrap();
            assert_eq!(set.memory_bytes, 64 << 20);
            assert_eq!(set.call_timeout, Duration::from_millis(1500));
            assert_eq!(set.allow_dir, Some(PathBuf::from("/srv/data")));
            spec.max_model_calls = Some(12);
            spec.max_model_tokens = Some(3000);
            let set = limits(&spec).unwrap();
            assert_eq!((set.max_model_calls, set.max_model_tokens), (12, 3000));
            spec.max_model_calls = Some(0);
            assert!(limits(&spec).unwrap_err().to_string().contains("max_model_calls"));
            spec.max_model_calls = None;
            spec.timeout_s = Some(f64::NAN);
            assert!(limits(&spec).unwrap_err().to_string().contains("timeout_s"));
        }
    }
}
