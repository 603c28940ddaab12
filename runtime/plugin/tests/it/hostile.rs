//! A hostile reward plugin costs its batch, with a named error, and the next batch is scored normally.

use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use trinity_plugin::{Plugin, PluginError, PluginLimits, RewardPlugin, RewardTask};

use crate::support::{capture_log, log_text, wasm};

fn hostile(limits: PluginLimits) -> std::sync::Arc<RewardPlugin> {
    match trinity_plugin::load(&wasm("hostile_reward"), limits).unwrap() {
        Plugin::Reward(plugin) => plugin,
        other => panic!("hostile_reward loaded as {:?}", other.info().kind),
    }
}

fn task(row: Value) -> RewardTask {
    let raw: Map<String, Value> = serde_json::from_value(row).unwrap();
    RewardTask { taskset: "t".into(), raw, ..RewardTask::default() }
}

fn score(plugin: &RewardPlugin, row: Value) -> Result<f64, PluginError> {
    let scores = plugin.score(&[task(row)], &[(0, "response"), (0, "another")])?;
    Ok(scores[0].values().sum())
}

/// After any failure the plugin must score a well-behaved batch again.
fn still_works(plugin: &RewardPlugin) {
    assert_eq!(score(plugin, json!({})).unwrap(), 1.0);
}

fn short_limits() -> PluginLimits {
    PluginLimits { call_timeout: Duration::from_millis(500), memory_bytes: 64 << 20, ..PluginLimits::default() }
}

#[test]
fn an_endless_loop_hits_the_deadline() {
    let plugin = hostile(short_limits());
    let started = Instant::now();
    let error = score(&plugin, json!({"behavior": "loop"})).unwrap_err();
    assert!(matches!(error, PluginError::Deadline { .. }), "{error}");
    assert!(error.to_string().contains("hostile_reward") && error.to_string().contains("deadline"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    still_works(&plugin);
}

#[test]
fn a_4_gib_allocation_hits_the_memory_limit() {
    let plugin = hostile(short_limits());
    let error = score(&plugin, json!({"behavior": "alloc"})).unwrap_err();
    assert!(matches!(error, PluginError::Memory { limit_mib: 64, .. }), "{error}");
    still_works(&plugin);
}

#[test]
fn a_trap_is_named_and_the_store_rebuilt() {
    let plugin = hostile(short_limits());
    let error = score(&plugin, json!({"behavior": "trap"})).unwrap_err();
    assert!(matches!(error, PluginError::Trap { .. }), "{error}");
    assert!(error.to_string().contains("unreachable"), "{error}");
    still_works(&plugin);
    // Twice in a row: the second trap happens in the rebuilt Store.
    assert!(score(&plugin, json!({"behavior": "trap"})).is_err());
    still_works(&plugin);
}

#[test]
fn files_are_invisible_unless_granted() {
    let dir = tempfile::tempdir().unwrap();
    let granted = dir.path().join("granted");
    std::fs::create_dir(&granted).unwrap();
    std::fs::write(granted.join("notes.txt"), "twelve bytes").unwrap();
    std::fs::write(dir.path().join("secret.txt"), "secret").unwrap();
    let outside = dir.path().join("secret.txt").display().to_string();

    let plugin = hostile(short_limits());
    let error = score(&plugin, json!({"behavior": "read", "path": outside})).unwrap_err();
    assert!(matches!(error, PluginError::Guest { .. }) && error.to_string().contains("cannot read"), "{error}");
    let error = score(&plugin, json!({"behavior": "read", "path": "/etc/hostname"})).unwrap_err();
    assert!(error.to_string().contains("cannot read"), "{error}");

    let plugin = hostile(PluginLimits { allow_dir: Some(granted.clone()), ..short_limits() });
    assert_eq!(score(&plugin, json!({"behavior": "read", "path": "/data/notes.txt"})).unwrap(), 12.0);
    for path in ["/data/../secret.txt", outside.as_str()] {
        let error = score(&plugin, json!({"behavior": "read", "path": path})).unwrap_err();
        assert!(error.to_string().contains("cannot read"), "{path}: {error}");
    }
    still_works(&plugin);
}

#[test]
fn bad_outputs_are_refused() {
    let plugin = hostile(short_limits());
    let cases = [
        ("nan", "is NaN"),
        ("missing", "got no reward component"),
        ("short", "returned 1 score lists for 2 responses"),
        ("error", "this task cannot be scored"),
    ];
    for (behavior, expected) in cases {
        let error = score(&plugin, json!({"behavior": behavior})).unwrap_err();
        assert!(error.to_string().contains(expected), "{behavior}: {error}");
        assert!(error.to_string().contains("hostile_reward"), "{behavior}: {error}");
    }
    still_works(&plugin);
}

#[test]
fn a_flood_of_stderr_is_capped_and_logged_under_the_plugin_name() {
    capture_log();
    let plugin = hostile(PluginLimits { call_timeout: Duration::from_secs(20), ..short_limits() });
    assert_eq!(score(&plugin, json!({"behavior": "stderr"})).unwrap(), 1.0, "printing is no failure");
    let log = log_text();
    let lines: Vec<&str> = log.lines().filter(|line| line.contains("plugin hostile_reward stderr")).collect();
    assert!(lines.iter().any(|line| line.contains("more bytes of stderr dropped")), "no marker in the log");
    let logged: usize = lines.iter().map(|line| line.len()).sum();
    assert!(logged < 1 << 20, "{logged} bytes of plugin output reached the log");
    still_works(&plugin);
}
