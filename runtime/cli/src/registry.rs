//! Every registered component, as one [`Catalog`] for config resolution.
//!
//! Built-in algorithm components, workflows and reward functions, and the workflows, rewards and operators of
//! WASM plugins (registered before the config is resolved), so config validation sees one registry whatever a
//! name's origin.

use serde_json::{Map, Value};
use trinity_algorithm::BuiltinCatalog;
use trinity_config::{Catalog, ComponentKind, Preset};

#[derive(Debug, Default)]
pub(crate) struct Registry {
    algorithms: BuiltinCatalog,
}

impl Registry {
    pub(crate) fn builtin() -> Self {
        Registry::default()
    }
}

impl Catalog for Registry {
    fn names(&self, kind: ComponentKind) -> Vec<String> {
        match kind {
            ComponentKind::Workflow => trinity_explorer::workflow_names(),
            ComponentKind::RewardFn => trinity_reward::names(),
            ComponentKind::Operator => {
                let mut names = self.algorithms.names(kind);
                names.extend(trinity_explorer::operator_names());
                names.sort_unstable();
                names.dedup();
                names
            }
            _ => self.algorithms.names(kind),
        }
    }

    fn preset(&self, algorithm_type: &str) -> Option<Preset> {
        self.algorithms.preset(algorithm_type)
    }

    fn default_args(&self, kind: ComponentKind, name: &str) -> Option<Map<String, Value>> {
        self.algorithms.default_args(kind, name)
    }

    /// A workflow named by a dotted path, or by a name in Trinity-RFT's `WORKFLOWS` registry in the user's Python
    /// (asked once, only for a name trinity lacks), is a Python class, checked by importing it before the run
    /// (`run.rs`).
    fn accepts(&self, kind: ComponentKind, name: &str) -> bool {
        kind == ComponentKind::Workflow && trinity_pyworkflow::is_python_workflow_name(name)
    }

    /// For a workflow name neither trinity nor Python's registry has, what Python said.
    fn unknown_note(&self, kind: ComponentKind, name: &str) -> Option<String> {
        (kind == ComponentKind::Workflow).then(|| trinity_pyworkflow::unknown_workflow_note(name)).flatten()
    }
}
