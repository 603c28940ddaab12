//! What is not a compatible trinity plugin is refused before anything runs, with a message that says why.

use std::path::PathBuf;

use trinity_plugin::{PluginError, PluginLimits};

fn write(dir: &tempfile::TempDir, name: &str, contents: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

/// A component exporting a `trinity:plugin/reward` interface at `version` with one `noop` function.
fn component_wat(version: &str) -> String {
    format!(
        r#"(component
            (core module $m (func (export "f") (result i32) i32.const 0))
            (core instance $i (instantiate $m))
            (func $f (result u32) (canon lift (core func $i "f")))
            (instance $api (export "noop" (func $f)))
            (export "trinity:plugin/reward@{version}" (instance $api))
        )"#
    )
}

#[test]
fn an_incompatible_wit_version_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    for version in ["1.0.0", "0.2.0", "0.1.9"] {
        let path = write(&dir, &format!("future-{version}.wat"), component_wat(version).as_bytes());
        let error = trinity_plugin::load(&path, PluginLimits::default()).unwrap_err();
        assert!(matches!(error, PluginError::IncompatibleVersion { .. }), "{error}");
        let text = error.to_string();
        assert!(text.contains(&format!("trinity:plugin@{version}")), "{text}");
        assert!(text.contains("trinity:plugin@0.1.1") && text.contains("rebuild the plugin"), "{text}");
        assert!(text.contains("future-"), "names the file: {text}");
    }
}

#[test]
fn a_compatible_version_with_a_wrong_shape_fails_to_link_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "odd.wat", component_wat("0.1.0").as_bytes());
    let error = trinity_plugin::load(&path, PluginLimits::default()).unwrap_err();
    assert!(matches!(error, PluginError::Link { .. }), "{error}");
}

#[test]
fn core_modules_and_foreign_components_are_not_plugins() {
    let dir = tempfile::tempdir().unwrap();
    let core = write(&dir, "core.wasm", b"\0asm\x01\0\0\0");
    let error = trinity_plugin::load(&core, PluginLimits::default()).unwrap_err();
    assert!(matches!(error, PluginError::NotAComponent { .. }), "{error}");
    assert!(error.to_string().contains("core WebAssembly module"), "{error}");

    let text = write(&dir, "text.wasm", b"hello");
    assert!(matches!(trinity_plugin::load(&text, PluginLimits::default()), Err(PluginError::NotAComponent { .. })));

    let foreign = write(
        &dir,
        "foreign.wat",
        br#"(component
            (core module $m (func (export "f") (result i32) i32.const 0))
            (core instance $i (instantiate $m))
            (func $f (result u32) (canon lift (core func $i "f")))
            (export "answer" (func $f))
        )"#,
    );
    let error = trinity_plugin::load(&foreign, PluginLimits::default()).unwrap_err();
    assert!(matches!(error, PluginError::NotAPlugin { .. }), "{error}");

    let missing = dir.path().join("missing.wasm");
    assert!(matches!(trinity_plugin::load(&missing, PluginLimits::default()), Err(PluginError::Read { .. })));
}
