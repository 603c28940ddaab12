//! Scoring: per-token log-probabilities of responses given prompts, as an RL trainer sees them.
//!
//! The prompt and the response are tokenized separately with no special tokens added and concatenated (a
//! generated response starts at a token boundary after the prompt, so this is the sequence the policy produced).
//! `logprobs[i] = log p(response_tokens[i] | prompt_tokens, response_tokens[..i])`, computed in f32 from the
//! model's logits. Requests are batched by length (right padding with a mask, which does not change results).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tch::{Kind, Tensor};

use crate::error::{ModelError, Result};
use crate::hf::LoadedModel;

/// One thing to score.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum ScoreRequest {
    /// Raw prompt text and response text.
    Text {
        /// Context (tokenized as is, no BOS added).
        prompt: String,
        /// The text to score.
        response: String,
    },
    /// Chat messages: the template renders all but the last (with the generation prompt); the last message's
    /// content is the response.
    Chat {
        /// OpenAI-style messages (`role`, `content`, ...).
        messages: Vec<Value>,
    },
}

/// The result for one request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScoredSequence {
    /// Prompt token ids.
    pub prompt_tokens: Vec<u32>,
    /// Response token ids.
    pub response_tokens: Vec<u32>,
    /// One log-probability per response token.
    pub logprobs: Vec<f32>,
}

/// Sequences per forward pass; bounded also by [`MAX_BATCH_TOKENS`].
const MAX_BATCH: usize = 16;
const MAX_BATCH_TOKENS: usize = 8192;

/// Scores `requests` in order. `Chat` requests need the model's chat template.
pub fn score(model: &LoadedModel, requests: &[ScoreRequest]) -> Result<Vec<ScoredSequence>> {
    let mut seqs = Vec::with_capacity(requests.len());
    for (i, r) in requests.iter().enumerate() {
        let (prompt, response) = match r {
            ScoreRequest::Text { prompt, response } => (prompt.clone(), response.clone()),
            ScoreRequest::Chat { messages } => {
                let Some((last, context)) = messages.split_last() else {
                    return Err(ModelError::InvalidInput(format!("request {i}: `messages` is empty")));
                };
                let template = model
                    .chat_template
                    .as_ref()
                    .ok_or_else(|| ModelError::InvalidInput(format!("request {i}: the model has no chat template")))?;
                let response = last.get("content").and_then(Value::as_str).ok_or_else(|| {
                    ModelError::InvalidInput(format!("request {i}: the last message has no string `content`"))
                })?;
                (template.render(context, true, None)?, response.to_owned())
            }
        };
        let prompt_tokens = model.tokenizer.encode(&prompt, false)?;
        let response_tokens = model.tokenizer.encode(&response, false)?;
        if prompt_tokens.is_empty() && !response_tokens.is_empty() {
            return Err(ModelError::InvalidInput(format!(
                "request {i}: the prompt is empty, so the first response token has no context"
            )));
        }
        seqs.push(ScoredSequence { prompt_tokens, response_tokens, logprobs: Vec::new() });
    }
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by_key(|&i| seqs[i].prompt_tokens.len() + seqs[i].response_tokens.len());
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && end - start < MAX_BATCH {
            let longest = seqs[order[end]].prompt_tokens.len() + seqs[order[end]].response_tokens.len();
            if longest * (end - start + 1) > MAX_BATCH_TOKENS {
                break;
            }
            end += 1;
        }
        score_batch(model, &mut seqs, &order[start..end])?;
        start = end;
    }
    Ok(seqs)
}

fn score_batch(model: &LoadedModel, seqs: &mut [ScoredSequence], rows: &[usize]) -> Result<()> {
    let lens: Vec<usize> = rows.iter().map(|&i| seqs[i].prompt_tokens.len() + seqs[i].response_tokens.len()).collect();
    let t = lens.iter().copied().max().unwrap_or(0);
    if t < 2 {
        return Ok(());
    }
    let b = rows.len();
    let mut ids = vec![0i64; b * t];
    let mut mask = vec![0i64; b * t];
    for (r, &i) in rows.iter().enumerate() {
        let s = &seqs[i];
        for (j, &tok) in s.prompt_tokens.iter().chain(&s.response_tokens).enumerate() {
            ids[r * t + j] = i64::from(tok);
            mask[r * t + j] = 1;
        }
    }
    let decoder = &model.decoder;
    let ids = Tensor::from_slice(&ids).f_view([b as i64, t as i64])?.f_to_device(decoder.device())?;
    let mask = Tensor::from_slice(&mask).f_view([b as i64, t as i64])?;
    let lp = tch::no_grad(|| -> Result<Tensor> {
        let hidden = decoder.forward_hidden(&ids, Some(&mask))?;
        let n = t as i64 - 1;
        decoder.token_logprobs(&hidden.f_narrow(1, 0, n)?, &ids.f_narrow(1, 1, n)?, 1.0, 128)
    })?;
    let lp = lp.f_to_device(tch::Device::Cpu)?.f_to_kind(Kind::Float)?.f_contiguous()?;
    let flat: Vec<f32> = Vec::<f32>::try_from(lp.f_flatten(0, -1)?)?;
    for (r, &i) in rows.iter().enumerate() {
        let s = &mut seqs[i];
        let p = s.prompt_tokens.len();
        let n = s.response_tokens.len();
        // Response token k sits at position p + k and is predicted from position p + k - 1.
        s.logprobs = (0..n).map(|k| flat[r * (t - 1) + p + k - 1]).collect();
    }
    Ok(())
}
