//! Continued pre-training rows read from a dataset, as Trinity-RFT 0.6.0's `CPTFormatter` makes them: the
//! training data of algorithm `cpt` in mode `train` (`buffer.trainer_input.experience_buffer`).
//!
//! A row is one plain-text field (`format.prompt_key`, with `prompt_type: plaintext`, which the config layer
//! requires). Its tokens are that text as the tokenizer encodes it with its special tokens (Hugging Face's
//! `tokenizer(text)`, so a tokenizer that adds a BOS adds it here too), with no chat template. The first token is
//! the prompt and every later one is trained, so the `sft` loss over the row is the next-token loss of the whole
//! text: the first token has no context to be predicted from.

use trinity_model::Tokenizer;
use trinity_trainer::TrainRow;

use crate::dataset::DatasetRows;
use crate::error::RftError;
use trinity_config::buffer::ExperienceBufferConfig;

impl DatasetRows {
    /// Reads and tokenizes every row of `buffer` (a `file` buffer) as CPT text, cutting rows at `max_model_len`
    /// tokens; errors name `key` (where the config sets this dataset), the row and the field.
    pub fn load_cpt(
        buffer: &ExperienceBufferConfig,
        key: &'static str,
        total_epochs: u32,
        tokenizer: &Tokenizer,
        max_model_len: usize,
    ) -> Result<DatasetRows, RftError> {
        let field = buffer.format.prompt_key.as_str();
        DatasetRows::load(buffer, key, total_epochs, max_model_len, |row| {
            Ok(vec![cpt_row(text_of(row, field)?, field, tokenizer)?])
        })
    }
}

/// The text of a CPT row. Only a string is text: a number or a list in the field is a malformed row (0.6.0 would
/// hand it to the tokenizer, which refuses it too), and `null` is how a dataset marks a missing value.
fn text_of<'a>(row: &'a trinity_buffer::Row, field: &str) -> Result<&'a str, String> {
    match row.get(field) {
        Some(serde_json::Value::String(text)) => Ok(text),
        Some(serde_json::Value::Null) | None => {
            let fields: Vec<&str> = row.keys().map(String::as_str).collect();
            Err(format!(
                "no `{field}` field (format.prompt_key); the row has {}",
                if fields.is_empty() { "no fields".to_owned() } else { format!("`{}`", fields.join("`, `")) }
            ))
        }
        Some(other) => Err(format!("`{field}` (format.prompt_key) holds {}, not text", json_kind(other))),
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// One text as a training row: its first token is the prompt, the rest the trained response. A text of no
/// tokens is refused (0.6.0 fails on it building the experience); a one-token text trains nothing, as there.
fn cpt_row(text: &str, field: &str, tokenizer: &Tokenizer) -> Result<TrainRow, String> {
    let ids = tokenizer.encode(text, true).map_err(|e| format!("`{field}`: {e}"))?;
    let ids: Vec<i64> = ids.into_iter().map(i64::from).collect();
    let Some((first, rest)) = ids.split_first() else {
        return Err(format!("`{field}` (format.prompt_key) encodes to no tokens; remove the row or give it text"));
    };
    Ok(TrainRow::sft(std::slice::from_ref(first), rest))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};
    use trinity_config::buffer::{PromptType, StorageType};

    use super::*;

    const KEY: &str = "buffer.trainer_input.experience_buffer";

    fn tiny_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/tiny/llama_tied")
    }

    fn tiny() -> Tokenizer {
        Tokenizer::from_files(&tiny_dir().join("tokenizer.json"), None).unwrap()
    }

    fn buffer(dir: &Path, rows: &[Value], prompt_key: &str) -> ExperienceBufferConfig {
        let path = dir.join("corpus.jsonl");
        std::fs::write(&path, rows.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
        let mut buffer = ExperienceBufferConfig {
            name: "corpus".into(),
            storage_type: StorageType::File,
            path: Some(path.display().to_string()),
            ..ExperienceBufferConfig::default()
        };
        buffer.format.prompt_type = PromptType::Plaintext;
        buffer.format.prompt_key = prompt_key.into();
        buffer
    }

    fn ids(tokenizer: &Tokenizer, text: &str) -> Vec<i64> {
        tokenizer.encode(text, false).unwrap().into_iter().map(i64::from).collect()
    }

    #[test]
    fn every_token_but_the_first_is_trained() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tiny();
        // 0.6.0's default field (`prompt`) and a configured one (`text`); other fields are ignored.
        for key in ["prompt", "text"] {
            let rows = [json!({key: "abc de", "id": 1}), json!({key: "fg"})];
            let mut loaded = DatasetRows::load_cpt(&buffer(dir.path(), &rows, key), KEY, 1, &tokenizer, 64).unwrap();
            let got = loaded.take(2).unwrap();
            for (row, text) in got.iter().zip(["abc de", "fg"]) {
                // No chat template: exactly the text's tokens (the tiny tokenizer adds no special tokens).
                assert_eq!(row.tokens, ids(&tokenizer, text), "{key}: {text}");
                assert_eq!(row.prompt_length, 1);
                assert_eq!(row.action_mask, vec![true; row.tokens.len() - 1]);
            }
        }
    }

    #[test]
    fn the_tokenizers_special_tokens_are_added_as_transformers_does() {
        // The tiny tokenizer with a post-processor that starts every text with <|endoftext|> (a BOS).
        let mut json: Value =
            serde_json::from_str(&std::fs::read_to_string(tiny_dir().join("tokenizer.json")).unwrap()).unwrap();
        json["post_processor"] = json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}
        });
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokenizer.json");
        std::fs::write(&file, json.to_string()).unwrap();
        let tokenizer = Tokenizer::from_files(&file, None).unwrap();
        let buffer = buffer(dir.path(), &[json!({"text": "abc"})], "text");
        let row = DatasetRows::load_cpt(&buffer, KEY, 1, &tokenizer, 64).unwrap().take(1).unwrap().remove(0);
        // The BOS is the prompt, so the first letter is trained too.
        assert_eq!(row.tokens, [0, 3, 4, 5]);
        assert_eq!((row.prompt_length, row.action_mask.len()), (1, 3));
    }

    #[test]
    fn long_texts_are_cut_at_max_model_len() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tiny();
        let buffer = buffer(dir.path(), &[json!({"text": "abcdefghij"})], "text");
        let row = DatasetRows::load_cpt(&buffer, KEY, 1, &tokenizer, 4).unwrap().take(1).unwrap().remove(0);
        assert_eq!(row.tokens, ids(&tokenizer, "abcd"));
        assert_eq!(row.action_mask.len(), 3);
    }

    #[test]
    fn malformed_rows_are_named_with_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tiny();
        let error = |rows: &[Value]| {
            let buffer = buffer(dir.path(), rows, "text");
            DatasetRows::load_cpt(&buffer, KEY, 1, &tokenizer, 64).unwrap_err().to_string()
        };
        let ok = json!({"text": "ab"});
        let missing = error(&[ok.clone(), json!({"content": "ab"})]);
        for piece in [KEY, "corpus", "row 1", "no `text` field (format.prompt_key)", "the row has `content`"] {
            assert!(missing.contains(piece), "{piece:?} in {missing}");
        }
        let null = error(&[json!({"text": null})]);
        assert!(null.contains("row 0") && null.contains("no `text` field"), "{null}");
        let number = error(&[ok.clone(), ok.clone(), json!({"text": 7})]);
        assert!(number.contains("row 2") && number.contains("`text` (format.prompt_key) holds a number"), "{number}");
        let list = error(&[json!({"text": ["ab"]})]);
        assert!(list.contains("holds a list, not text"), "{list}");
        let empty = error(&[json!({"text": ""})]);
        assert!(empty.contains("row 0") && empty.contains("encodes to no tokens"), "{empty}");
    }

    #[test]
    fn a_one_token_text_trains_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tiny();
        let buffer = buffer(dir.path(), &[json!({"text": "a"})], "text");
        let row = DatasetRows::load_cpt(&buffer, KEY, 1, &tokenizer, 64).unwrap().take(1).unwrap().remove(0);
        assert_eq!((row.tokens.len(), row.prompt_length, row.response_length()), (1, 1, 0));
    }
}
