//! What reward and operator plugins share: a world whose exports are called synchronously on the plugin's own
//! worker threads (a [`Pool`], one Store per worker), with a Store that is rebuilt after a trap.
//!
//! Loading links WASI and the world, pre-instantiates once, instantiates a first Store on a worker to read the
//! plugin's `info`, and keeps it. A call takes an idle worker, instantiates again if that worker's previous call
//! trapped, arms the deadline, runs the export, writes what the plugin printed to the log, and maps the outcome:
//! the guest's own error message, or a trap (deadline, memory, panic), after which the Store is dropped because
//! its state can no longer be trusted. Calls from several tasks run on several workers at once, so one call
//! stuck until its deadline delays only its own task.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmtime::Store;
use wasmtime::component::{Component, InstancePre, Linker};

use crate::bindings::types;
use crate::component::PluginKind;
use crate::engine::{PluginLimits, StoreState, engine};
use crate::error::PluginError;
use crate::instance::{PluginInfo, call_error, new_store};
use crate::worker::Pool;

/// Workers (each with its own Store, up to the plugin's memory budget) one plugin may run at once: the CPU's
/// parallelism, at least 2 so that one stuck call never holds every task, at most 8.
fn pool_size() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8)
}

/// The store type synchronous plugins run in (no host state beyond WASI and limits).
pub(crate) type PluginStore = Store<StoreState<()>>;

/// A world's generated bindings, as [`SyncPlugin`] needs them.
pub(crate) trait SyncWorld: Sized + Send + 'static {
    /// The world's pre-instantiated form.
    type Pre: Clone + Send + Sync + 'static;
    /// The kind the plugin must declare in its `info`.
    const KIND: PluginKind;
    fn add_to_linker(linker: &mut Linker<StoreState<()>>) -> wasmtime::Result<()>;
    fn pre(instance: InstancePre<StoreState<()>>) -> wasmtime::Result<Self::Pre>;
    fn instantiate(pre: &Self::Pre, store: &mut PluginStore) -> wasmtime::Result<Self>;
    fn info(&self, store: &mut PluginStore) -> wasmtime::Result<types::PluginInfo>;
}

/// What re-instantiation needs.
struct Setup<W: SyncWorld> {
    name: String,
    path: PathBuf,
    limits: PluginLimits,
    pre: W::Pre,
}

struct Loaded<W> {
    store: PluginStore,
    bindings: W,
}

impl<W: SyncWorld> Setup<W> {
    fn instantiate(&self) -> Result<Loaded<W>, PluginError> {
        let mut store = new_store(&self.name, &self.limits, (), &self.path)?;
        let bindings = W::instantiate(&self.pre, &mut store).map_err(|e| call_error(&self.name, &self.limits, &e))?;
        Ok(Loaded { store, bindings })
    }
}

/// A loaded plugin of world `W` with its worker thread.
pub(crate) struct SyncPlugin<W: SyncWorld> {
    info: PluginInfo,
    workers: Pool<Loaded<W>>,
    setup: Arc<Setup<W>>,
}

impl<W: SyncWorld> SyncPlugin<W> {
    pub(crate) fn load(path: &Path, component: &Component, limits: PluginLimits) -> Result<Self, PluginError> {
        let link = |e: wasmtime::Error| PluginError::Link { path: path.to_owned(), message: format!("{e:#}") };
        let mut linker = Linker::new(engine()?);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(link)?;
        W::add_to_linker(&mut linker).map_err(link)?;
        let pre = W::pre(linker.instantiate_pre(component).map_err(link)?).map_err(link)?;
        let label = path.display().to_string();
        let first = Setup::<W> { name: label.clone(), path: path.to_owned(), limits: limits.clone(), pre: pre.clone() };
        let workers = Pool::new(&label, pool_size());
        let owned_path = path.to_owned();
        let info = workers
            .call(move |slot: &mut Option<Loaded<W>>| {
                let mut loaded = first.instantiate()?;
                let info = loaded.bindings.info(&mut loaded.store);
                loaded.store.data().drain_output();
                let info = info.map_err(|e| call_error(&first.name, &first.limits, &e))?;
                let info = PluginInfo::from_guest(&owned_path, W::KIND, info)?;
                loaded.store.data_mut().plugin = info.name.clone();
                *slot = Some(loaded);
                Ok::<_, PluginError>(info)
            })
            .map_err(|e| PluginError::Engine { message: format!("cannot start a plugin worker thread: {e}") })?
            .ok_or_else(|| PluginError::Engine { message: "the plugin's worker thread ended".into() })??;
        let setup = Arc::new(Setup { name: info.name.clone(), path: path.to_owned(), limits, pre });
        Ok(SyncPlugin { info, workers, setup })
    }

    /// Who the plugin is.
    pub(crate) fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// The plugin's limits.
    pub(crate) fn limits(&self) -> &PluginLimits {
        &self.setup.limits
    }

    /// Runs `export` on the worker (see the module docs for what happens around it). `export` returns the
    /// wasmtime result of the call, whose value is the guest's own `result<T, string>`.
    pub(crate) fn call<T: Send + 'static>(
        &self,
        export: impl FnOnce(&W, &mut PluginStore) -> wasmtime::Result<Result<T, String>> + Send + 'static,
    ) -> Result<T, PluginError> {
        let setup = Arc::clone(&self.setup);
        self.workers
            .call(move |slot: &mut Option<Loaded<W>>| {
                let loaded = match slot {
                    Some(loaded) => loaded,
                    None => slot.insert(setup.instantiate()?),
                };
                loaded.store.set_epoch_deadline(setup.limits.deadline_ticks());
                let outcome = export(&loaded.bindings, &mut loaded.store);
                loaded.store.data().drain_output();
                match outcome {
                    Ok(Ok(value)) => Ok(value),
                    Ok(Err(message)) => Err(PluginError::Guest { plugin: setup.name.clone(), message }),
                    Err(error) => {
                        // The Store is poisoned: drop it, the next call instantiates afresh.
                        *slot = None;
                        Err(call_error(&setup.name, &setup.limits, &error))
                    }
                }
            })
            .map_err(|e| PluginError::Engine { message: format!("cannot start a plugin worker thread: {e}") })?
            .ok_or_else(|| PluginError::Engine { message: "the plugin's worker thread ended".into() })?
    }
}
