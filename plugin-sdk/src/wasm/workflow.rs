//! Workflow plugins: run one task against the rollout model, any number of turns, and return scored
//! experiences.
//!
//! Talk to the model with [`chat`] (or [`generate`] for raw tokens). For a multi-turn episode, send the whole
//! conversation each turn, with the model's earlier replies as `assistant` messages exactly as [`chat`]
//! returned their text: the host then extends the recorded token sequence instead of re-tokenizing, and an
//! [`Experience`] naming the episode's last turn trains on every token the model sampled (environment text in
//! between is context, masked out of the loss).

/// Generated bindings of the `workflow-plugin` world.
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "workflow-plugin",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "__export_trinity_workflow_world",
        default_bindings_module: "trinity_plugin_sdk::wasm::workflow::bindings",
        runtime_path: "trinity_plugin_sdk::wasm::wit_bindgen::rt",
    });
}

super::world_helpers!();

pub use bindings::exports::trinity::plugin::workflow::{Experience, RunContext};
pub use bindings::trinity::plugin::model::{
    AuxiliaryReply, Completion, FinishReason, SamplingParams, apply_chat_template, auxiliary_logprobs,
    auxiliary_models, chat, chat_auxiliary, default_params, detokenize, generate, tokenize,
};

/// A workflow.
pub trait Workflow {
    /// The name configs use (`default_workflow_type`).
    const NAME: &'static str;
    /// This plugin's version (usually `env!("CARGO_PKG_VERSION")`).
    const VERSION: &'static str;
    /// One line for `trinity plugins list`.
    const DESCRIPTION: &'static str = "";

    /// Runs `task` and returns one experience per rollout (`context.repeat_times` of them).
    fn run(task: &Task, context: &RunContext) -> Result<Vec<Experience>, String>;
}

/// A chat message.
pub fn message(role: &str, content: impl Into<String>) -> Message {
    Message { role: role.to_owned(), content: content.into() }
}

/// One sample of `messages` with the task's default sampling parameters.
pub fn chat_once(messages: &[Message]) -> Result<Completion, String> {
    let params = default_params();
    chat(messages, &params)?.into_iter().next().ok_or_else(|| "the model returned no sample".to_owned())
}

/// One reply of the auxiliary model called `model` (a judge) to `messages`, with the task's default sampling
/// parameters. Needs a host of WIT 0.1.1 or later.
pub fn chat_auxiliary_once(model: &str, messages: &[Message]) -> Result<AuxiliaryReply, String> {
    let params = default_params();
    chat_auxiliary(model, messages, &params)?
        .into_iter()
        .next()
        .ok_or_else(|| format!("auxiliary model `{model}` returned no sample"))
}

#[doc(hidden)]
pub fn info<W: Workflow>() -> PluginInfo {
    PluginInfo {
        name: W::NAME.to_owned(),
        kind: PluginKind::Workflow,
        version: W::VERSION.to_owned(),
        description: W::DESCRIPTION.to_owned(),
    }
}

/// Exports a [`Workflow`] implementation as this component's workflow.
#[macro_export]
macro_rules! export_workflow {
    ($workflow:ty) => {
        // Only a wasm build exports anything: natively (unit tests of the plugin crate) the export names, which
        // contain `:` and `/`, are not valid linker symbols.
        // Natively, naming the implementation keeps the plugin's code live, so a native build of the plugin
        // crate (workspace clippy, its unit tests) does not report the whole plugin as dead code.
        #[cfg(not(target_arch = "wasm32"))]
        const _: () = {
            let _ = <$workflow as $crate::wasm::workflow::Workflow>::run;
        };
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::wasm::workflow::bindings as __bindings;
            struct __TrinityWorkflow;
            impl __bindings::Guest for __TrinityWorkflow {
                fn info() -> __bindings::trinity::plugin::types::PluginInfo {
                    $crate::wasm::workflow::info::<$workflow>()
                }
            }
            impl __bindings::exports::trinity::plugin::workflow::Guest for __TrinityWorkflow {
                fn run(
                    task: __bindings::trinity::plugin::types::Task,
                    context: __bindings::exports::trinity::plugin::workflow::RunContext,
                ) -> ::std::result::Result<
                    ::std::vec::Vec<__bindings::exports::trinity::plugin::workflow::Experience>,
                    ::std::string::String,
                > {
                    <$workflow as $crate::wasm::workflow::Workflow>::run(&task, &context)
                }
            }
            $crate::wasm::workflow::bindings::__export_trinity_workflow_world!(
                __TrinityWorkflow with_types_in $crate::wasm::workflow::bindings
            );
        };
    };
}
