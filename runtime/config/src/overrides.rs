//! `--set KEY.PATH=VALUE` overrides, applied to the parsed tree before interpolation and validation.
//!
//! Values are typed like YAML (`--set algorithm.optimizer.lr=1e-5` is a number, `--set a.b=[1,2]` a list),
//! so an override goes through exactly the same checks as the same value written in the file.

use serde_json::{Map, Value};

use crate::error::ConfigError;
use crate::yaml::{self, plain_scalar};

/// The deepest key path an override may write. Trinity-RFT's deepest keys have about eight segments; a bound
/// keeps a pathological argument from building a tree whose depth every later walk recurses through.
const MAX_SEGMENTS: usize = 64;

/// One parsed override.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// The argument as the user wrote it, for messages.
    pub arg: String,
    /// Key path segments (`buffer`, `eval_tasksets`, `0`, `name`).
    pub segments: Vec<String>,
    /// The key path in the form errors use (`buffer.eval_tasksets[0].name`).
    pub key: String,
    pub value: Value,
}

impl Override {
    /// Parses `KEY.PATH=VALUE`.
    pub fn parse(arg: &str) -> Result<Override, ConfigError> {
        let fail = |message: &str| ConfigError::Override { arg: arg.to_owned(), message: message.to_owned() };
        let (key, raw) = arg.split_once('=').ok_or_else(|| fail("expected KEY.PATH=VALUE"))?;
        let mut segments = Vec::new();
        let parts = key.trim().split('.');
        if parts.clone().count() > MAX_SEGMENTS {
            return Err(fail(&format!("a key path has at most {MAX_SEGMENTS} segments; no config key is that deep")));
        }
        for part in parts {
            // `tasksets[0]` and `tasksets.0` both address a list item.
            let (name, indexes) = match part.find('[') {
                Some(i) => (&part[..i], &part[i..]),
                None => (part, ""),
            };
            if !name.is_empty() {
                segments.push(name.to_owned());
            }
            for index in indexes.split_terminator(']') {
                let index = index
                    .strip_prefix('[')
                    .filter(|i| i.parse::<usize>().is_ok())
                    .ok_or_else(|| fail("list indexes are written `key[0]`"))?;
                segments.push(index.to_owned());
            }
            if name.is_empty() && indexes.is_empty() {
                return Err(fail("empty key segment"));
            }
        }
        let raw = raw.trim();
        let value = if raw.starts_with('[') || raw.starts_with('{') {
            yaml::parse(raw).map(|(value, _)| value).map_err(|e| fail(&format!("invalid YAML value: {}", e.message)))?
        } else if raw.is_empty() {
            Value::String(String::new())
        } else if let Some(inner) = quoted(raw) {
            Value::String(inner.to_owned())
        } else {
            plain_scalar(raw).map_err(|m| fail(&m))?
        };
        Ok(Override { arg: arg.to_owned(), key: display_key(&segments), segments, value })
    }

    /// Writes the value into the tree, creating missing mappings on the way.
    pub fn apply(&self, tree: &mut Value) -> Result<(), ConfigError> {
        let fail = |message: String| ConfigError::Override { arg: self.arg.clone(), message };
        if tree.is_null() {
            *tree = Value::Object(Map::new());
        }
        let mut node = tree;
        for (depth, segment) in self.segments.iter().enumerate() {
            let last = depth + 1 == self.segments.len();
            // Built only for a message: per segment it would make a long key quadratic.
            let here = || display_key(&self.segments[..depth]);
            node = match node {
                Value::Object(map) => {
                    let child = map.entry(segment.clone()).or_insert(Value::Null);
                    if !last && child.is_null() {
                        *child = Value::Object(Map::new());
                    }
                    child
                }
                Value::Array(items) => {
                    let index: usize =
                        segment.parse().map_err(|_| fail(format!("`{}` is a list; index it with [N]", here())))?;
                    let len = items.len();
                    items
                        .get_mut(index)
                        .ok_or_else(|| fail(format!("`{}` has {len} items; index {index} is out of range", here())))?
                }
                _ => {
                    return Err(fail(format!("`{}` is a plain value, it has no key `{segment}`", here())));
                }
            };
        }
        *node = self.value.clone();
        Ok(())
    }
}

fn quoted(raw: &str) -> Option<&str> {
    raw.strip_prefix('\'')
        .and_then(|r| r.strip_suffix('\''))
        .or_else(|| raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')))
}

/// The key path in the form errors use, written in one pass (`join_key` per segment would copy it each time).
fn display_key(segments: &[String]) -> String {
    let mut key = String::new();
    for segment in segments {
        if segment.parse::<usize>().is_ok() {
            key.push('[');
            key.push_str(segment);
            key.push(']');
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(segment);
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sets_typed_values_and_creates_sections() {
        let mut tree = json!({"algorithm": {"algorithm_type": "grpo"}});
        Override::parse("algorithm.optimizer.lr=1e-5").unwrap().apply(&mut tree).unwrap();
        Override::parse("buffer.batch_size=4").unwrap().apply(&mut tree).unwrap();
        Override::parse("model.model_path='8'").unwrap().apply(&mut tree).unwrap();
        Override::parse("rollout.stop=[a, b]").unwrap().apply(&mut tree).unwrap();
        assert_eq!(tree["algorithm"]["optimizer"]["lr"], json!(1e-5));
        assert_eq!(tree["buffer"]["batch_size"], json!(4));
        assert_eq!(tree["model"]["model_path"], json!("8"));
        assert_eq!(tree["rollout"]["stop"], json!(["a", "b"]));
    }

    #[test]
    fn indexes_lists() {
        let mut tree = json!({"buffer": {"eval_tasksets": [{"name": "a"}, {"name": "b"}]}});
        let set = Override::parse("buffer.eval_tasksets[1].name=c").unwrap();
        assert_eq!(set.key, "buffer.eval_tasksets[1].name");
        set.apply(&mut tree).unwrap();
        Override::parse("buffer.eval_tasksets.0.name=z").unwrap().apply(&mut tree).unwrap();
        assert_eq!(tree["buffer"]["eval_tasksets"], json!([{"name": "z"}, {"name": "c"}]));
        let error = Override::parse("buffer.eval_tasksets[5].name=c").unwrap().apply(&mut tree).unwrap_err();
        assert!(error.to_string().contains("out of range"), "{error}");
    }

    #[test]
    fn malformed_overrides_are_named_errors() {
        for bad in ["no_equals_sign", "a..b=1", "a[x]=1", "=1"] {
            let error = Override::parse(bad).unwrap_err();
            assert!(error.to_string().starts_with(&format!("--set {bad}:")), "{error}");
        }
        let mut tree = json!({"project": "p"});
        let error = Override::parse("project.x=1").unwrap().apply(&mut tree).unwrap_err();
        assert!(error.to_string().contains("plain value"), "{error}");
    }

    #[test]
    fn a_pathologically_deep_key_is_refused_before_any_tree_is_built() {
        let deep = format!("{}=1", vec!["a"; 10_000].join("."));
        let error = Override::parse(&deep).unwrap_err();
        assert!(error.to_string().contains("at most 64 segments"), "{error}");
        let ok = format!("{}=1", vec!["a"; 64].join("."));
        let set = Override::parse(&ok).unwrap();
        let mut tree = Value::Null;
        set.apply(&mut tree).unwrap();
        assert_eq!(set.key.len(), 64 * 2 - 1);
    }
}
