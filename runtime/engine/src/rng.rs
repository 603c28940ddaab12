//! A counter-based random stream per sample, so that sampling is reproducible whatever the batch looks like.
//!
//! The uniform number that picks token `step` of sample `sample` of a request with seed `seed` is a pure
//! function `uniform(seed, sample, step)`: it does not depend on which other sequences share the decode step,
//! on when the request was admitted, or on a global generator (torch's global RNG would make results depend on
//! batch composition and on every other caller in the process). The mixing function is SplitMix64's output
//! step ([`trinity_rng::mix`]) applied in a chain, which passes BigCrush as a stream and is plenty for choosing
//! tokens; it is not meant to be cryptographic.

use trinity_rng::mix;

/// A uniform number in (0, 1] for (seed, sample, step), [`trinity_rng::unit_open`] of the chained mix.
///
/// Never exactly 0, so inverse-CDF sampling never selects a zero-probability token at the start of the
/// vocabulary; exactly 1 only for one mixed value in 2^53 (its midpoint rounds up).
pub(crate) fn uniform(seed: u64, sample: u64, step: u64) -> f64 {
    trinity_rng::unit_open(mix(mix(mix(seed) ^ sample) ^ step))
}

/// A seed for requests that do not bring one: distinct per call within a process and across runs.
pub(crate) fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    mix(nanos ^ mix(COUNTER.fetch_add(1, Ordering::Relaxed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_deterministic_distinct_and_uniform() {
        assert_eq!(uniform(1, 2, 3), uniform(1, 2, 3));
        assert_ne!(uniform(1, 2, 3), uniform(1, 3, 3));
        assert_ne!(uniform(1, 2, 3), uniform(2, 2, 3));
        let n = 20_000;
        let mut buckets = [0usize; 10];
        for step in 0..n {
            let u = uniform(42, 0, step);
            assert!(u > 0.0 && u < 1.0);
            buckets[(u * 10.0) as usize] += 1;
        }
        for b in buckets {
            assert!((b as f64 - n as f64 / 10.0).abs() < 200.0, "{buckets:?}");
        }
        assert_ne!(fresh_seed(), fresh_seed());
    }

    /// Seeded sampling depends on these numbers: a run with a seed must draw the same tokens on every build.
    #[test]
    fn uniforms_are_pinned() {
        assert_eq!(uniform(1, 2, 3), 0.814_259_011_529_328);
        assert_eq!(uniform(0, 0, 0), 0.138_709_410_145_554_32);
        assert_eq!(uniform(42, 1, 7), 0.105_840_866_598_637_5);
    }
}
