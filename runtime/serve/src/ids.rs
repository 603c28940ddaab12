//! Response and tool-call ids: unique within a process and, with overwhelming likelihood, across processes
//! (they key recorded experiences, and an agent may talk to a restarted server).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use trinity_rng::mix;

/// Hands out ids as `prefix` + 24 hex digits: a per-process random base mixed with a counter.
#[derive(Debug)]
pub(crate) struct IdGenerator {
    base: u64,
    counter: AtomicU64,
}

impl IdGenerator {
    pub(crate) fn new() -> Self {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        // The address of a stack value adds ASLR entropy to the clock and the process id.
        let local = 0u8;
        let address = std::ptr::addr_of!(local) as u64;
        IdGenerator { base: mix(nanos ^ mix(u64::from(std::process::id())) ^ mix(address)), counter: AtomicU64::new(0) }
    }

    /// A fresh id such as `chatcmpl-1f3a…`.
    pub(crate) fn next(&self, prefix: &str) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let a = mix(self.base ^ n);
        let b = mix(a ^ self.base.rotate_left(17));
        format!("{prefix}{a:016x}{:08x}", b >> 32)
    }
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub(crate) fn unix_seconds() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_prefixed() {
        let ids = IdGenerator::new();
        let a = ids.next("chatcmpl-");
        let b = ids.next("chatcmpl-");
        assert_ne!(a, b);
        assert!(a.starts_with("chatcmpl-") && a.len() == "chatcmpl-".len() + 24, "{a}");
    }
}
