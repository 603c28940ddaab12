//! Host bindings of the three worlds of `plugin-sdk/wit` (`trinity:plugin@0.1.1`; plugins built against 0.1.0 link to it
//! unchanged, since 0.1.1 only adds).
//!
//! The `types` and `log` interfaces are generated once (in [`reward`]) and shared by the other worlds, so one
//! `log` implementation serves every plugin. Workflows are async on the host side: their `model` calls await
//! the generation engine, which batches the requests of every workflow in flight.

#![allow(missing_docs, unused_qualifications)]

pub(crate) mod reward {
    wasmtime::component::bindgen!({
        world: "reward-plugin",
        path: "../../plugin-sdk/wit",
    });
}

pub(crate) mod workflow {
    wasmtime::component::bindgen!({
        world: "workflow-plugin",
        path: "../../plugin-sdk/wit",
        // Trappable: a call past the workflow's model budget traps the plugin instead of returning an error it
        // could ignore and ask again.
        imports: { "trinity:plugin/model": async | trappable },
        exports: { default: async },
        with: {
            "trinity:plugin/types": super::reward::trinity::plugin::types,
            "trinity:plugin/log": super::reward::trinity::plugin::log,
        },
    });
}

pub(crate) mod operator {
    wasmtime::component::bindgen!({
        world: "operator-plugin",
        path: "../../plugin-sdk/wit",
        with: {
            "trinity:plugin/types": super::reward::trinity::plugin::types,
            "trinity:plugin/log": super::reward::trinity::plugin::log,
        },
    });
}

pub(crate) use reward::trinity::plugin::log;
pub(crate) use reward::trinity::plugin::types;

impl<X: Send> log::Host for crate::engine::StoreState<X> {
    fn log(&mut self, level: log::Level, message: String) {
        let plugin = &self.plugin;
        match level {
            log::Level::Debug => tracing::debug!("plugin {plugin}: {message}"),
            log::Level::Info => tracing::info!("plugin {plugin}: {message}"),
            log::Level::Warn => tracing::warn!("plugin {plugin}: {message}"),
            log::Level::Error => tracing::error!("plugin {plugin}: {message}"),
        }
    }
}

impl<X: Send> types::Host for crate::engine::StoreState<X> {}
