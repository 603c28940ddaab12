//! SFT rows read from a dataset, as Trinity-RFT's `SFTFormatter` makes them: the training data of algorithm `sft`
//! in mode `train` (`buffer.trainer_input.experience_buffer`) and the expert data of the `mix` and `mix_chord`
//! algorithms (`buffer.trainer_input.auxiliary_buffers.<sft_dataset_name>`).
//!
//! A row is a chat: `format.messages_key` holds a message list (`prompt_type: messages`), or the system prompt,
//! `prompt_key` and `response_key` make one (`plaintext`). Its tokens are the whole chat rendered by the chat
//! template without a generation prompt; the prompt is every message but the last, rendered with one, so the
//! trained tokens are the last (assistant) message and what the template closes it with. Serving the rows is
//! [`DatasetRows`]'s business.

use serde_json::Value;
use trinity_config::buffer::{ExperienceBufferConfig, PromptType};
use trinity_model::{ChatTemplate, Tokenizer};
use trinity_trainer::TrainRow;

use crate::dataset::DatasetRows;
use crate::error::RftError;

/// The rows of an SFT dataset: one training row per dataset row.
pub type SftRows = DatasetRows;

impl DatasetRows {
    /// Reads and tokenizes every row of `buffer` (a `file` buffer) as an SFT chat, cutting responses at
    /// `max_model_len` tokens in all; errors name `key` (where the config sets this dataset).
    pub fn load_sft(
        buffer: &ExperienceBufferConfig,
        key: &'static str,
        total_epochs: u32,
        (tokenizer, template): (&Tokenizer, &ChatTemplate),
        max_model_len: usize,
    ) -> Result<SftRows, RftError> {
        DatasetRows::load(buffer, key, total_epochs, max_model_len, |row| {
            let format = &buffer.format;
            let messages = match format.prompt_type {
                PromptType::Messages => messages_of(row, &format.messages_key)?,
                PromptType::Plaintext => {
                    let mut messages = plaintext_prompt(row, buffer)?;
                    messages.push(assistant(row, &format.response_key, "format.response_key")?);
                    messages
                }
            };
            let tools = row.get(&format.tools_key).filter(|t| !t.is_null()).map(tools_of).transpose()?;
            Ok(vec![tokenize(&messages, tools.as_ref(), tokenizer, template)?])
        })
    }
}

/// The message list of a `messages` row; a JSON string holding the list is accepted too, as Trinity does.
pub(crate) fn messages_of(row: &trinity_buffer::Row, key: &str) -> Result<Vec<Value>, String> {
    let value = row.get(key).ok_or_else(|| format!("no `{key}` field (format.messages_key)"))?;
    let parsed;
    let value = match value {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text).map_err(|e| format!("`{key}` is not a JSON list: {e}"))?;
            &parsed
        }
        other => other,
    };
    let list = value.as_array().ok_or_else(|| format!("`{key}` is not a list of messages"))?;
    if list.is_empty() {
        return Err(format!("`{key}` is empty"));
    }
    for message in list {
        if message.get("role").and_then(Value::as_str).is_none() {
            return Err(format!("a message of `{key}` has no `role`"));
        }
    }
    Ok(list.clone())
}

/// The prompt of a `plaintext` row: the system prompt (`system_prompt_key`'s field, else `system_prompt`) and the
/// user prompt (`prompt_key`).
pub(crate) fn plaintext_prompt(
    row: &trinity_buffer::Row,
    buffer: &ExperienceBufferConfig,
) -> Result<Vec<Value>, String> {
    let format = &buffer.format;
    let mut messages = Vec::new();
    let system = match &format.system_prompt_key {
        Some(key) => Some(text_field(row, key, "format.system_prompt_key")?),
        None => format.system_prompt.clone(),
    };
    if let Some(system) = system {
        messages.push(serde_json::json!({"role": "system", "content": system}));
    }
    let prompt = text_field(row, &format.prompt_key, "format.prompt_key")?;
    messages.push(serde_json::json!({"role": "user", "content": prompt}));
    Ok(messages)
}

/// An assistant message holding the text of `key`'s field.
pub(crate) fn assistant(row: &trinity_buffer::Row, key: &str, what: &str) -> Result<Value, String> {
    Ok(serde_json::json!({"role": "assistant", "content": text_field(row, key, what)?}))
}

/// A field as text (a non-string value as its JSON), or an error naming the config key that names the field.
fn text_field(row: &trinity_buffer::Row, key: &str, what: &str) -> Result<String, String> {
    row.get(key)
        .map(|v| v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string()))
        .ok_or_else(|| format!("no `{key}` field ({what})"))
}

/// Tool definitions: a list, or a JSON string holding one.
pub(crate) fn tools_of(value: &Value) -> Result<Value, String> {
    match value {
        Value::String(text) => serde_json::from_str(text).map_err(|e| format!("tools are not valid JSON: {e}")),
        other => Ok(other.clone()),
    }
}

/// One chat as a training row: the last message is the trained response.
pub(crate) fn tokenize(
    messages: &[Value],
    tools: Option<&Value>,
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
) -> Result<TrainRow, String> {
    continuation(&messages[..messages.len() - 1], messages, tools, (tokenizer, template))
}

/// `chat` (which begins with `prompt`) as a training row whose response is what it adds to `prompt`: the prompt
/// rendered with a generation prompt, the whole chat without one, as `apply_chat_template` does (the template
/// writes the special tokens, the tokenizer adds none).
pub(crate) fn continuation(
    prompt: &[Value],
    chat: &[Value],
    tools: Option<&Value>,
    (tokenizer, template): (&Tokenizer, &ChatTemplate),
) -> Result<TrainRow, String> {
    let encode = |messages: &[Value], generation_prompt: bool| -> Result<Vec<i64>, String> {
        let text = template.render(messages, generation_prompt, tools).map_err(|e| e.to_string())?;
        let ids = tokenizer.encode(&text, false).map_err(|e| e.to_string())?;
        Ok(ids.into_iter().map(i64::from).collect())
    };
    let full = encode(chat, false)?;
    let prompt = encode(prompt, true)?;
    if prompt.is_empty() || full.len() <= prompt.len() || full[..prompt.len()] != prompt[..] {
        return Err(format!(
            "the chat template renders the prompt ({} tokens) as no prefix of the whole chat ({} tokens); the \
             reply must be the assistant's",
            prompt.len(),
            full.len()
        ));
    }
    Ok(TrainRow::sft(&prompt, &full[prompt.len()..]))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

    use serde_json::json;
    use trinity_config::buffer::StorageType;

    use super::*;

    const KEY: &str = "buffer.trainer_input.auxiliary_buffers";

    /// The tiny test model's tokenizer and chat template (shared with the DPO rows' tests).
    pub(crate) fn tiny() -> (Tokenizer, ChatTemplate) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/tiny/llama_tied");
        let tokenizer = Tokenizer::from_files(&dir.join("tokenizer.json"), None).unwrap();
        let template = ChatTemplate::from_file(&dir.join("chat_template.jinja"), None, None).unwrap();
        (tokenizer, template)
    }

    fn buffer(dir: &Path, rows: &[Value], edit: impl FnOnce(&mut ExperienceBufferConfig)) -> ExperienceBufferConfig {
        let path = dir.join("sft.jsonl");
        let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let mut buffer = ExperienceBufferConfig {
            name: "sft".into(),
            storage_type: StorageType::File,
            path: Some(path.display().to_string()),
            ..ExperienceBufferConfig::default()
        };
        edit(&mut buffer);
        buffer
    }

    #[test]
    fn the_last_message_is_the_trained_response() {
        let dir = tempfile::tempdir().unwrap();
        let (tokenizer, template) = tiny();
        let chat = json!([{"role": "user", "content": "ab1"}, {"role": "assistant", "content": "1"}]);
        let buffer = buffer(dir.path(), &[json!({"messages": chat})], |b| b.format.messages_key = "messages".into());
        let mut rows = SftRows::load_sft(&buffer, KEY, 1, (&tokenizer, &template), 256).unwrap();
        let row = rows.take(1).unwrap().remove(0);
        let prompt = template.render(chat.as_array().unwrap().split_last().unwrap().1, true, None).unwrap();
        let prompt_ids = tokenizer.encode(&prompt, false).unwrap();
        assert_eq!(row.prompt_length, prompt_ids.len());
        let response = tokenizer
            .decode(&row.tokens[row.prompt_length..].iter().map(|&t| t as u32).collect::<Vec<_>>(), false)
            .unwrap();
        // The reply and what the template closes it with (the tiny vocabulary has no newline token).
        assert_eq!(response, "1<|im_end|>");
        assert!(row.action_mask.iter().all(|&m| m) && row.action_mask.len() == row.response_length());
        assert_eq!(rows.remaining(), 0);
    }

    #[test]
    fn plaintext_rows_become_system_user_assistant_chats() {
        let dir = tempfile::tempdir().unwrap();
        let (tokenizer, template) = tiny();
        let rows = [json!({"q": "ab2", "a": "2", "sys": "be brief"})];
        let buffer = buffer(dir.path(), &rows, |b| {
            b.format.prompt_type = PromptType::Plaintext;
            b.format.prompt_key = "q".into();
            b.format.response_key = "a".into();
            b.format.system_prompt_key = Some("sys".into());
        });
        let mut loaded = SftRows::load_sft(&buffer, KEY, 3, (&tokenizer, &template), 256).unwrap();
        assert_eq!(loaded.remaining(), 3, "one row, three passes");
        let row = loaded.take(1).unwrap().remove(0);
        let text = tokenizer.decode(&row.tokens.iter().map(|&t| t as u32).collect::<Vec<_>>(), false).unwrap();
        assert_eq!(
            text,
            "<|im_start|>systembe brief<|im_end|><|im_start|>userab2<|im_end|><|im_start|>assistant2<|im_end|>"
        );
        assert_eq!(loaded.take(2).unwrap().len(), 2);
        let error = loaded.take(1).unwrap_err().to_string();
        assert!(error.contains("raise its total_epochs"), "{error}");
    }

    #[test]
    fn a_malformed_row_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (tokenizer, template) = tiny();
        let rows = [
            json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}),
            json!({"text": "no messages"}),
        ];
        let buffer = buffer(dir.path(), &rows, |b| b.format.messages_key = "messages".into());
        let error = SftRows::load_sft(&buffer, KEY, 1, (&tokenizer, &template), 256).unwrap_err().to_string();
        assert!(error.contains("row 1") && error.contains("no `messages` field"), "{error}");
    }
}
