//! A constraint that starts where the model's reasoning ends, as vLLM's structured outputs do under a reasoning
//! parser: a thinking model writes `<think>...</think>` freely and only its answer is held to the schema (a JSON
//! `response_format`, a forced tool choice), so its reasoning is not forced into JSON from the first token.
//!
//! As vLLM's reasoning parsers require, the end of the reasoning is the tokenizer's `</think>` token: a model
//! without one cannot mark its reasoning the way the parser reads it, and is constrained from the first token.
//! A prompt whose last `</think>` comes after its last `<think>` (Qwen3's template with `enable_thinking: false`
//! closes an empty reasoning block in the prompt) has no reasoning left, and is constrained from the first token
//! too. While the model reasons every token may come and it may end; the reported logprobs are the unmasked
//! ones either way.

use std::sync::Arc;

use trinity_engine::{Constraint, ConstraintError, ConstraintState, TokenConstraint};
use trinity_model::Tokenizer;

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

/// `inner` for the answer of a reply that may reason first after `prompt`; `inner` itself where the model has no
/// `</think>` token or the prompt already closed its reasoning.
pub(crate) fn after_reasoning(inner: Constraint, tokenizer: &Tokenizer, prompt: &[u32]) -> Constraint {
    let Some(end) = tokenizer.token_to_id(THINK_END) else { return inner };
    let start = tokenizer.token_to_id(THINK_START);
    let last = |id: u32| prompt.iter().rposition(|&t| t == id);
    let closed = last(end).is_some_and(|at| start.and_then(last).is_none_or(|open| open < at));
    if closed {
        return inner;
    }
    let free: Arc<[bool]> = vec![true; tokenizer.vocab_size()].into();
    Constraint(Arc::new(AfterReasoning { inner, end, free }))
}

/// See the module docs.
#[derive(Debug)]
struct AfterReasoning {
    inner: Constraint,
    /// The `</think>` token.
    end: u32,
    /// Every token allowed: the mask while the model reasons.
    free: Arc<[bool]>,
}

impl TokenConstraint for AfterReasoning {
    fn start(&self) -> Box<dyn ConstraintState> {
        Box::new(Reasoning { inner: self.inner.clone(), end: self.end, free: Arc::clone(&self.free), answer: None })
    }
}

/// One sample: reasoning until its `</think>`, then the inner constraint's state.
struct Reasoning {
    inner: Constraint,
    end: u32,
    free: Arc<[bool]>,
    answer: Option<Box<dyn ConstraintState>>,
}

impl ConstraintState for Reasoning {
    fn allowed(&mut self) -> Result<Arc<[bool]>, ConstraintError> {
        match &mut self.answer {
            Some(answer) => answer.allowed(),
            None => Ok(Arc::clone(&self.free)),
        }
    }

    fn advance(&mut self, token: u32) -> Result<(), ConstraintError> {
        match &mut self.answer {
            Some(answer) => answer.advance(token),
            None => {
                if token == self.end {
                    self.answer = Some(self.inner.0.start());
                }
                Ok(())
            }
        }
    }

    fn can_end(&self) -> bool {
        self.answer.as_ref().is_none_or(|answer| answer.can_end())
    }

    fn must_end(&self) -> bool {
        self.answer.as_ref().is_some_and(|answer| answer.must_end())
    }
}
