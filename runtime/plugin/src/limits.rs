//! The resource limiter of every plugin Store: one byte budget for the whole instance, and caps on how many
//! instances, memories and tables it may create.
//!
//! wasmtime's `StoreLimits` caps each linear memory on its own, so a component with several memories (or a
//! module that grows a table instead) could take a multiple of its budget. Here every memory and every table of
//! the Store draws on one budget: a memory's bytes, and [`TABLE_ELEMENT_BYTES`] per table element (what the host
//! keeps per element). Going over it is an error of a type of our own, [`OverBudget`], which traps the plugin; the
//! host recognises it by type, never by wasmtime's wording.

use wasmtime::ResourceLimiter;

/// Host bytes charged per table element (wasmtime stores a pointer-sized reference per element).
pub(crate) const TABLE_ELEMENT_BYTES: usize = 8;
/// Core instances one Store may create. A Rust plugin built for wasm32-wasip2 is a component of a handful of
/// core instances (the program, the WASI adapter and its shims); 64 leaves room and stops a runaway.
pub(crate) const MAX_INSTANCES: usize = 64;
/// Linear memories one Store may create (a plugin has one or two).
pub(crate) const MAX_MEMORIES: usize = 8;
/// Tables one Store may create (a plugin has a few: its own and the adapter's shims).
pub(crate) const MAX_TABLES: usize = 32;

/// The memory budget was exceeded: the trap's error, recognised by type in [`crate::instance::call_error`].
#[derive(Debug, thiserror::Error)]
#[error("{what} would take the instance to {desired} bytes, over its budget of {budget} bytes")]
pub(crate) struct OverBudget {
    pub(crate) what: &'static str,
    pub(crate) desired: usize,
    pub(crate) budget: usize,
}

/// The limiter a Store runs under (see the module docs).
#[derive(Debug)]
pub(crate) struct SandboxLimiter {
    budget: usize,
    /// Bytes granted so far to every memory and table of the Store.
    used: usize,
    /// The growth last granted, taken back when wasmtime reports that the growth itself failed.
    pending: usize,
}

impl SandboxLimiter {
    pub(crate) fn new(budget: usize) -> Self {
        SandboxLimiter { budget, used: 0, pending: 0 }
    }

    fn grow(&mut self, what: &'static str, current: usize, desired: usize) -> wasmtime::Result<bool> {
        let delta = desired.saturating_sub(current);
        let total = self.used.saturating_add(delta);
        if total > self.budget {
            return Err(wasmtime::Error::new(OverBudget { what, desired: total, budget: self.budget }));
        }
        self.used = total;
        self.pending = delta;
        Ok(true)
    }

    fn grow_failed(&mut self) {
        self.used = self.used.saturating_sub(self.pending);
        self.pending = 0;
    }
}

impl ResourceLimiter for SandboxLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.grow("growing a memory", current, desired)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.grow_failed();
        Ok(())
    }

    fn table_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let bytes = |elements: usize| elements.saturating_mul(TABLE_ELEMENT_BYTES);
        self.grow("growing a table", bytes(current), bytes(desired))
    }

    fn table_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.grow_failed();
        Ok(())
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use wasmtime::{Instance, Module, Store};

    use crate::engine::{PluginLimits, StoreState, engine};
    use crate::error::PluginError;
    use crate::instance::{call_error, new_store};

    fn limits(mib: u64) -> PluginLimits {
        PluginLimits { memory_bytes: mib << 20, ..PluginLimits::default() }
    }

    fn store(limits: &PluginLimits) -> Store<StoreState<()>> {
        new_store("limits-test", limits, (), Path::new("limits-test.wat")).unwrap()
    }

    /// Runs export `run` of a core module in a fresh limited Store; the error as the host names it.
    fn run(wat: &str, limits: &PluginLimits) -> Result<i32, PluginError> {
        let mut store = store(limits);
        let module = Module::new(engine().unwrap(), wat).unwrap();
        let instance = Instance::new(&mut store, &module, &[]).map_err(|e| call_error("limits-test", limits, &e))?;
        let f = instance.get_typed_func::<(), i32>(&mut store, "run").unwrap();
        f.call(&mut store, ()).map_err(|e| call_error("limits-test", limits, &e))
    }

    #[test]
    fn the_budget_covers_all_memories_together() {
        // Two memories of 40 MiB each (640 pages): each under a 64 MiB cap, together over it.
        let two = r#"(module
            (memory $a 1) (memory $b 1)
            (func (export "run") (result i32)
                (drop (memory.grow $a (i32.const 640)))
                (memory.grow $b (i32.const 640))))"#;
        let error = run(two, &limits(64)).unwrap_err();
        assert!(matches!(error, PluginError::Memory { limit_mib: 64, .. }), "{error}");
        assert!(error.to_string().contains("limits-test"), "{error}");
        // The same module within a larger budget is fine.
        assert!(run(two, &limits(128)).is_ok());
    }

    #[test]
    fn a_growing_table_draws_on_the_same_budget() {
        // 16M elements of 8 bytes: 128 MiB of host memory for a table, past a 64 MiB budget.
        let table = r#"(module
            (table $t 1 funcref)
            (func (export "run") (result i32)
                (table.grow $t (ref.null func) (i32.const 16777216))))"#;
        let error = run(table, &limits(64)).unwrap_err();
        assert!(matches!(error, PluginError::Memory { .. }), "{error}");
        assert!(error.to_string().contains("table"), "{error}");
    }

    #[test]
    fn instance_memory_and_table_counts_are_capped() {
        let limits = limits(64);
        let mut store = store(&limits);
        let module = Module::new(engine().unwrap(), "(module (memory 0))").unwrap();
        let created = (0..super::MAX_INSTANCES + 10).take_while(|_| Instance::new(&mut store, &module, &[]).is_ok());
        assert_eq!(created.count(), super::MAX_MEMORIES, "memories stop at the cap");
        let mut store = self::store(&limits);
        let module = Module::new(engine().unwrap(), "(module)").unwrap();
        let created = (0..super::MAX_INSTANCES + 10).take_while(|_| Instance::new(&mut store, &module, &[]).is_ok());
        assert_eq!(created.count(), super::MAX_INSTANCES);
        let many_tables = format!("(module {})", "(table 0 funcref)".repeat(super::MAX_TABLES + 1));
        let mut store = self::store(&limits);
        let module = Module::new(engine().unwrap(), &many_tables).unwrap();
        assert!(Instance::new(&mut store, &module, &[]).is_err());
    }
}
