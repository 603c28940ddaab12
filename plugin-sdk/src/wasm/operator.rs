//! Operator plugins: transform one explore step's experiences before they enter the buffer.
//!
//! An operator sees a view of each experience (ids, reward, lengths, texts, metrics, info) and returns
//! [`ExperienceUpdate`]s naming their source by index: leave one out to drop it, name one twice to repeat it,
//! set `reward` to reshape it, add metrics and info fields. Token sequences are not the operator's to change.

use std::collections::BTreeMap;

/// Generated bindings of the `operator-plugin` world.
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "operator-plugin",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "__export_trinity_operator_world",
        default_bindings_module: "trinity_plugin_sdk::wasm::operator::bindings",
        runtime_path: "trinity_plugin_sdk::wasm::wit_bindgen::rt",
    });
}

super::world_helpers!();

pub use bindings::exports::trinity::plugin::operator::{ExperienceUpdate, ExperienceView, OperatorOutput};

/// An experience operator.
pub trait Operator {
    /// The name configs use (`data_processor.experience_pipeline.operators[].name`).
    const NAME: &'static str;
    /// This plugin's version (usually `env!("CARGO_PKG_VERSION")`).
    const VERSION: &'static str;
    /// One line for `trinity plugins list`.
    const DESCRIPTION: &'static str = "";

    /// Transforms a batch; `args` is the operator's `args` from the config.
    fn apply(
        experiences: &[ExperienceView],
        args: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<OperatorOutput, String>;
}

/// An update that keeps experience `source` as it is.
pub fn keep(source: usize) -> ExperienceUpdate {
    ExperienceUpdate { source: source as u32, reward: None, metrics: Vec::new(), info: String::new() }
}

/// Indices of the experiences of each group (by `group_id`), groups in order of first appearance.
pub fn groups(experiences: &[ExperienceView]) -> Vec<Vec<usize>> {
    let mut order: Vec<&str> = Vec::new();
    let mut members: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, experience) in experiences.iter().enumerate() {
        let group = experience.group_id.as_str();
        if !members.contains_key(group) {
            order.push(group);
        }
        members.entry(group).or_default().push(i);
    }
    order.into_iter().map(|group| members.remove(group).unwrap_or_default()).collect()
}

#[doc(hidden)]
pub fn info<O: Operator>() -> PluginInfo {
    PluginInfo {
        name: O::NAME.to_owned(),
        kind: PluginKind::Operator,
        version: O::VERSION.to_owned(),
        description: O::DESCRIPTION.to_owned(),
    }
}

#[doc(hidden)]
pub fn apply<O: Operator>(experiences: &[ExperienceView], args: &str) -> Result<OperatorOutput, String> {
    O::apply(experiences, &super::json_object(args)?)
}

/// Exports an [`Operator`] implementation as this component's operator.
#[macro_export]
macro_rules! export_operator {
    ($operator:ty) => {
        // Only a wasm build exports anything: natively (unit tests of the plugin crate) the export names, which
        // contain `:` and `/`, are not valid linker symbols.
        // Natively, naming the implementation keeps the plugin's code live, so a native build of the plugin
        // crate (workspace clippy, its unit tests) does not report the whole plugin as dead code.
        #[cfg(not(target_arch = "wasm32"))]
        const _: () = {
            let _ = $crate::wasm::operator::apply::<$operator>;
        };
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::wasm::operator::bindings as __bindings;
            struct __TrinityOperator;
            impl __bindings::Guest for __TrinityOperator {
                fn info() -> __bindings::trinity::plugin::types::PluginInfo {
                    $crate::wasm::operator::info::<$operator>()
                }
            }
            impl __bindings::exports::trinity::plugin::operator::Guest for __TrinityOperator {
                fn apply(
                    experiences: ::std::vec::Vec<__bindings::exports::trinity::plugin::operator::ExperienceView>,
                    args: ::std::string::String,
                ) -> ::std::result::Result<
                    __bindings::exports::trinity::plugin::operator::OperatorOutput,
                    ::std::string::String,
                > {
                    $crate::wasm::operator::apply::<$operator>(&experiences, &args)
                }
            }
            $crate::wasm::operator::bindings::__export_trinity_operator_world!(
                __TrinityOperator with_types_in $crate::wasm::operator::bindings
            );
        };
    };
}
