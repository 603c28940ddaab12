//! Host overhead of one reward call on 1024 responses (128 tasks × 8 rollouts, GSM8K-sized texts).
//!
//! `cargo bench -p trinity-plugin --bench reward_call` builds the plugins, then times `RewardPlugin::score`:
//! with `hostile_reward` in its well-behaved mode (a constant score: what remains is the host's cost — copying
//! tasks and responses across the boundary, lifting the results, validation, the worker-thread hop) and with
//! `gsm8k_reward` (the same plus real answer extraction). The target is under 1 ms per 1024-response call.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use trinity_plugin::{Plugin, PluginLimits, RewardTask};

fn main() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-plugins");
    let packages = ["hostile_reward", "gsm8k_reward"];
    let paths = trinity_plugin::build::build_plugins(&workspace, &packages, &target).unwrap_or_else(|e| panic!("{e}"));

    let tasks: Vec<RewardTask> = (0..128)
        .map(|i| {
            let question = format!("Natalia sold clips to {i} of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?");
            let truth = format!("Natalia sold {i}/2 = <<{i}/2={}>>{} clips in May.\n#### {}", i / 2, i / 2, i + i / 2);
            let raw: Map<String, Value> =
                serde_json::from_value(json!({"question": question, "answer": truth})).unwrap_or_default();
            RewardTask {
                taskset: "gsm8k".into(),
                index: i,
                prompt: Some(question),
                truth: Some(truth),
                system_prompt: None,
                raw,
                args: Map::new(),
            }
        })
        .collect();
    let texts: Vec<String> = (0..1024)
        .map(|r| {
            let i = r / 8;
            format!(
                "<think>She sold {i} in April and half of that, {}, in May, so {i} + {} = {} in total.</think> #### {}",
                i / 2,
                i / 2,
                i + i / 2,
                i + i / 2 + (r % 2)
            )
        })
        .collect();
    let responses: Vec<(u32, &str)> = texts.iter().enumerate().map(|(r, t)| ((r / 8) as u32, t.as_str())).collect();
    let bytes: usize = texts.iter().map(String::len).sum::<usize>()
        + tasks.iter().map(|t| t.truth.as_ref().map_or(0, String::len) * 3).sum::<usize>();
    println!("reward call: 1024 responses over 128 tasks (~{} KiB crossing the boundary)", bytes / 1024);

    for (package, path) in packages.iter().zip(&paths) {
        let plugin = match trinity_plugin::load(path, PluginLimits::default()) {
            Ok(Plugin::Reward(plugin)) => plugin,
            Ok(_) => panic!("{package} is not a reward plugin"),
            Err(error) => panic!("{error}"),
        };
        for _ in 0..20 {
            plugin.score(&tasks, &responses).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut times: Vec<Duration> = (0..200)
            .map(|_| {
                let started = Instant::now();
                let scores = plugin.score(&tasks, &responses).unwrap_or_else(|e| panic!("{e}"));
                let elapsed = started.elapsed();
                assert_eq!(scores.len(), 1024);
                elapsed
            })
            .collect();
        times.sort_unstable();
        let mean = times.iter().sum::<Duration>() / times.len() as u32;
        let what = if *package == "hostile_reward" {
            "host overhead (constant reward)"
        } else {
            "gsm8k_reward (real scoring)"
        };
        println!(
            "  {what:<34} median {:>7.3} ms  min {:>7.3} ms  p90 {:>7.3} ms  mean {:>7.3} ms   target < 1 ms",
            ms(times[times.len() / 2]),
            ms(times[0]),
            ms(times[times.len() * 9 / 10]),
            ms(mean)
        );
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}
