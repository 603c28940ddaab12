//! The one wasmtime [`Engine`] of the process, its epoch ticker, and the limits every plugin Store runs under.
//!
//! Invariants: every Store gets its resource limiter ([`SandboxLimiter`]: one budget for all its memories and
//! tables, capped instance, memory and table counts) and an epoch deadline *before* it instantiates anything
//! (a fresh Store's deadline is 0, already expired once the ticker has run); a Store that trapped is dropped,
//! never entered again (wasmtime poisons it). A plugin's stdout and stderr go to capped buffers
//! ([`CapturedOutput`]) that the host writes to the run log under the plugin's name after each call.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use wasmtime::component::ResourceTable;
use wasmtime::{Cache, CacheConfig, Config, Engine};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::error::PluginError;
use crate::limits::SandboxLimiter;
use crate::output::CapturedOutput;

/// How often the ticker advances the engine's epoch: the resolution of every deadline.
pub(crate) const TICK: Duration = Duration::from_millis(10);

/// Sandbox limits of one plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginLimits {
    /// Most memory one instance may hold, all its linear memories and tables together; an allocation past it
    /// traps the plugin.
    pub memory_bytes: u64,
    /// Longest one call may run (reward and operator calls: wall-clock; workflows: the plugin's own time, not
    /// the time it waits for the model).
    pub call_timeout: Duration,
    /// A host directory the plugin may read, mounted at `/data`; nothing else of the filesystem is visible.
    pub allow_dir: Option<PathBuf>,
    /// Workflows: most model requests (`chat` and `generate` calls) one task run may make. Its deadline excludes
    /// time spent waiting for the model, so without this a workflow could keep the engine busy forever.
    pub max_model_calls: u32,
    /// Workflows: most tokens the model may generate for one task run, over all its requests and samples.
    pub max_model_tokens: u64,
}

impl Default for PluginLimits {
    /// 512 MiB and 60 s: generous for a reward function or an environment, small enough that a runaway plugin
    /// cannot hurt a trainer holding gigabytes of weights. 1024 model calls and 4Mi generated tokens a task:
    /// room for an agent of 8 rollouts × 128 turns of 4096 tokens, far below what a runaway loop reaches.
    fn default() -> Self {
        PluginLimits {
            memory_bytes: 512 << 20,
            call_timeout: Duration::from_secs(60),
            allow_dir: None,
            max_model_calls: 1024,
            max_model_tokens: 1 << 22,
        }
    }
}

impl PluginLimits {
    pub(crate) fn memory_mib(&self) -> u64 {
        self.memory_bytes >> 20
    }

    /// The deadline in epoch ticks (at least one).
    pub(crate) fn deadline_ticks(&self) -> u64 {
        (self.call_timeout.as_millis() / TICK.as_millis()).max(1) as u64
    }
}

/// The process-wide engine: component model, epoch interruption, an on-disk compilation cache.
pub(crate) fn engine() -> Result<&'static Engine, PluginError> {
    static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();
    ENGINE.get_or_init(build_engine).as_ref().map_err(|message| PluginError::Engine { message: message.clone() })
}

fn build_engine() -> Result<Engine, String> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    // Compiling a plugin takes 0.1-1 s of Cranelift; the cache makes every later start of a run instant.
    match cache_dir() {
        Some(dir) => {
            let mut cache_config = CacheConfig::new();
            cache_config.with_directory(dir);
            match Cache::new(cache_config) {
                Ok(cache) => {
                    config.cache(Some(cache));
                }
                Err(error) => tracing::warn!("plugin compilation cache disabled: {error:#}"),
            }
        }
        None => tracing::debug!("no cache directory (HOME unset): plugins are compiled at every start"),
    }
    let engine = Engine::new(&config).map_err(|e| format!("{e:#}"))?;
    let ticker = engine.clone();
    std::thread::Builder::new()
        .name("trinity-plugin-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(TICK);
                ticker.increment_epoch();
            }
        })
        .map_err(|e| format!("cannot start the epoch ticker thread: {e}"))?;
    Ok(engine)
}

/// `$TRINITY_PLUGIN_CACHE`, else `$XDG_CACHE_HOME/trinity/wasm`, else `~/.cache/trinity/wasm`.
fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TRINITY_PLUGIN_CACHE") {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("trinity").join("wasm"))
}

/// What every plugin Store holds: the WASI context (no filesystem unless granted, no network, no environment),
/// the resource limiter, the captured output, and the per-world extras.
pub(crate) struct StoreState<X> {
    pub(crate) plugin: String,
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limiter: SandboxLimiter,
    stdout: CapturedOutput,
    stderr: CapturedOutput,
    pub(crate) extra: X,
}

impl<X: Send> WasiView for StoreState<X> {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl<X> StoreState<X> {
    pub(crate) fn new(plugin: &str, limits: &PluginLimits, extra: X) -> Result<Self, String> {
        let mut wasi = WasiCtxBuilder::new();
        // Never the process's own streams: stdout is the channel of commands like `trinity plugins list`, and an
        // unbounded stderr lets a plugin flood the terminal and the log. Both are captured, capped, and logged
        // under the plugin's name (`drain_output`), so a panic message is still seen.
        let (stdout, stderr) = (CapturedOutput::new("stdout"), CapturedOutput::new("stderr"));
        wasi.stdout(stdout.clone()).stderr(stderr.clone());
        if let Some(dir) = &limits.allow_dir {
            wasi.preopened_dir(dir, "/data", FsPerms::ReadOnly).map_err(|e| format!("{e:#}"))?;
        }
        Ok(StoreState {
            plugin: plugin.to_owned(),
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limiter: SandboxLimiter::new(usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX)),
            stdout,
            stderr,
            extra,
        })
    }

    /// Writes what the plugin printed since the last drain to the run log, under its name.
    pub(crate) fn drain_output(&self) {
        self.stdout.log(&self.plugin);
        self.stderr.log(&self.plugin);
    }
}
