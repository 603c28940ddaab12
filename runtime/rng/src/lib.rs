//! SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014): the one seeded
//! generator of the workspace. Seeded draws (LoRA and value-head initialisation, taskset orders, replay noise,
//! sampling, generated tasks) must give the same numbers on every build and every dependency version, so the
//! generator is written here once, with no dependencies, and never changes: a change here changes every seeded
//! run. It is not cryptographic.
//!
//! Two ways in:
//! - [`mix`], SplitMix64's output step as a bijective function of 64 bits, for values that are a pure function
//!   of their inputs (`uniform(seed, sample, step)`, per-rollout seeds, ids);
//! - [`SplitMix64`], the stream: the state advances by [`GAMMA`] and each output is [`mix`] of the state before.

/// The stream's increment, 2^64 / φ rounded to odd.
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output for state `x`: `x + GAMMA` through the avalanche finalizer (variant 13 of Stafford's
/// mixers). A bijection of `u64`, so distinct inputs never collide.
pub const fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One value from several: the state starts at [`GAMMA`] and each part is added to it before a [`mix`]. The order
/// of the parts matters (`[a, b]` and `[b, a]` differ).
pub fn mix_all(parts: &[u64]) -> u64 {
    parts.iter().fold(GAMMA, |state, part| mix(state.wrapping_add(*part)))
}

/// 53 random bits (the top ones of `bits`) as a number in `[0, 1)`.
pub fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// 53 random bits as the midpoint of their step, `(k + 0.5) / 2^53`: never 0, so safe under a logarithm and for
/// inverse-CDF sampling, where 0 would pick a zero-probability outcome. Below 1 but for the all-ones bits, whose
/// `2^53 - 0.5` rounds to `2^53` in `f64` (1.0, once in 2^53 draws).
pub fn unit_open(bits: u64) -> f64 {
    ((bits >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// 53 random bits as a number in `(0, 1]`: never 0, so its logarithm is finite (Box-Muller's radius).
pub fn unit_nonzero(bits: u64) -> f64 {
    ((bits >> 11) as f64 + 1.0) / (1u64 << 53) as f64
}

/// The SplitMix64 stream from a seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// The stream whose first output is `mix(seed)`.
    pub const fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let out = mix(self.state);
        self.state = self.state.wrapping_add(GAMMA);
        out
    }

    /// The next number in `[0, 1)` ([`unit`]).
    pub fn next_unit(&mut self) -> f64 {
        unit(self.next_u64())
    }

    /// The next number in `(0, 1]` ([`unit_nonzero`]).
    pub fn next_unit_nonzero(&mut self) -> f64 {
        unit_nonzero(self.next_u64())
    }

    /// The next standard normal draw: Box-Muller's cosine branch over two [`SplitMix64::next_unit_nonzero`]
    /// draws (the radius from the first, the angle from the second; the sine branch is not kept).
    pub fn next_normal(&mut self) -> f64 {
        let radius = (-2.0 * self.next_unit_nonzero().ln()).sqrt();
        radius * (std::f64::consts::TAU * self.next_unit_nonzero()).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference outputs of SplitMix64 seeded with 1234567 (the sequence Vigna's `splitmix64.c` prints),
    /// which pin the constants and the order of the steps.
    #[test]
    fn the_stream_is_the_reference_splitmix64() {
        let mut rng = SplitMix64::new(1_234_567);
        let first: Vec<u64> = (0..5).map(|_| rng.next_u64()).collect();
        assert_eq!(
            first,
            [
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423,
                4_593_380_528_125_082_431,
                16_408_922_859_458_223_821,
            ]
        );
    }

    #[test]
    fn mix_is_the_first_output_of_the_stream() {
        for seed in [0, 1, 42, u64::MAX] {
            assert_eq!(SplitMix64::new(seed).next_u64(), mix(seed));
        }
        assert_eq!(mix(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn mix_all_chains_the_parts_in_order() {
        assert_eq!(mix_all(&[]), GAMMA);
        assert_eq!(mix_all(&[7]), mix(GAMMA.wrapping_add(7)));
        assert_eq!(mix_all(&[7, 9]), mix(mix(GAMMA.wrapping_add(7)).wrapping_add(9)));
        assert_ne!(mix_all(&[7, 9]), mix_all(&[9, 7]));
    }

    #[test]
    fn normals_are_box_muller_of_two_draws() {
        let (mut a, mut b) = (SplitMix64::new(5), SplitMix64::new(5));
        let (u1, u2) = (b.next_unit_nonzero(), b.next_unit_nonzero());
        assert_eq!(a.next_normal(), (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos());
        let n = 20_000;
        let draws: Vec<f64> = (0..n).map(|_| a.next_normal()).collect();
        let mean = draws.iter().sum::<f64>() / n as f64;
        let var = draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.03 && (var - 1.0).abs() < 0.05, "mean {mean}, variance {var}");
    }

    #[test]
    fn units_stay_in_their_intervals() {
        for bits in [0, 1, 1 << 11, u64::MAX >> 1, u64::MAX] {
            let (u, o, n) = (unit(bits), unit_open(bits), unit_nonzero(bits));
            assert!((0.0..1.0).contains(&u), "{u}");
            assert!(o > 0.0 && o <= 1.0, "{o}");
            assert!(n > 0.0 && n <= 1.0, "{n}");
        }
        assert_eq!(unit(0), 0.0);
        assert_eq!(unit_nonzero(u64::MAX), 1.0);
        assert!(unit_open(u64::MAX - (1 << 11)) < 1.0);
    }
}
