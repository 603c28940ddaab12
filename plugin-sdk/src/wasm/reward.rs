//! Reward plugins: score responses, one list of named components per response (summed into the reward).
//!
//! Implement [`Reward::score`] for one response; override [`Reward::score_batch`] when scoring many at once is
//! cheaper (the host always sends a whole batch in one call). A wrong or malformed response is a low score, not
//! an error: return `Err` only when the task itself cannot be scored (e.g. it has no reference answer).

/// Generated bindings of the `reward` world.
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "reward-plugin",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "__export_trinity_reward_world",
        default_bindings_module: "trinity_plugin_sdk::wasm::reward::bindings",
        runtime_path: "trinity_plugin_sdk::wasm::wit_bindgen::rt",
    });
}

super::world_helpers!();

pub use bindings::exports::trinity::plugin::reward::Response;

/// A reward function.
pub trait Reward {
    /// The name configs use (`default_reward_fn_type`).
    const NAME: &'static str;
    /// This plugin's version (usually `env!("CARGO_PKG_VERSION")`).
    const VERSION: &'static str;
    /// One line for `trinity plugins list`.
    const DESCRIPTION: &'static str = "";

    /// The components of one response's reward.
    fn score(task: &Task, response: &str) -> Result<Vec<Metric>, String>;

    /// Every response of a batch, in order; `response.task` indexes `tasks`.
    fn score_batch(tasks: &[Task], responses: &[Response]) -> Result<Vec<Vec<Metric>>, String> {
        responses
            .iter()
            .map(|response| {
                let task = tasks.get(response.task as usize).ok_or("a response names a task out of range")?;
                Self::score(task, &response.text)
            })
            .collect()
    }
}

#[doc(hidden)]
pub fn info<R: Reward>() -> PluginInfo {
    PluginInfo {
        name: R::NAME.to_owned(),
        kind: PluginKind::Reward,
        version: R::VERSION.to_owned(),
        description: R::DESCRIPTION.to_owned(),
    }
}

/// Exports a [`Reward`] implementation as this component's reward function.
#[macro_export]
macro_rules! export_reward {
    ($reward:ty) => {
        // Only a wasm build exports anything: natively (unit tests of the plugin crate) the export names, which
        // contain `:` and `/`, are not valid linker symbols.
        // Natively, naming the implementation keeps the plugin's code live, so a native build of the plugin
        // crate (workspace clippy, its unit tests) does not report the whole plugin as dead code.
        #[cfg(not(target_arch = "wasm32"))]
        const _: () = {
            let _ = <$reward as $crate::wasm::reward::Reward>::score_batch;
        };
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::wasm::reward::bindings as __bindings;
            struct __TrinityReward;
            impl __bindings::Guest for __TrinityReward {
                fn info() -> __bindings::trinity::plugin::types::PluginInfo {
                    $crate::wasm::reward::info::<$reward>()
                }
            }
            impl __bindings::exports::trinity::plugin::reward::Guest for __TrinityReward {
                fn score(
                    tasks: ::std::vec::Vec<__bindings::trinity::plugin::types::Task>,
                    responses: ::std::vec::Vec<__bindings::exports::trinity::plugin::reward::Response>,
                ) -> ::std::result::Result<
                    ::std::vec::Vec<::std::vec::Vec<__bindings::trinity::plugin::types::Metric>>,
                    ::std::string::String,
                > {
                    <$reward as $crate::wasm::reward::Reward>::score_batch(&tasks, &responses)
                }
            }
            $crate::wasm::reward::bindings::__export_trinity_reward_world!(__TrinityReward with_types_in $crate::wasm::reward::bindings);
        };
    };
}
