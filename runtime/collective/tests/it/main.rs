//! Multi-process tests on loopback: the test binary starts copies of itself as the ranks (see
//! `trinity_collective::testing`); `child` is the entry point of those copies.

mod collectives;
mod failures;
mod launched;
#[cfg(feature = "nccl")]
mod nccl;
mod weight_sync;

use std::time::Duration;

use trinity_collective::testing::{Outcome, run_ranks, var};
use trinity_collective::{GroupOptions, ProcessGroup, Store};

/// The entry point of a rank process; returns at once in an ordinary test run.
#[test]
fn child() {
    let Ok(scenario) = std::env::var("TRINITY_IT_SCENARIO") else { return };
    let env = |k: &str| std::env::var(k).unwrap().parse::<usize>().unwrap();
    let (rank, world, port) = (env("TRINITY_IT_RANK"), env("TRINITY_IT_WORLD"), env("TRINITY_IT_PORT") as u16);
    let timeout = Duration::from_millis(env("TRINITY_IT_TIMEOUT_MS") as u64);
    let store = Store::client("127.0.0.1", port, timeout).unwrap();
    let options = GroupOptions { timeout, ..GroupOptions::default() };
    match scenario.as_str() {
        "collectives" => collectives::run(&join(&store, rank, world, &options)),
        "peer_dies" => failures::peer_dies(&join(&store, rank, world, &options)),
        "peer_stalls" => failures::peer_stalls(&join(&store, rank, world, &options)),
        "join" => {
            // Only the rendezvous: the outcome is the test's.
            if let Err(e) = ProcessGroup::new(&store.with_prefix("g").unwrap(), rank, world, &options) {
                println!("ERROR: {e}");
                std::process::exit(3);
            }
        }
        other => panic!("unknown scenario {other}"),
    }
}

fn join(store: &Store, rank: usize, world: usize, options: &GroupOptions) -> ProcessGroup {
    ProcessGroup::new(&store.with_prefix("g").unwrap(), rank, world, options).unwrap()
}

/// Runs `scenario` on one process per `(rank, world)` entry against a store this test hosts.
pub(crate) fn spawn(scenario: &str, ranks: &[(usize, usize)], timeout: Duration) -> Vec<Outcome> {
    let store = Store::server("127.0.0.1", 0, Duration::from_secs(30)).unwrap();
    let envs: Vec<Vec<(String, String)>> = ranks
        .iter()
        .map(|&(rank, world)| {
            vec![
                var("TRINITY_IT_SCENARIO", scenario),
                var("TRINITY_IT_RANK", rank),
                var("TRINITY_IT_WORLD", world),
                var("TRINITY_IT_PORT", store.port()),
                var("TRINITY_IT_TIMEOUT_MS", timeout.as_millis()),
            ]
        })
        .collect();
    run_ranks("child", &envs, timeout * 4 + Duration::from_secs(30))
}
