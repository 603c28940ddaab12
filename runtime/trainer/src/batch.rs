//! What the trainer consumes: [`TrainRow`]s (one experience each, independent of the buffer's types) and their
//! padding into model inputs.
//!
//! A row is `tokens = prompt ++ response` with `prompt_length` prompt tokens; every per-token field
//! (`action_mask`, `logprobs`, `token_level_rewards`, `advantages`, `teacher_logprobs`) has one entry per
//! *response* token. [`validate`] checks that once, so nothing after it sees ragged input.
//!
//! Padding follows veRL (`to_data_proto`): prompts left-padded to the longest prompt `P`, responses
//! right-padded to the longest response `R`, so every response starts at column `P` and the hidden states that
//! predict it are columns `P − 1 .. P − 1 + R`. The decoder turns the attention mask into positions
//! (`cumsum(mask) − 1`), so padding never shifts a real token's position.
//!
//! When rows repeat a prompt (GRPO's `repeat_times` samples of a task) the prompts are instead run once each
//! ([`trinity_model::Decoder::forward_hidden_shared_prompts`]): same hidden states, less work. The layout is
//! chosen per micro-batch by [`PaddedInputs::new`]; callers only see the response-predicting hidden states.

use std::collections::HashMap;

use tch::{Device, Kind, Tensor};
use trinity_model::Decoder;

use crate::error::{Result, TrainerError};

/// One experience to train on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrainRow {
    /// Prompt then response token ids.
    pub tokens: Vec<i64>,
    /// How many of `tokens` are prompt (at least 1: the first response token needs a context).
    pub prompt_length: usize,
    /// Per response token: trained on (model-generated) or not (environment tokens in multi-turn rows).
    pub action_mask: Vec<bool>,
    /// Per response token: the rollout (sampling) logprobs, Trinity's `old_logprob` by default. Empty means
    /// "not recorded" and is filled with zeros (SFT rows).
    pub logprobs: Vec<f32>,
    /// Scalar reward (placed on the last action token for trainer-side advantages).
    pub reward: Option<f32>,
    /// Per response token rewards, instead of `reward`.
    pub token_level_rewards: Option<Vec<f32>>,
    /// Precomputed advantages per response token (from the explorer's pipeline); skips the advantage function.
    pub advantages: Option<Vec<f32>>,
    /// A teacher's logprobs of the response tokens (on-policy distillation, JSD).
    pub teacher_logprobs: Option<Vec<f32>>,
    /// The row comes from an expert (SFT) dataset (MIX algorithms).
    pub expert: bool,
    /// The task group (Trinity's `eid.tid`), for group advantages computed in the trainer.
    pub group_id: Option<String>,
    /// The run within the task (Trinity's `eid.rid`), for multi-step advantages.
    pub run_id: Option<String>,
    /// The explore step the row was produced in (MIX-CHORD's schedule).
    pub step: Option<i64>,
    /// The experts the rollout routed every token but the last to, for routing replay
    /// ([`crate::router_replay`]).
    pub routed_experts: Option<crate::router_replay::RoutedExperts>,
}

impl TrainRow {
    /// A prompt/response pair with every response token trained on and no rollout logprobs (SFT).
    pub fn sft(prompt: &[i64], response: &[i64]) -> Self {
        TrainRow {
            tokens: prompt.iter().chain(response).copied().collect(),
            prompt_length: prompt.len(),
            action_mask: vec![true; response.len()],
            ..TrainRow::default()
        }
    }

    /// Number of response tokens.
    pub fn response_length(&self) -> usize {
        self.tokens.len().saturating_sub(self.prompt_length)
    }

    /// The prompt token ids.
    pub fn prompt(&self) -> &[i64] {
        &self.tokens[..self.prompt_length.min(self.tokens.len())]
    }

    /// The response token ids.
    pub fn response(&self) -> &[i64] {
        &self.tokens[self.prompt_length.min(self.tokens.len())..]
    }
}

/// Checks every row; errors name the row and the field.
pub fn validate(rows: &[TrainRow], vocab_size: i64) -> Result<()> {
    if rows.is_empty() {
        return Err(TrainerError::InvalidBatch("no rows".into()));
    }
    for (i, r) in rows.iter().enumerate() {
        let bad = |problem: String| TrainerError::InvalidRow { row: i, problem };
        if r.prompt_length == 0 {
            return Err(bad("prompt_length is 0; the first response token needs at least one prompt token".into()));
        }
        if r.prompt_length > r.tokens.len() {
            return Err(bad(format!("prompt_length {} exceeds the {} tokens", r.prompt_length, r.tokens.len())));
        }
        if let Some(t) = r.tokens.iter().find(|&&t| t < 0 || t >= vocab_size) {
            return Err(bad(format!("token id {t} is outside the vocabulary (size {vocab_size})")));
        }
        let n = r.response_length();
        let check = |field: &str, len: usize, optional_empty: bool| -> Result<()> {
            if len != n && !(optional_empty && len == 0) {
                return Err(bad(format!("`{field}` has {len} entries for {n} response tokens")));
            }
            Ok(())
        };
        check("action_mask", r.action_mask.len(), false)?;
        if let Some(problem) = crate::router_replay::row_problem(r) {
            return Err(bad(problem));
        }
        check("logprobs", r.logprobs.len(), true)?;
        for (field, v) in [
            ("token_level_rewards", &r.token_level_rewards),
            ("advantages", &r.advantages),
            ("teacher_logprobs", &r.teacher_logprobs),
        ] {
            if let Some(v) = v {
                check(field, v.len(), false)?;
            }
        }
    }
    if rows.iter().all(|r| r.response_length() == 0) {
        return Err(TrainerError::InvalidBatch("no row has a response token".into()));
    }
    Ok(())
}

/// Rows padded into model inputs (see the module docs for the two layouts).
#[derive(Debug)]
pub struct PaddedInputs {
    layout: Layout,
    /// `[B, R]` int64: the response tokens (padding 0), the targets of [`PaddedInputs::hidden`].
    pub targets: Tensor,
    /// Longest response `R`.
    pub response_width: i64,
}

#[derive(Debug)]
enum Layout {
    /// Every row in full: `[B, P + R]` ids and (when any row is padded) mask, `P` the longest prompt; with
    /// routing replay, the `[B, P + R, layers, k]` experts to force ([`crate::router_replay`]).
    /// `router_logits`: the forward also gives the load-balancing loss ([`PaddedInputs::hidden_routed`]).
    Rows {
        input_ids: Tensor,
        attention_mask: Option<Tensor>,
        prompt_width: i64,
        replay: Option<Tensor>,
        router_logits: bool,
    },
    /// Each distinct prompt once (`[G, P]` ids and mask, left-padded), the responses `[B, R]`, and the prompt
    /// of each row.
    SharedPrompts { prompts: Tensor, prompt_mask: Tensor, groups: Vec<i64>, responses: Tensor, response_lens: Vec<i64> },
}

/// The shared layout is taken when it runs at most this share of the tokens of the full rows: below that the
/// saving does not pay for the second attention call and the gathers.
const SHARED_PROMPTS_MAX_SHARE: f64 = 0.9;

/// The padded tokens the decoder runs for `rows` rows with `prompts` distinct prompts, the longest prompt `p`
/// and the longest response `r` tokens long, and whether that is the shared-prompt layout: each distinct prompt
/// once and every response (`prompts·p + rows·r`) when that is at most [`SHARED_PROMPTS_MAX_SHARE`] of the full
/// rows (`rows·(p + r)`), else the full rows. [`PaddedInputs::new`] picks its layout by this, and the token
/// budget of a micro-batch ([`crate::micro_batch`]) is counted by it.
pub(crate) fn layout_tokens(prompts: usize, rows: usize, p: usize, r: usize) -> (usize, bool) {
    let (shared, full) = (prompts * p + rows * r, rows * (p + r));
    if (shared as f64) <= SHARED_PROMPTS_MAX_SHARE * full as f64 { (shared, true) } else { (full, false) }
}

impl PaddedInputs {
    /// Pads `rows` (indices into `all`) onto `device`, sharing repeated prompts when that saves work.
    pub fn new(all: &[TrainRow], rows: &[usize], device: Device) -> Result<Self> {
        Self::with_replay(all, rows, device, false)
    }

    /// [`PaddedInputs::new`], and with `replay` the rows' routed experts forced in the forward (routing replay,
    /// [`crate::router_replay`]: the full-row layout, since the shared-prompt forward does not replay). Rows that
    /// carry no routing run with the model's own; some carrying it and some not is an error naming the row.
    pub fn with_replay(all: &[TrainRow], rows: &[usize], device: Device, replay: bool) -> Result<Self> {
        Self::with_routing(all, rows, device, replay, false)
    }

    /// [`PaddedInputs::with_replay`], and with `router_logits` in the full-row layout, whose forward
    /// ([`PaddedInputs::hidden_routed`]) also gives the mixture-of-experts load-balancing loss.
    pub fn with_routing(
        all: &[TrainRow],
        rows: &[usize],
        device: Device,
        replay: bool,
        router_logits: bool,
    ) -> Result<Self> {
        let routing = if replay { crate::router_replay::layout_of(all, rows)? } else { None };
        let p = rows.iter().map(|&i| all[i].prompt_length).max().unwrap_or(0);
        let r = rows.iter().map(|&i| all[i].response_length()).max().unwrap_or(0);
        let b = rows.len();
        let mut targets = vec![0i64; b * r];
        for (k, &i) in rows.iter().enumerate() {
            targets[k * r..k * r + all[i].response_length()].copy_from_slice(all[i].response());
        }
        let shape = |n: usize, w: usize| [n as i64, w as i64];
        let targets = Tensor::from_slice(&targets).f_view(shape(b, r))?.f_to_device(device)?;

        // Rows by prompt, in order of first appearance.
        let mut index: HashMap<&[i64], i64> = HashMap::new();
        let mut distinct: Vec<&[i64]> = Vec::new();
        let groups: Vec<i64> = rows
            .iter()
            .map(|&i| {
                let prompt = all[i].prompt();
                *index.entry(prompt).or_insert_with(|| {
                    distinct.push(prompt);
                    distinct.len() as i64 - 1
                })
            })
            .collect();
        let layout = if routing.is_none() && !router_logits && layout_tokens(distinct.len(), b, p, r).1 {
            let g = distinct.len();
            let (mut ids, mut mask) = (vec![0i64; g * p], vec![0i64; g * p]);
            for (k, prompt) in distinct.iter().enumerate() {
                let start = k * p + p - prompt.len();
                ids[start..start + prompt.len()].copy_from_slice(prompt);
                mask[start..start + prompt.len()].fill(1);
            }
            Layout::SharedPrompts {
                prompts: Tensor::from_slice(&ids).f_view(shape(g, p))?.f_to_device(device)?,
                prompt_mask: Tensor::from_slice(&mask).f_view(shape(g, p))?.f_to_device(device)?,
                groups,
                // The response ids right-padded with 0 are exactly the targets.
                responses: targets.shallow_clone(),
                // Padding is left out of the forward; an empty response still runs one (padding) position.
                response_lens: rows.iter().map(|&i| all[i].response_length().max(1) as i64).collect(),
            }
        } else {
            let t = p + r;
            let mut ids = vec![0i64; b * t];
            let mut mask = vec![0i64; b * t];
            for (k, &i) in rows.iter().enumerate() {
                let row = &all[i];
                let start = k * t + p - row.prompt_length;
                ids[start..start + row.tokens.len()].copy_from_slice(&row.tokens);
                mask[start..start + row.tokens.len()].fill(1);
            }
            let padded = mask.contains(&0);
            Layout::Rows {
                input_ids: Tensor::from_slice(&ids).f_view(shape(b, t))?.f_to_device(device)?,
                attention_mask: if padded {
                    Some(Tensor::from_slice(&mask).f_view(shape(b, t))?.f_to_device(device)?)
                } else {
                    None
                },
                prompt_width: p as i64,
                replay: routing
                    .map(|layout| crate::router_replay::replay_tensor(all, rows, p, t, layout, device))
                    .transpose()?,
                router_logits,
            }
        };
        Ok(PaddedInputs { layout, targets, response_width: r as i64 })
    }

    /// The decoder's hidden states that predict the response tokens, `[B, R, hidden]`: the last prompt
    /// position, then the response's own positions but the last. Differentiable when gradients are enabled.
    pub fn hidden(&self, decoder: &Decoder) -> Result<Tensor> {
        Ok(self.hidden_routed(decoder)?.0)
    }

    /// [`PaddedInputs::hidden`], and when the inputs were made with `router_logits`
    /// ([`PaddedInputs::with_routing`]) the load-balancing loss of the forward's routing over the real tokens
    /// ([`trinity_model::load_balancing_loss`], transformers' `load_balancing_loss_func`), differentiable.
    pub fn hidden_routed(&self, decoder: &Decoder) -> Result<(Tensor, Option<Tensor>)> {
        let r = self.response_width;
        match &self.layout {
            Layout::Rows { input_ids, attention_mask, prompt_width, replay, router_logits } => {
                let (hidden, aux) = match (replay, router_logits) {
                    (None, false) => (decoder.forward_hidden(input_ids, attention_mask.as_ref())?, None),
                    (forced, _) => {
                        let mask = attention_mask.as_ref();
                        let routed = decoder.forward_hidden_routed(input_ids, mask, forced.as_ref(), *router_logits)?;
                        let aux = match (*router_logits, decoder.config().moe.as_ref()) {
                            (true, Some(moe)) => Some(trinity_model::load_balancing_loss(
                                &routed.router_logits,
                                moe.num_experts,
                                moe.num_experts_per_tok,
                                mask,
                            )?),
                            _ => None,
                        };
                        (routed.hidden, aux)
                    }
                };
                Ok((hidden.f_narrow(1, prompt_width - 1, r)?, aux))
            }
            Layout::SharedPrompts { prompts, prompt_mask, groups, responses, response_lens } => {
                let (prompt_hidden, response_hidden) =
                    decoder.forward_hidden_shared_prompts(prompts, prompt_mask, groups, responses, response_lens)?;
                let p = prompt_hidden.size()[1];
                let group = Tensor::from_slice(groups).f_to_device(prompt_hidden.device())?;
                let last_prompt = prompt_hidden.f_select(1, p - 1)?.f_index_select(0, &group)?.f_unsqueeze(1)?;
                Ok((Tensor::f_cat(&[last_prompt, response_hidden.f_narrow(1, 0, r - 1)?], 1)?, None))
            }
        }
    }

    /// The `[B, P + R, layers, k]` experts the forward forces, with routing replay.
    pub fn replayed_experts(&self) -> Option<&Tensor> {
        match &self.layout {
            Layout::Rows { replay, .. } => replay.as_ref(),
            Layout::SharedPrompts { .. } => None,
        }
    }

    /// Whether repeated prompts run once ([`Decoder::forward_hidden_shared_prompts`]).
    pub fn shares_prompts(&self) -> bool {
        matches!(self.layout, Layout::SharedPrompts { .. })
    }
}

/// A per-response-token field of `rows` as a `[rows, width]` f32 tensor (zero padded); rows where `get` gives
/// `None` or an empty slice are zeros.
pub(crate) fn token_field<'a>(
    rows: impl ExactSizeIterator<Item = &'a TrainRow>,
    width: usize,
    get: impl Fn(&'a TrainRow) -> Option<&'a [f32]>,
) -> Result<Tensor> {
    let n = rows.len();
    let mut flat = vec![0f32; n * width];
    for (k, row) in rows.enumerate() {
        if let Some(v) = get(row) {
            flat[k * width..k * width + v.len()].copy_from_slice(v);
        }
    }
    Ok(Tensor::from_slice(&flat).f_view([n as i64, width as i64])?.f_to_kind(Kind::Float)?)
}

/// The action masks of `rows` as a `[rows, width]` f32 tensor.
pub(crate) fn mask_field<'a>(rows: impl ExactSizeIterator<Item = &'a TrainRow>, width: usize) -> Result<Tensor> {
    let n = rows.len();
    let mut flat = vec![0f32; n * width];
    for (k, row) in rows.enumerate() {
        for (j, &m) in row.action_mask.iter().enumerate() {
            flat[k * width + j] = if m { 1.0 } else { 0.0 };
        }
    }
    Ok(Tensor::from_slice(&flat).f_view([n as i64, width as i64])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(prompt: &[i64], response: &[i64]) -> TrainRow {
        TrainRow::sft(prompt, response)
    }

    fn ints(t: &Tensor) -> Vec<i64> {
        Vec::<i64>::try_from(t.view([-1])).unwrap()
    }

    #[test]
    fn left_pads_prompts_and_right_pads_responses() {
        let rows = vec![row(&[5, 6, 7], &[8]), row(&[9], &[10, 11, 12])];
        let p = PaddedInputs::new(&rows, &[0, 1], Device::Cpu).unwrap();
        assert_eq!(p.response_width, 3);
        let Layout::Rows { input_ids, attention_mask, prompt_width, .. } = &p.layout else {
            panic!("distinct prompts")
        };
        assert_eq!(*prompt_width, 3);
        assert_eq!(ints(input_ids), vec![5, 6, 7, 8, 0, 0, 0, 0, 9, 10, 11, 12]);
        assert_eq!(ints(attention_mask.as_ref().unwrap()), vec![1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(ints(&p.targets), vec![8, 0, 0, 10, 11, 12]);
        let same = PaddedInputs::new(&rows, &[1], Device::Cpu).unwrap();
        assert!(matches!(same.layout, Layout::Rows { attention_mask: None, .. }));
    }

    #[test]
    fn repeated_prompts_run_once_when_that_saves_work() {
        // Two prompts, each repeated: 2·3 + 4·2 = 14 tokens instead of 4·5 = 20.
        let rows = vec![row(&[5, 6, 7], &[8]), row(&[9], &[10, 11]), row(&[5, 6, 7], &[12, 13]), row(&[9], &[14])];
        let p = PaddedInputs::new(&rows, &[0, 1, 2, 3], Device::Cpu).unwrap();
        let Layout::SharedPrompts { prompts, prompt_mask, groups, responses, response_lens } = &p.layout else {
            panic!("shared")
        };
        assert_eq!(ints(prompts), vec![5, 6, 7, 0, 0, 9]);
        assert_eq!(ints(prompt_mask), vec![1, 1, 1, 0, 0, 1]);
        assert_eq!(groups, &[0, 1, 0, 1]);
        assert_eq!(ints(responses), vec![8, 0, 10, 11, 12, 13, 14, 0]);
        assert_eq!(response_lens, &[1, 2, 2, 1]);
        // A repeated one-token prompt before long responses saves too little.
        let rows = vec![row(&[5], &[8, 9, 10, 11, 12]), row(&[5], &[13, 14, 15, 16, 17])];
        assert!(!PaddedInputs::new(&rows, &[0, 1], Device::Cpu).unwrap().shares_prompts());
    }

    #[test]
    fn both_layouts_give_the_same_response_hidden_states() {
        let m = crate::logprobs::tests::tiny();
        let rows = vec![row(&[5, 6, 7], &[8]), row(&[9], &[10, 11]), row(&[5, 6, 7], &[12, 13]), row(&[9], &[14])];
        let shared = PaddedInputs::new(&rows, &[0, 1, 2, 3], Device::Cpu).unwrap();
        assert!(shared.shares_prompts());
        let h = shared.hidden(&m).unwrap();
        for (k, r) in rows.iter().enumerate() {
            let alone = PaddedInputs::new(&rows, &[k], Device::Cpu).unwrap();
            assert!(!alone.shares_prompts());
            let want = alone.hidden(&m).unwrap().get(0);
            let got = h.get(k as i64).narrow(0, 0, r.response_length() as i64);
            assert!((got - want).abs().max().double_value(&[]) < 1e-4, "row {k}");
        }
    }

    #[test]
    fn malformed_rows_are_named() {
        let mut r = row(&[1, 2], &[3, 4]);
        r.logprobs = vec![0.0];
        let err = validate(&[row(&[1], &[2]), r], 32).unwrap_err().to_string();
        assert!(err.contains("row 1") && err.contains("logprobs"), "{err}");
        let err = validate(&[row(&[], &[2])], 32).unwrap_err().to_string();
        assert!(err.contains("prompt_length"), "{err}");
        let err = validate(&[row(&[1], &[40])], 32).unwrap_err().to_string();
        assert!(err.contains("40") && err.contains("vocabulary"), "{err}");
        assert!(validate(&[], 32).is_err());
    }
}
