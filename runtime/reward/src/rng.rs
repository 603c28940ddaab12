//! The generators' random numbers: [`trinity_rng::SplitMix64`], fixed forever, so generated task files never
//! change with a dependency's version, and the two draws the generators make from it.

#[derive(Debug, Clone)]
pub(crate) struct Rng(trinity_rng::SplitMix64);

impl Rng {
    /// The stream of `seed`, offset by a constant so seed 0 does not start where every other seeded stream does.
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(trinity_rng::SplitMix64::new(seed ^ 0x5DEE_CE66_D1A4_F87B))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `lo..=hi` (`lo <= hi`).
    pub(crate) fn range(&mut self, lo: i64, hi: i64) -> i64 {
        let span = (hi - lo + 1).max(1) as u128;
        lo + ((self.next_u64() as u128 * span) >> 64) as i64
    }

    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        let i = self.range(0, items.len() as i64 - 1) as usize;
        &items[i.min(items.len() - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Generated task files depend on these numbers: they must not move.
    #[test]
    fn draws_are_pinned() {
        let mut rng = Rng::new(7);
        assert_eq!(
            [rng.next_u64(), rng.next_u64(), rng.next_u64()],
            [4_957_558_393_291_837_649, 11_595_824_547_947_727_625, 15_591_061_462_519_421_829]
        );
        let mut rng = Rng::new(7);
        assert_eq!([0; 4].map(|_| rng.range(1, 100)), [27, 63, 85, 59]);
    }
}
