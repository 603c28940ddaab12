//! Prompts too long for the engine, refused before they are tokenized.
//!
//! Tokenizing costs about 100 bytes of memory a byte of text (a 5.1 MB prompt took 534 MB, kept by the allocator
//! after the reply), and the engine's length check comes only after it. A text longer than any prompt of
//! `max_prompt_tokens` tokens can be ([`trinity_model::Tokenizer::max_text_bytes`]) is refused here with the same
//! 400 `context_length_exceeded` the engine gives, without tokenizing it; one under that bound is tokenized and
//! checked exactly by the engine. With the body limit sized from the same bound ([`crate::server`]'s
//! `request_limit`), a request costs at most a small multiple of the longest prompt that fits.

use trinity_explorer::RolloutModel;

use crate::error::ApiError;

/// Refuses `text` (a rendered prompt, for `param`) when it is provably longer than `model`'s prompt limit.
pub(crate) fn check_untokenized(model: &RolloutModel, text: &str, param: &str) -> Result<(), ApiError> {
    let limit = model.engine().info().max_prompt_tokens;
    match model.tokenizer().max_text_bytes(limit) {
        Some(most) if text.len() > most => Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(
                Some(param.to_owned()),
                format!(
                    "the prompt is {} bytes, longer than any prompt of {limit} tokens (the most this model accepts) \
                     can be ({most} bytes with this tokenizer): it has more than {limit} tokens",
                    text.len()
                ),
            )
        }),
        _ => Ok(()),
    }
}
