//! The meeting that precedes a process group: every process checks on the store that the others agree on the
//! world size and that no rank is taken twice, and waits for all of them, before Gloo's own rendezvous starts.
//!
//! Gloo's rendezvous only waits for addresses under `rank_0 … rank_{n-1}`: a process started with the wrong world
//! size or a duplicate rank shows up there as a 30-minute hang or a connection to the wrong peer. Here the first
//! process to arrive fixes the world size (`rendezvous/world_size`, compare-and-set), each rank claims
//! `rendezvous/rank/<r>`, and a process that finds a disagreement writes `rendezvous/error` before it fails, so the
//! others fail at once with the same explanation instead of waiting out the timeout.

use std::time::{Duration, Instant};

use crate::error::{CollectiveError, Result};
use crate::store::Store;

const POLL: Duration = Duration::from_millis(20);

/// Who is joining: written into the rank's claim so that a duplicate names both processes.
fn identity() -> String {
    format!("pid {} on {}", std::process::id(), hostname())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_else(|_| "?".into())
}

/// Runs the meeting for `rank` of `world_size` on `store` (a prefix fresh for this group), waiting up to `timeout`.
pub(crate) fn meet(store: &Store, rank: usize, world_size: usize, timeout: Duration) -> Result<()> {
    let fail = |problem: String| CollectiveError::Rendezvous { rank, problem };
    let abort = |problem: String| -> CollectiveError {
        // Best effort: the others learn why and fail at once; if the store itself is gone they time out.
        let _ = store.set("rendezvous/error", format!("rank {rank}: {problem}").as_bytes());
        fail(problem)
    };
    let size = world_size.to_string();
    let agreed = store.compare_set("rendezvous/world_size", b"", size.as_bytes())?;
    if agreed != size.as_bytes() {
        return Err(abort(format!(
            "world size {world_size} disagrees with the {} another process joined with",
            String::from_utf8_lossy(&agreed)
        )));
    }
    let me = identity();
    let claim = store.compare_set(&format!("rendezvous/rank/{rank}"), b"", me.as_bytes())?;
    if claim != me.as_bytes() {
        return Err(abort(format!("rank {rank} is already taken by {}", String::from_utf8_lossy(&claim))));
    }
    let joined = store.add("rendezvous/joined", 1)?;
    if joined > world_size as i64 {
        return Err(abort(format!("{joined} processes joined a group of world size {world_size}")));
    }
    let start = Instant::now();
    loop {
        if store.check(&["rendezvous/error"])? {
            let why = store.get("rendezvous/error")?;
            return Err(fail(format!("another process failed the rendezvous: {}", String::from_utf8_lossy(&why))));
        }
        let joined = store.add("rendezvous/joined", 0)?;
        if joined == world_size as i64 {
            return Ok(());
        }
        if joined > world_size as i64 {
            return Err(abort(format!("{joined} processes joined a group of world size {world_size}")));
        }
        if start.elapsed() >= timeout {
            let mut missing = Vec::new();
            for r in 0..world_size {
                if !store.check(&[&format!("rendezvous/rank/{r}")])? {
                    missing.push(r);
                }
            }
            return Err(CollectiveError::Timeout {
                op: "rendezvous",
                timeout,
                detail: Some(format!("rank {rank} waited for ranks {missing:?} of world size {world_size}")),
            });
        }
        std::thread::sleep(POLL);
    }
}
