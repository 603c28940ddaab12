//! JSON text spelled as Python's `json.dumps` writes it, where trinity must match text that Trinity-RFT or vLLM
//! produce byte for byte: a tool list in a prompt the model was trained on, call arguments a client compares,
//! the sorted-key form Tool-N1's reward compares calls in. Python's defaults differ from `serde_json`'s compact
//! form in the separators (`", "` and `": "`) and, unless `ensure_ascii=False`, in escaping every character
//! outside printable ASCII as `\uXXXX` (UTF-16 surrogate pairs beyond the BMP).

use serde_json::Value;

/// The `json.dumps` arguments that change the text; [`Dumps::PYTHON`] is the call without arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dumps {
    /// `ensure_ascii`: escape every character outside `' '..='~'`.
    pub ensure_ascii: bool,
    /// `sort_keys`: object keys in code-point order instead of insertion order.
    pub sort_keys: bool,
}

impl Dumps {
    /// `json.dumps(value)`.
    pub const PYTHON: Self = Self { ensure_ascii: true, sort_keys: false };

    /// `value` as this call of `json.dumps` writes it.
    pub fn text(self, value: &Value) -> String {
        let mut out = String::new();
        self.write(&mut out, value);
        out
    }

    fn write(self, out: &mut String, value: &Value) {
        match value {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => out.push_str(&n.to_string()),
            Value::String(s) => self.write_string(out, s),
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    self.write(out, item);
                }
                out.push(']');
            }
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (key, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    self.write_string(out, key);
                    out.push_str(": ");
                    self.write(out, item);
                }
                out.push('}');
            }
        }
    }

    fn write_string(self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                ' '..='~' => out.push(c),
                // Without `ensure_ascii` Python escapes only the C0 controls (DEL and beyond pass through).
                c if !self.ensure_ascii && c >= ' ' => out.push(c),
                c => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
            }
        }
        out.push('"');
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Each expected text is what CPython 3.12's `json.dumps` prints for the same value.
    #[test]
    fn texts_match_pythons_json_dumps() {
        let value = json!({"b": [1, 2.5, null, true], "a": "é\u{1F600}\u{7f}\u{1}\n\"q\""});
        assert_eq!(
            Dumps::PYTHON.text(&value),
            r#"{"b": [1, 2.5, null, true], "a": "\u00e9\ud83d\ude00\u007f\u0001\n\"q\""}"#
        );
        let unicode = Dumps { ensure_ascii: false, sort_keys: true };
        assert_eq!(
            unicode.text(&value),
            "{\"a\": \"é\u{1F600}\u{7f}\\u0001\\n\\\"q\\\"\", \"b\": [1, 2.5, null, true]}"
        );
        assert_eq!(Dumps::PYTHON.text(&json!({})), "{}");
        assert_eq!(Dumps::PYTHON.text(&json!([])), "[]");
    }
}
