//! Failures end in errors within the timeout: a peer that dies, a peer that stops participating, processes that
//! disagree on the world size or claim the same rank.

use std::time::{Duration, Instant};

use tch::Tensor;
use trinity_collective::testing::Outcome;
use trinity_collective::{CollectiveError, ProcessGroup, ReduceOp};

use crate::spawn;

const TIMEOUT: Duration = Duration::from_secs(4);

/// Rank 2 exits abruptly after one collective; the others' next collective must fail.
pub(crate) fn peer_dies(group: &ProcessGroup) {
    let mut t = Tensor::from_slice(&[1f32]);
    group.allreduce(&mut t, ReduceOp::Sum).unwrap();
    if group.rank() == 2 {
        // No destructors, no goodbye: as a killed process.
        std::process::abort();
    }
    expect_failure(group);
}

/// Rank 2 stays alive but never enters the second collective; the others must time out.
pub(crate) fn peer_stalls(group: &ProcessGroup) {
    let mut t = Tensor::from_slice(&[1f32]);
    group.allreduce(&mut t, ReduceOp::Sum).unwrap();
    if group.rank() == 2 {
        std::thread::sleep(TIMEOUT + Duration::from_secs(1));
        std::process::exit(0);
    }
    expect_failure(group);
}

fn expect_failure(group: &ProcessGroup) {
    let start = Instant::now();
    let mut t = Tensor::from_slice(&[1f32; 1024]);
    let err = group.allreduce(&mut t, ReduceOp::Sum).unwrap_err();
    let took = start.elapsed();
    println!("rank {}: error after {:.2} s: {err}", group.rank(), took.as_secs_f64());
    assert!(took <= TIMEOUT + Duration::from_secs(2), "took {took:?}");
    // The group refuses further work.
    let again = group.allreduce(&mut t, ReduceOp::Sum).unwrap_err();
    assert!(matches!(again, CollectiveError::Failed(_)), "{again}");
    println!("rank {}: FAILED-AS-EXPECTED", group.rank());
    // Leave without waiting for Gloo's teardown of the broken connections.
    std::process::exit(0);
}

fn report(outcomes: &[Outcome]) -> String {
    outcomes
        .iter()
        .map(|o| format!("--- {} {:?} after {:.2} s:\n{}", o.index, o.status, o.elapsed.as_secs_f64(), o.output))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The lines the ranks printed themselves (c10d's own log lines left out).
fn summary(outcomes: &[Outcome]) -> String {
    outcomes
        .iter()
        .flat_map(|o| o.output.lines().filter(|l| l.contains("error after") || l.contains("ERROR:")).map(str::to_owned))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_dead_peer_fails_the_others_within_the_timeout() {
    let outcomes = spawn("peer_dies", &[(0, 3), (1, 3), (2, 3)], TIMEOUT);
    println!("{}", summary(&outcomes));
    for o in &outcomes[..2] {
        assert!(o.succeeded() && o.output.contains("FAILED-AS-EXPECTED"), "{}", report(&outcomes));
    }
    assert!(!outcomes[2].succeeded(), "{}", report(&outcomes));
}

#[test]
fn a_stalled_peer_times_the_others_out() {
    let outcomes = spawn("peer_stalls", &[(0, 3), (1, 3), (2, 3)], TIMEOUT);
    println!("{}", summary(&outcomes));
    for o in &outcomes[..2] {
        assert!(o.succeeded() && o.output.contains("FAILED-AS-EXPECTED"), "{}", report(&outcomes));
        assert!(o.output.contains("timed out"), "{}", report(&outcomes));
    }
}

#[test]
fn a_wrong_world_size_is_an_error_for_everyone() {
    let outcomes = spawn("join", &[(0, 2), (1, 3)], TIMEOUT);
    println!("{}", summary(&outcomes));
    for o in &outcomes {
        assert_eq!(o.status.and_then(|s| s.code()), Some(3), "{}", report(&outcomes));
        assert!(o.output.contains("world size"), "{}", report(&outcomes));
        assert!(o.elapsed < TIMEOUT + Duration::from_secs(5), "{}", report(&outcomes));
    }
}

#[test]
fn a_duplicate_rank_is_an_error_for_everyone() {
    let outcomes = spawn("join", &[(0, 2), (0, 2)], TIMEOUT);
    println!("{}", summary(&outcomes));
    for o in &outcomes {
        assert_eq!(o.status.and_then(|s| s.code()), Some(3), "{}", report(&outcomes));
        assert!(o.output.contains("already taken"), "{}", report(&outcomes));
    }
}

#[test]
fn a_missing_rank_times_out_naming_it() {
    let outcomes = spawn("join", &[(0, 3), (2, 3)], Duration::from_secs(1));
    println!("{}", summary(&outcomes));
    for o in &outcomes {
        assert_eq!(o.status.and_then(|s| s.code()), Some(3), "{}", report(&outcomes));
        assert!(o.output.contains("[1]"), "{}", report(&outcomes));
    }
}
