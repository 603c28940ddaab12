//! Chat templates rendered with minijinja the way transformers renders them with Jinja2.
//!
//! transformers compiles templates with `trim_blocks=True, lstrip_blocks=True` and loop controls, defines
//! `raise_exception(msg)` and `strftime_now(fmt)`, overrides `tojson` to Python's `json.dumps(ensure_ascii=False)`
//! (", " and ": " separators, no HTML escaping, keys in insertion order), and passes `messages`,
//! `add_generation_prompt`, `tools`, `documents` and the special tokens (`bos_token`, `eos_token`, ...) as
//! variables. Python string methods (`.strip()`, `.startswith()`, `.split()`, ...) come from minijinja-contrib's
//! pycompat callback. Templates are compiled once, at construction.
//!
//! A template comes from a model file, so it is untrusted code: each rendering runs on a fuel budget
//! ([`TEMPLATE_FUEL`] instructions, minijinja's `fuel`) and writes into a buffer capped at
//! [`MAX_RENDERED_BYTES`]; a template that loops or inflates its output fails with an error naming it. Values a
//! template builds without printing them are not bounded: minijinja caps one `*` repetition at 100 MB but not
//! `~` concatenation, so a loaded template could double a string a few times within its fuel (found while
//! fuzzing; minijinja offers no hook on value sizes).

use std::path::Path;

use minijinja::value::{Kwargs, Serde, Value as JValue, ValueKind};
use minijinja::{Environment, Error as JError, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ModelError, Result};

/// One chat message. Extra fields (tool calls, names) can be passed by rendering `serde_json::Value`s instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// Instructions one rendering may execute. Real templates render a long conversation with tools in well under
/// 100k; a template that exceeds 5M is looping, and stops within a fraction of a second.
pub const TEMPLATE_FUEL: u64 = 5_000_000;

/// Bytes one rendering may produce: far beyond any context window (a 128k-token prompt is ~0.5 MB of text),
/// small enough that a template inflating its output cannot take the process's memory.
pub const MAX_RENDERED_BYTES: usize = 64 << 20;

/// A compiled chat template plus the special tokens it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Where the template came from (a file, or a file and key), for errors.
    name: String,
    source: String,
    bos_token: String,
    eos_token: String,
    /// `enable_thinking` as the template sees it (Qwen3 templates read it); unset leaves it undefined.
    enable_thinking: Option<bool>,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`. `bos_token` / `eos_token` are the strings the template sees (empty when absent).
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<JValue, JError> {
            Err(JError::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_template_owned(NAME, source.to_owned()).map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        Ok(Self {
            env,
            name: "chat template".to_owned(),
            source: source.to_owned(),
            bos_token: bos_token.unwrap_or_default().to_owned(),
            eos_token: eos_token.unwrap_or_default().to_owned(),
            enable_thinking: None,
        })
    }

    /// Passes `enable_thinking` to every rendering (Trinity-RFT's `enable_thinking`, handed to
    /// `apply_chat_template` as a keyword); `None` leaves the variable undefined, the template's own default.
    pub fn with_enable_thinking(mut self, enable_thinking: Option<bool>) -> Self {
        self.enable_thinking = enable_thinking;
        self
    }

    /// The `enable_thinking` value renderings get.
    pub fn enable_thinking(&self) -> Option<bool> {
        self.enable_thinking
    }

    /// Names where the template came from (`dir/tokenizer_config.json chat_template`); rendering errors carry it.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Where the template came from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads a template from a `chat_template.jinja` file.
    pub fn from_file(path: &Path, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        let source = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let named = |e: ModelError| ModelError::ChatTemplate(format!("{}: {e}", path.display()));
        Ok(Self::new(&source, bos_token, eos_token).map_err(named)?.named(path.display().to_string()))
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (role/content pairs).
    pub fn apply(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<Value> =
            messages.iter().map(|m| serde_json::json!({"role": m.role, "content": m.content})).collect();
        self.render(&messages, add_generation_prompt, None)
    }

    /// Renders arbitrary JSON messages (tool calls etc.), with optional `tools`.
    pub fn render(&self, messages: &[Value], add_generation_prompt: bool, tools: Option<&Value>) -> Result<String> {
        let tmpl = self.env.get_template(NAME).map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        let ctx = minijinja::context! {
            messages => JValue::from(Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            tools => tools.map(|t| JValue::from(Serde(t))),
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        // Only a set value is passed: templates test `enable_thinking is defined`.
        let ctx = match self.enable_thinking {
            Some(flag) => minijinja::context! { enable_thinking => flag, ..ctx },
            None => ctx,
        };
        let mut out = CappedOutput { bytes: Vec::new(), cap: MAX_RENDERED_BYTES, over: false };
        let rendered = tmpl.render_captured_to(ctx, &mut out);
        if out.over {
            return Err(ModelError::ChatTemplate(format!(
                "{}: the rendered prompt exceeds {} MiB",
                self.name,
                MAX_RENDERED_BYTES >> 20
            )));
        }
        if let Err(e) = rendered {
            let mut msg = match e.kind() {
                ErrorKind::OutOfFuel => format!("ran past its budget of {TEMPLATE_FUEL} instructions (a loop?)"),
                _ => e.to_string(),
            };
            if let Some(detail) = e.detail() {
                msg = format!("{msg}: {detail}");
            }
            return Err(ModelError::ChatTemplate(format!("{}: {msg}", self.name)));
        }
        // minijinja writes `str` pieces whole, and a piece over the cap is refused whole, so this is UTF-8.
        String::from_utf8(out.bytes)
            .map_err(|e| ModelError::ChatTemplate(format!("{}: output is not UTF-8: {e}", self.name)))
    }
}

/// The rendering's output buffer: refuses a write that would take it past `cap`.
struct CappedOutput {
    bytes: Vec<u8>,
    cap: usize,
    over: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len().saturating_add(buf.len()) > self.cap {
            self.over = true;
            return Err(std::io::Error::other("rendered output over its cap"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `strftime_now(fmt)`: only the date formats chat templates use in practice; the date is today's in UTC.
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1) as usize];
    fmt.replace("%Y", &y.to_string())
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%B", month)
        .replace("%b", &month[..3])
}

/// Days since 1970-01-01 → (year, month, day) (Howard Hinnant's algorithm). Public because run directories
/// are named with the same UTC calendar date that templates' `strftime_now` renders.
pub fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`.
fn tojson(value: JValue, kwargs: Kwargs) -> std::result::Result<JValue, JError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&value, indent, 0, &mut out)?;
    Ok(JValue::from(out))
}

fn write_json(v: &JValue, indent: Option<usize>, depth: usize, out: &mut String) -> std::result::Result<(), JError> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let (item_sep, key_sep) = if indent.is_some() { (",", ": ") } else { (", ", ": ") };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(i) = v.as_i64() {
                out.push_str(&i.to_string());
            } else {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                // Python prints floats with a fractional part ("1.0"), like serde_json.
                out.push_str(&serde_json::to_string(&f).unwrap_or_else(|_| "NaN".into()));
            }
        }
        ValueKind::String => {
            let s = v.as_str().unwrap_or_default();
            out.push_str(
                &serde_json::to_string(s).map_err(|e| JError::new(ErrorKind::InvalidOperation, e.to_string()))?,
            );
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<JValue> = v.try_iter()?.collect();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(item, indent, depth + 1, out)?;
            }
            if !items.is_empty() {
                newline(out, depth);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let keys: Vec<JValue> = v.try_iter()?.collect();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                let key = k.as_str().map_or_else(|| k.to_string(), str::to_owned);
                out.push_str(
                    &serde_json::to_string(&key)
                        .map_err(|e| JError::new(ErrorKind::InvalidOperation, e.to_string()))?,
                );
                out.push_str(key_sep);
                write_json(&v.get_item(k)?, indent, depth + 1, out)?;
            }
            if !keys.is_empty() {
                newline(out, depth);
            }
            out.push('}');
        }
        _ => {
            out.push_str(&serde_json::to_string(&v.to_string()).unwrap_or_default());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_renders_like_transformers() {
        let t = ChatTemplate::new(CHATML, None, Some("<|im_end|>")).unwrap();
        let out = t.apply(&[ChatMessage::new("user", "hi")], true).unwrap();
        assert_eq!(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn trim_blocks_pycompat_raise_and_tojson() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}\n{% for m in messages %}\n  {{ m.content.strip().upper() }}|{{ m | tojson }}\n{% endfor %}";
        let t = ChatTemplate::new(src, Some("<s>"), None).unwrap();
        let out = t
            .render(&[serde_json::json!({"role": "user", "content": " hé <b> ", "n": [1, 2.5]})], false, None)
            .unwrap();
        assert_eq!(out, "  HÉ <B>|{\"role\": \"user\", \"content\": \" hé <b> \", \"n\": [1, 2.5]}\n");
        let err = t.apply(&[ChatMessage::new("system", "x")], false).unwrap_err();
        assert!(err.to_string().contains("first must be user"), "{err}");
        let t = ChatTemplate::new("{{ x | tojson(indent=2) }}{{ bos_token }}", Some("<s>"), None).unwrap();
        let tmpl = t.env.get_template(NAME).unwrap();
        let out = tmpl
            .render(minijinja::context! { x => JValue::from(Serde(serde_json::json!({"a": [1]}))), bos_token => "<s>" })
            .unwrap();
        assert_eq!(out, "{\n  \"a\": [\n    1\n  ]\n}<s>");
    }

    #[test]
    fn enable_thinking_reaches_the_template_only_when_set() {
        let src = "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>{% endif %}{{ messages[0].content }}";
        let unset = ChatTemplate::new(src, None, None).unwrap();
        assert_eq!(unset.apply(&[ChatMessage::new("user", "q")], true).unwrap(), "q");
        let off = ChatTemplate::new(src, None, None).unwrap().with_enable_thinking(Some(false));
        assert_eq!(off.apply(&[ChatMessage::new("user", "q")], true).unwrap(), "<think>\n\n</think>q");
        let on = ChatTemplate::new(src, None, None).unwrap().with_enable_thinking(Some(true));
        assert_eq!(on.apply(&[ChatMessage::new("user", "q")], true).unwrap(), "q");
    }

    #[test]
    fn a_looping_or_inflating_template_fails_with_its_name() {
        let messages = [ChatMessage::new("user", "hi")];
        let endless = "{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(endless, None, None).unwrap().named("crafted.gguf tokenizer.chat_template");
        let started = std::time::Instant::now();
        let err = t.apply(&messages, true).unwrap_err().to_string();
        assert!(err.contains("crafted.gguf tokenizer.chat_template") && err.contains("budget"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "took {:?}", started.elapsed());
        // Ten pieces of 10 MB: each is under minijinja's own cap on a repeated string, together they pass ours.
        let inflating = "{% for i in range(10) %}{{ 'x' * 10000000 }}{% endfor %}";
        let t = ChatTemplate::new(inflating, None, None).unwrap().named("model/chat_template.jinja");
        let err = t.apply(&messages, true).unwrap_err().to_string();
        assert!(err.contains("model/chat_template.jinja") && err.contains("exceeds 64 MiB"), "{err}");
    }

    #[test]
    fn syntax_errors_are_reported_at_construction() {
        assert!(matches!(ChatTemplate::new("{% for %}", None, None), Err(ModelError::ChatTemplate(_))));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
    }
}
