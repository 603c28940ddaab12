//! Loading a plugin file: read, check that it is a component of a compatible `trinity:plugin` version, compile
//! (through the engine's cache), find its kind from what it exports.

use std::path::Path;

use wasmtime::component::Component;

use crate::engine::engine;
use crate::error::PluginError;

/// The WIT package version this host implements.
pub const WIT_VERSION: &str = "0.1.1";
/// Plugin versions this host accepts (semver: same major, and for 0.x the same minor; a patch release only adds,
/// so a plugin of an older patch links unchanged, while one of a newer patch may need what this host lacks).
pub const WIT_COMPATIBLE: &str = "0.1.0 to 0.1.1";

/// What a plugin provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PluginKind {
    /// A reward function (`default_reward_fn_type`).
    Reward,
    /// A workflow (`default_workflow_type`).
    Workflow,
    /// An experience operator (`data_processor.experience_pipeline.operators`).
    Operator,
}

impl PluginKind {
    /// The word `trinity plugins list` prints.
    pub fn label(self) -> &'static str {
        match self {
            PluginKind::Reward => "reward",
            PluginKind::Workflow => "workflow",
            PluginKind::Operator => "operator",
        }
    }

    fn interface(self) -> &'static str {
        match self {
            PluginKind::Reward => "reward",
            PluginKind::Workflow => "workflow",
            PluginKind::Operator => "operator",
        }
    }
}

/// Reads and compiles `path`, refusing anything that is not a component built against a compatible
/// `trinity:plugin` version.
pub(crate) fn compile(path: &Path) -> Result<(Component, PluginKind), PluginError> {
    let bytes = std::fs::read(path).map_err(|source| PluginError::Read { path: path.to_owned(), source })?;
    let not_component = |message: &str| PluginError::NotAComponent { path: path.to_owned(), message: message.into() };
    match bytes.get(..8) {
        Some([0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00]) => {}
        Some([0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00]) => {
            return Err(not_component("it is a core WebAssembly module (wasm32-unknown-unknown or wasip1 output)"));
        }
        // WAT text is accepted too (tests write tiny plugins that way).
        _ if path.extension().is_some_and(|e| e == "wat") => {}
        _ => return Err(not_component("the file does not start with the WebAssembly component header")),
    }
    let component = Component::new(engine()?, &bytes).map_err(|e| not_component(&format!("{e:#}")))?;
    let kind = check_interfaces(path, &component)?;
    Ok((component, kind))
}

/// Checks every `trinity:plugin/...` name the component imports or exports against [`WIT_VERSION`], then finds
/// its kind.
pub(crate) fn check_interfaces(path: &Path, component: &Component) -> Result<PluginKind, PluginError> {
    let engine = engine()?;
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine).map(|(name, _)| name.to_owned()).collect();
    let imports: Vec<String> = ty.imports(engine).map(|(name, _)| name.to_owned()).collect();
    for name in exports.iter().chain(&imports) {
        if let Some(version) = trinity_version(name)
            && !compatible(version)
        {
            return Err(PluginError::IncompatibleVersion {
                path: path.to_owned(),
                found: version.to_owned(),
                hosted: WIT_VERSION,
                compatible: WIT_COMPATIBLE,
            });
        }
    }
    let exported = |kind: PluginKind| {
        exports.iter().any(|name| {
            name.strip_prefix("trinity:plugin/").is_some_and(|rest| rest.split('@').next() == Some(kind.interface()))
        })
    };
    [PluginKind::Reward, PluginKind::Workflow, PluginKind::Operator]
        .into_iter()
        .find(|kind| exported(*kind))
        .ok_or_else(|| PluginError::NotAPlugin { path: path.to_owned(), exports: exports.join(", ") })
}

/// The version of a `trinity:plugin/<interface>@<version>` name.
fn trinity_version(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("trinity:plugin/")?;
    Some(rest.split_once('@').map_or("", |(_, version)| version))
}

/// Whether a plugin built against `version` can run on this host: the host must satisfy the caret requirement
/// `^version` (the same major version, for 0.x the same minor: semver's rule for breaking changes before 1.0,
/// and no older than the plugin, since a newer release may add functions the plugin imports). It is the rule
/// the plugin registry applies to a release's `api` range, from the same `semver` crate. A WIT version may leave
/// out its patch (`0.1`).
pub(crate) fn compatible(version: &str) -> bool {
    let full = if version.split('.').count() == 2 { format!("{version}.0") } else { version.to_owned() };
    let (Ok(plugin), Ok(host)) = (semver::Version::parse(&full), semver::Version::parse(WIT_VERSION)) else {
        return false;
    };
    let caret = semver::Comparator {
        op: semver::Op::Caret,
        major: plugin.major,
        minor: Some(plugin.minor),
        patch: Some(plugin.patch),
        pre: plugin.pre,
    };
    caret.matches(&host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_follow_semver_before_and_after_one() {
        assert!(compatible("0.1.0"));
        assert!(compatible("0.1.1"));
        assert!(!compatible("0.1.7"), "a newer patch may import what this host lacks");
        assert!(!compatible("0.2.0"));
        assert!(!compatible("1.0.0"));
        assert!(!compatible("garbage"));
        assert!(compatible("0.1"), "a version without its patch");
        assert!(!compatible("0"), "a bare major says nothing about the minor");
        assert_eq!(trinity_version("trinity:plugin/reward@0.1.0"), Some("0.1.0"));
        assert_eq!(trinity_version("wasi:cli/stderr@0.2.0"), None);
    }
}
