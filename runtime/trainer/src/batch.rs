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

use tch::{Device, Kind, Tensor};

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

/// Rows padded into model inputs (veRL layout, see the module docs).
#[derive(Debug)]
pub struct PaddedInputs {
    /// `[B, P + R]` int64.
    pub input_ids: Tensor,
    /// `[B, P + R]` int64, 1 for real tokens; `None` when no row has padding (the decoder then takes its causal
    /// fast path).
    pub attention_mask: Option<Tensor>,
    /// `[B, R]` int64: the response tokens (padding 0), i.e. the targets of hidden columns `P − 1 ..`.
    pub targets: Tensor,
    /// Longest prompt `P`.
    pub prompt_width: i64,
    /// Longest response `R`.
    pub response_width: i64,
}

impl PaddedInputs {
    /// Pads `rows` (indices into `all`) onto `device`.
    pub fn new(all: &[TrainRow], rows: &[usize], device: Device) -> Result<Self> {
        let p = rows.iter().map(|&i| all[i].prompt_length).max().unwrap_or(0);
        let r = rows.iter().map(|&i| all[i].response_length()).max().unwrap_or(0);
        let (b, t) = (rows.len(), p + r);
        let mut ids = vec![0i64; b * t];
        let mut mask = vec![0i64; b * t];
        let mut targets = vec![0i64; b * r];
        for (k, &i) in rows.iter().enumerate() {
            let row = &all[i];
            let start = p - row.prompt_length;
            for (j, &tok) in row.tokens.iter().enumerate() {
                ids[k * t + start + j] = tok;
                mask[k * t + start + j] = 1;
            }
            targets[k * r..k * r + row.response_length()].copy_from_slice(row.response());
        }
        let padded = mask.contains(&0);
        let shape = |w: usize| [b as i64, w as i64];
        Ok(PaddedInputs {
            input_ids: Tensor::from_slice(&ids).f_view(shape(t))?.f_to_device(device)?,
            attention_mask: if padded {
                Some(Tensor::from_slice(&mask).f_view(shape(t))?.f_to_device(device)?)
            } else {
                None
            },
            targets: Tensor::from_slice(&targets).f_view(shape(r))?.f_to_device(device)?,
            prompt_width: p as i64,
            response_width: r as i64,
        })
    }

    /// The hidden states that predict the response tokens: columns `P − 1 .. P − 1 + R` of `hidden`.
    pub fn response_hidden(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(hidden.f_narrow(1, self.prompt_width - 1, self.response_width)?)
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

    #[test]
    fn left_pads_prompts_and_right_pads_responses() {
        let rows = vec![row(&[5, 6, 7], &[8]), row(&[9], &[10, 11, 12])];
        let p = PaddedInputs::new(&rows, &[0, 1], Device::Cpu).unwrap();
        assert_eq!((p.prompt_width, p.response_width), (3, 3));
        let ids = Vec::<i64>::try_from(p.input_ids.view([-1])).unwrap();
        assert_eq!(ids, vec![5, 6, 7, 8, 0, 0, 0, 0, 9, 10, 11, 12]);
        let mask = Vec::<i64>::try_from(p.attention_mask.unwrap().view([-1])).unwrap();
        assert_eq!(mask, vec![1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(Vec::<i64>::try_from(p.targets.view([-1])).unwrap(), vec![8, 0, 0, 10, 11, 12]);
        let same = PaddedInputs::new(&rows, &[1], Device::Cpu).unwrap();
        assert!(same.attention_mask.is_none());
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
