//! Per-token statistics of the policy before the update, for the advantage functions that read them
//! ([`trinity_algorithm::advantage::PolicyStats`]): Clip_B's entropy, Clip_V's entropy and `necs`.
//!
//! Why a pass of its own: the statistics need the whole next-token distribution of every response token, which
//! the loss's head pass ([`crate::logprobs`]) never materialises (it folds slabs of the vocabulary into running
//! sums). This pass runs once per step without gradients, `chunk_tokens` positions at a time, so its memory is
//! one chunk's fp32 logits. Trinity-RFT gets the same numbers from veRL's old-logprob recomputation
//! (`calculate_entropy=True`); its logprob comes out of the same pass and serves as the recomputed
//! `old_logprob` when `bypass_mode` is off.

use tch::{Device, Kind, Tensor};
use trinity_model::Decoder;

use crate::batch::{PaddedInputs, TrainRow};
use crate::error::Result;

/// `[b, R]` f32 statistics of the response tokens on the CPU.
#[derive(Debug)]
pub struct TokenStats {
    /// log p of each response token.
    pub logprob: Tensor,
    /// H = −Σ_v p_v log p_v of the distribution the token was drawn from.
    pub entropy: Tensor,
    /// Σ_v p_v²·(H + log p_v), when asked for.
    pub necs: Option<Tensor>,
}

/// The statistics of `rows[micro]`'s response tokens under `decoder` at `temperature`, without gradients.
pub fn response_stats(
    decoder: &Decoder,
    rows: &[TrainRow],
    micro: &[usize],
    temperature: f64,
    chunk_tokens: i64,
    necs: bool,
) -> Result<TokenStats> {
    replayed_response_stats(decoder, rows, micro, (temperature, chunk_tokens), necs, false)
}

/// [`response_stats`], with `replay` forcing the rows' routed experts ([`crate::router_replay`]).
pub fn replayed_response_stats(
    decoder: &Decoder,
    rows: &[TrainRow],
    micro: &[usize],
    (temperature, chunk_tokens): (f64, i64),
    necs: bool,
    replay: bool,
) -> Result<TokenStats> {
    let inputs = PaddedInputs::with_replay(rows, micro, decoder.device(), replay)?;
    tch::no_grad(|| {
        let hidden = inputs.hidden(decoder)?;
        head_stats(decoder, &hidden, &inputs.targets, temperature, chunk_tokens, necs)
    })
}

/// The statistics for hidden states `[B, R, hidden]` and targets `[B, R]`, `chunk_tokens` positions at a time.
fn head_stats(
    decoder: &Decoder,
    hidden: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk_tokens: i64,
    necs: bool,
) -> Result<TokenStats> {
    let size = hidden.size();
    let (b, r) = (size[0], size[1]);
    let positions = b * r;
    let flat_h = hidden.f_reshape([positions, size[2]])?;
    let flat_y = targets.f_reshape([positions])?;
    let (mut lps, mut ents, mut ns) = (Vec::new(), Vec::new(), Vec::new());
    let step = chunk_tokens.max(1);
    let mut start = 0;
    while start < positions {
        let len = step.min(positions - start);
        let logits = decoder.logits(&flat_h.f_narrow(0, start, len)?)?.f_to_kind(Kind::Float)?;
        let z = if temperature != 1.0 { logits / temperature } else { logits };
        let logp = z.f_log_softmax(-1, Kind::Float)?;
        let y = flat_y.f_narrow(0, start, len)?.f_unsqueeze(-1)?;
        lps.push(logp.f_gather(-1, &y, false)?.f_squeeze_dim(-1)?);
        let p = logp.f_exp()?;
        let h = -(&p * &logp).f_sum_dim_intlist(-1, false, Kind::Float)?;
        if necs {
            let shifted = &logp + h.f_unsqueeze(-1)?;
            ns.push((p.f_square()? * shifted).f_sum_dim_intlist(-1, false, Kind::Float)?);
        }
        ents.push(h);
        start += len;
    }
    let join = |parts: Vec<Tensor>| -> Result<Tensor> {
        let t = match parts.is_empty() {
            true => Tensor::f_zeros([b, r], (Kind::Float, Device::Cpu))?,
            false => Tensor::f_cat(&parts, 0)?.f_view([b, r])?,
        };
        Ok(t.f_to_device(Device::Cpu)?)
    };
    Ok(TokenStats { logprob: join(lps)?, entropy: join(ents)?, necs: if necs { Some(join(ns)?) } else { None } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logprobs::tests::tiny;

    /// Chunked statistics equal the whole-vocabulary formulas written out per position, and the logprob and
    /// entropy equal the loss pass's ([`crate::logprobs::score`]).
    #[test]
    fn chunked_statistics_match_the_formulas_and_the_loss_pass() {
        let d = tiny();
        let ids = Tensor::from_slice(&[3i64, 7, 9, 11, 2, 5, 8, 13, 21, 34]).view([2, 5]);
        let targets = ids.narrow(1, 1, 4);
        let t = 0.7;
        let hidden = tch::no_grad(|| d.forward_hidden(&ids, None).unwrap().narrow(1, 0, 4));
        let stats = tch::no_grad(|| head_stats(&d, &hidden, &targets, t, 3, true)).unwrap();

        let logp = tch::no_grad(|| (d.logits(&hidden).unwrap() / t).log_softmax(-1, Kind::Float));
        let close = |a: f64, b: f64, what: &str| assert!((a - b).abs() < 1e-5, "{what}: {a} vs {b}");
        for i in 0..2 {
            for j in 0..4 {
                let lp: Vec<f64> = Vec::<f64>::try_from(logp.get(i).get(j).to_kind(Kind::Double)).unwrap();
                let h: f64 = -lp.iter().map(|l| l.exp() * l).sum::<f64>();
                let n: f64 = lp.iter().map(|l| (2.0 * l).exp() * (h + l)).sum();
                let y = targets.int64_value(&[i, j]) as usize;
                close(stats.logprob.double_value(&[i, j]), lp[y], "logprob");
                close(stats.entropy.double_value(&[i, j]), h, "entropy");
                close(stats.necs.as_ref().unwrap().double_value(&[i, j]), n, "necs");
            }
        }
        let score = tch::no_grad(|| crate::logprobs::score(&d, &hidden, &targets, t, 3, true)).unwrap();
        assert!((&score.logprob - &stats.logprob).abs().max().double_value(&[]) < 1e-5);
        assert!((score.entropy.unwrap() - &stats.entropy).abs().max().double_value(&[]) < 1e-5);
        let without = tch::no_grad(|| head_stats(&d, &hidden, &targets, t, 100, false)).unwrap();
        assert!(without.necs.is_none());
        assert!((&without.entropy - &stats.entropy).abs().max().double_value(&[]) < 1e-6);
    }
}
