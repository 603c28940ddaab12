//! DPO pairs read from a dataset, as Trinity-RFT's `DPOFormatter` makes them (`algorithm_type: dpo`, mode `train`).
//!
//! A row holds a prompt and two replies: `plaintext` rows have the system prompt (`system_prompt_key` or
//! `system_prompt`), `prompt_key`, `chosen_key` and `rejected_key` as text; `messages` rows have the prompt's message
//! list under `messages_key` and the chosen and rejected replies as message lists (or one text each). The prompt is
//! rendered with a generation prompt; each reply's tokens are what the whole chat, rendered without one, adds after
//! the prompt. Each row becomes two training rows, chosen first, which the trainer keeps together in one
//! micro-batch (the DPO loss compares them).

use serde_json::Value;
use trinity_buffer::Row;
use trinity_config::buffer::{ExperienceBufferConfig, PromptType};
use trinity_model::{ChatTemplate, Tokenizer};

use crate::dataset::DatasetRows;
use crate::error::RftError;
use crate::sft_data::{assistant, continuation, messages_of, plaintext_prompt};

impl DatasetRows {
    /// Reads and tokenizes every row of `buffer` as a DPO pair (two rows: chosen, rejected).
    pub fn load_dpo(
        buffer: &ExperienceBufferConfig,
        key: &'static str,
        total_epochs: u32,
        (tokenizer, template): (&Tokenizer, &ChatTemplate),
        max_model_len: usize,
    ) -> Result<DatasetRows, RftError> {
        DatasetRows::load(buffer, key, total_epochs, max_model_len, |row| {
            let format = &buffer.format;
            let (prompt, chosen, rejected) = match format.prompt_type {
                PromptType::Plaintext => (
                    plaintext_prompt(row, buffer)?,
                    vec![assistant(row, &format.chosen_key, "format.chosen_key")?],
                    vec![assistant(row, &format.rejected_key, "format.rejected_key")?],
                ),
                PromptType::Messages => (
                    messages_of(row, &format.messages_key)?,
                    reply(row, &format.chosen_key, "format.chosen_key")?,
                    reply(row, &format.rejected_key, "format.rejected_key")?,
                ),
            };
            let row = |reply: Vec<Value>| {
                let chat: Vec<Value> = prompt.iter().cloned().chain(reply).collect();
                continuation(&prompt, &chat, None, (tokenizer, template))
            };
            Ok(vec![row(chosen)?, row(rejected)?])
        })
    }
}

/// A `messages` row's reply: a message list, a JSON string holding one, or plain text (one assistant message).
fn reply(row: &Row, key: &str, what: &str) -> Result<Vec<Value>, String> {
    match row.get(key) {
        Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Array(list)) => Ok(list),
            _ => Ok(vec![assistant(row, key, what)?]),
        },
        Some(Value::Array(list)) if !list.is_empty() => Ok(list.clone()),
        Some(_) => Err(format!("`{key}` ({what}) is neither a message list nor text")),
        None => Err(format!("no `{key}` field ({what})")),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;
    use trinity_config::buffer::StorageType;

    use super::*;
    use crate::sft_data::tests::tiny;

    const KEY: &str = "buffer.trainer_input.experience_buffer";

    fn buffer(dir: &Path, rows: &[Value], prompt_type: PromptType) -> ExperienceBufferConfig {
        let path = dir.join("dpo.jsonl");
        std::fs::write(&path, rows.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
        let mut buffer = ExperienceBufferConfig {
            name: "pairs".into(),
            storage_type: StorageType::File,
            path: Some(path.display().to_string()),
            ..ExperienceBufferConfig::default()
        };
        buffer.format.prompt_type = prompt_type;
        buffer.format.messages_key = "messages".into();
        buffer
    }

    fn text(tokenizer: &Tokenizer, ids: &[i64]) -> String {
        tokenizer.decode(&ids.iter().map(|&t| t as u32).collect::<Vec<_>>(), false).unwrap()
    }

    #[test]
    fn plaintext_and_messages_rows_give_the_same_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (tokenizer, template) = tiny();
        let plain =
            buffer(dir.path(), &[json!({"prompt": "ab1", "chosen": "1", "rejected": "2"})], PromptType::Plaintext);
        let mut plain = DatasetRows::load_dpo(&plain, KEY, 1, (&tokenizer, &template), 256).unwrap();
        let rows = plain.take(1).unwrap();
        assert_eq!(rows.len(), 2, "chosen then rejected");
        assert_eq!(rows[0].prompt_length, rows[1].prompt_length);
        assert_eq!(text(&tokenizer, &rows[0].tokens[rows[0].prompt_length..]), "1<|im_end|>");
        assert_eq!(text(&tokenizer, &rows[1].tokens[rows[1].prompt_length..]), "2<|im_end|>");

        let chat = json!({
            "messages": [{"role": "user", "content": "ab1"}],
            "chosen": [{"role": "assistant", "content": "1"}],
            "rejected": "2",
        });
        let messages = buffer(dir.path(), &[chat], PromptType::Messages);
        let mut messages = DatasetRows::load_dpo(&messages, KEY, 1, (&tokenizer, &template), 256).unwrap();
        let same = messages.take(1).unwrap();
        assert_eq!(same[0].tokens, rows[0].tokens);
        assert_eq!(same[1].tokens, rows[1].tokens);
    }

    #[test]
    fn a_row_without_its_rejected_reply_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (tokenizer, template) = tiny();
        let rows = [json!({"prompt": "a", "chosen": "1", "rejected": "2"}), json!({"prompt": "b", "chosen": "1"})];
        let buffer = buffer(dir.path(), &rows, PromptType::Plaintext);
        let error = DatasetRows::load_dpo(&buffer, KEY, 1, (&tokenizer, &template), 256).unwrap_err().to_string();
        assert!(error.contains(KEY) && error.contains("row 1") && error.contains("format.rejected_key"), "{error}");
    }
}
