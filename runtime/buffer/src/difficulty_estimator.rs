//! BOTS's pass-rate beliefs behind the `difficulty_based` task selector (Trinity-RFT's
//! `InterpolationBetaPREstimator`), and the small seeded random stream its sampling uses.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{BufferError, Result};
use crate::selector::mix;

/// Discount of the capability estimate's moving average (Trinity's `cap_coef_update_discount`).
const CAP_COEF_DISCOUNT: f64 = 0.9;

/// BOTS's pass-rate beliefs (Trinity's `InterpolationBetaPREstimator`): one Beta(α, β) per row, α = β = 1 at
/// first, and the two offline pass rates `\[f0, f1\]` of each row (a weaker and a stronger reference model).
///
/// Feedback with observed pass rates y on rows I: the model's capability c = (mean y − mean f0\[I\]) /
/// (mean f1\[I\] − mean f0\[I\] + 1e-6), averaged over feedbacks with discount 0.9; every row's interpolated pass
/// rate p̃ = clip(f0 + c·(f1 − f0), 0, 1), except p̃\[I\] = y; s̄\[I\] = m·y, f̄\[I\] = m·(1 − y), 0 elsewhere; then
/// for all rows α ← (1−λ)α + λ + (1−ρ)s̄ + ρ·m·p̃ and β ← (1−λ)β + λ + (1−ρ)f̄ + ρ·m·(1−p̃). With
/// `adaptive_rho`, ρ halves whenever the mean |p̃\[I\] − y| (before the override) is ≥ 0.25.
///
/// Selection: predicted pass rate α/(α+β), or a Beta(α, β) sample with `do_sample`; score −|target − pr|;
/// `tau` 0 takes the top scores, otherwise rows are sampled without replacement with probabilities
/// softmax(score/τ) (drawn as Gumbel-top-k, the same distribution as `torch.multinomial` without replacement).
/// Randomness is seeded by `(seed, draws so far)` like Trinity's `seed + current_index`, with this crate's
/// generator rather than NumPy's and PyTorch's, so the same seed picks other rows than Trinity does.
///
/// Pass rates are taken as the operator reports them (mean rewards): with rewards outside [0, 1] the beliefs
/// leave the Beta's domain, as in Trinity; pair this selector with a 0/1 reward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DifficultyEstimator {
    features: Vec<[f64; 2]>,
    alphas: Vec<f64>,
    betas: Vec<f64>,
    m: f64,
    lamb: f64,
    rho: f64,
    adaptive_rho: bool,
    cap_coef: Option<f64>,
    target_reward: f64,
    tau: f64,
    do_sample: bool,
}

impl DifficultyEstimator {
    const KWARGS: [&str; 7] = ["m", "lamb", "rho", "adaptive_rho", "target_reward", "tau", "do_sample"];

    pub(crate) fn new(
        taskset: &str,
        features: Vec<[f64; 2]>,
        kwargs: &Map<String, Value>,
    ) -> Result<DifficultyEstimator> {
        let bad = |problem: String| BufferError::SelectorArgs { taskset: taskset.to_owned(), problem };
        if let Some(unknown) = kwargs.keys().find(|k| !Self::KWARGS.contains(&k.as_str())) {
            return Err(bad(format!(
                "kwargs.{unknown} is not an argument of difficulty_based ({})",
                Self::KWARGS.join(", ")
            )));
        }
        let number = |key: &str, default: f64| -> Result<f64> {
            match kwargs.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v
                    .as_f64()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| bad(format!("kwargs.{key} must be a number, found {v}"))),
            }
        };
        let flag = |key: &str| -> Result<bool> {
            match kwargs.get(key) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(v) => Err(bad(format!("kwargs.{key} must be true or false, found {v}"))),
            }
        };
        let (m, lamb, rho, tau) = (number("m", 16.0)?, number("lamb", 0.2)?, number("rho", 0.2)?, number("tau", 1.0)?);
        if m <= 0.0 || !(0.0..=1.0).contains(&lamb) || !(0.0..=1.0).contains(&rho) || tau < 0.0 {
            return Err(bad(format!(
                "kwargs need m > 0, lamb and rho in [0, 1], tau >= 0 (m {m}, lamb {lamb}, rho {rho}, tau {tau})"
            )));
        }
        if features.is_empty() {
            return Err(bad("the taskset has no rows".to_owned()));
        }
        let n = features.len();
        Ok(DifficultyEstimator {
            features,
            alphas: vec![1.0; n],
            betas: vec![1.0; n],
            m,
            lamb,
            rho,
            adaptive_rho: flag("adaptive_rho")?,
            cap_coef: None,
            target_reward: number("target_reward", 1.0)?,
            tau,
            do_sample: flag("do_sample")?,
        })
    }

    /// How many rows the beliefs cover.
    pub fn rows(&self) -> usize {
        self.features.len()
    }

    /// α of every row.
    pub fn alphas(&self) -> &[f64] {
        &self.alphas
    }

    /// β of every row.
    pub fn betas(&self) -> &[f64] {
        &self.betas
    }

    /// The current ρ (halved by `adaptive_rho`).
    pub fn rho(&self) -> f64 {
        self.rho
    }

    /// The model's estimated capability between the two reference models (None before any feedback).
    pub fn capability(&self) -> Option<f64> {
        self.cap_coef
    }

    /// Updates every row's belief from pass rates `values` observed on rows `indices` (see the type's docs).
    pub fn update(&mut self, taskset: &str, indices: &[usize], values: &[f64]) -> Result<()> {
        let bad = |problem: String| BufferError::SelectorArgs { taskset: taskset.to_owned(), problem };
        let n = self.features.len();
        if indices.len() != values.len() {
            return Err(bad(format!("feedback has {} indices and {} values", indices.len(), values.len())));
        }
        if let Some(i) = indices.iter().find(|&&i| i >= n) {
            return Err(bad(format!("feedback names row {i}, the taskset has {n}")));
        }
        if let Some(v) = values.iter().find(|v| !v.is_finite()) {
            return Err(bad(format!("feedback has pass rate {v}")));
        }
        if indices.is_empty() {
            return Ok(());
        }
        let k = indices.len() as f64;
        let observed = values.iter().sum::<f64>() / k;
        let anchor0 = indices.iter().map(|&i| self.features[i][0]).sum::<f64>() / k;
        let anchor1 = indices.iter().map(|&i| self.features[i][1]).sum::<f64>() / k;
        let estimate = (observed - anchor0) / (anchor1 - anchor0 + 1e-6);
        let cap = match self.cap_coef {
            Some(previous) => CAP_COEF_DISCOUNT * previous + (1.0 - CAP_COEF_DISCOUNT) * estimate,
            None => estimate,
        };
        self.cap_coef = Some(cap);
        let mut p_tilde: Vec<f64> =
            self.features.iter().map(|[f0, f1]| ((f1 - f0) * cap + f0).clamp(0.0, 1.0)).collect();
        let error = indices.iter().zip(values).map(|(&i, y)| (p_tilde[i] - y).abs()).sum::<f64>() / k;
        if self.adaptive_rho && error >= 0.25 {
            self.rho *= 0.5;
        }
        let (mut s_bar, mut f_bar) = (vec![0.0; n], vec![0.0; n]);
        // A row reported twice keeps its last value, as NumPy's fancy assignment does.
        for (&i, &y) in indices.iter().zip(values) {
            s_bar[i] = y * self.m;
            f_bar[i] = (1.0 - y) * self.m;
            p_tilde[i] = y;
        }
        let (lamb, rho, m) = (self.lamb, self.rho, self.m);
        for j in 0..n {
            self.alphas[j] = (1.0 - lamb) * self.alphas[j] + lamb + (1.0 - rho) * s_bar[j] + rho * p_tilde[j] * m;
            self.betas[j] = (1.0 - lamb) * self.betas[j] + lamb + (1.0 - rho) * f_bar[j] + rho * (1.0 - p_tilde[j]) * m;
        }
        Ok(())
    }

    /// Every row's predicted pass rate: the Beta mean, or a Beta sample with `do_sample`.
    pub fn predict(&self, rng: &mut Stream) -> Vec<f64> {
        self.alphas
            .iter()
            .zip(&self.betas)
            .map(|(&a, &b)| if self.do_sample { rng.beta(a.max(1e-6), b.max(1e-6)) } else { a / (a + b) })
            .collect()
    }

    /// `count` rows for the draws starting at `current_index` (see the type's docs). More rows than the taskset
    /// has repeat the ranking from its top.
    pub fn select(&self, count: usize, seed: u64, current_index: u64) -> Vec<usize> {
        let mut rng = Stream(mix(seed, current_index));
        let keys: Vec<f64> = self
            .predict(&mut rng)
            .into_iter()
            .map(|pr| {
                let score = -(self.target_reward - pr).abs();
                if self.tau == 0.0 { score } else { score / self.tau + rng.gumbel() }
            })
            .collect();
        let mut ranking: Vec<usize> = (0..keys.len()).collect();
        ranking.sort_by(|&a, &b| keys[b].total_cmp(&keys[a]).then(a.cmp(&b)));
        ranking.iter().copied().cycle().take(count).collect()
    }
}

/// A seeded stream of random numbers, with the few distributions the selectors need: [`trinity_rng::mix`] of a
/// counter stepped by 1 (not SplitMix64's own stream, which steps by its gamma; kept so seeded selections stay).
#[derive(Debug, Clone)]
pub struct Stream(pub u64);

impl Stream {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        trinity_rng::mix(self.0)
    }

    /// Uniform on the open interval (0, 1).
    pub fn unit(&mut self) -> f64 {
        trinity_rng::unit_open(self.next_u64())
    }

    /// A standard normal sample (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// A standard Gumbel sample.
    pub fn gumbel(&mut self) -> f64 {
        -(-self.unit().ln()).ln()
    }

    /// A Gamma(shape, 1) sample (Marsaglia–Tsang; shapes below 1 boosted by U^(1/shape)).
    pub fn gamma(&mut self, shape: f64) -> f64 {
        if shape < 1.0 {
            return self.gamma(shape + 1.0) * self.unit().powf(1.0 / shape);
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = self.unit();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v;
            }
        }
    }

    /// A Beta(a, b) sample.
    pub fn beta(&mut self, a: f64, b: f64) -> f64 {
        let (x, y) = (self.gamma(a), self.gamma(b));
        if x + y > 0.0 { x / (x + y) } else { 0.5 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beta_samples_have_the_beta_mean() {
        let mut rng = Stream(11);
        let n = 20000;
        let mean = (0..n).map(|_| rng.beta(2.0, 6.0)).sum::<f64>() / n as f64;
        assert!((mean - 0.25).abs() < 0.01, "{mean}");
        let mean = (0..n).map(|_| rng.beta(0.5, 0.5)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
    }
}
