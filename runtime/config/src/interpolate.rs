//! OmegaConf's interpolation: `${oc.env:VAR}`, `${oc.env:VAR,default}` and absolute node references
//! `${a.b.c}` (the value at that key path of the same config, as Trinity-RFT's configs write
//! `${trainer.trainer_config.critic.ppo_max_token_len_per_gpu}`).
//!
//! A value that is exactly one interpolation is re-typed like a plain YAML scalar (so
//! `lr: ${oc.env:LR,1e-5}` is a number, as OmegaConf's schema conversion makes it) or, for a node reference,
//! takes the referenced value with its type; an interpolation inside a longer string is substituted as text.
//! `\${` is a literal `${`. Other resolvers and relative references are refused by name rather than left as
//! text that would fail later in a confusing way.

use serde_json::Value;

use crate::yaml::{join_index, join_key, plain_scalar};

/// Why one value could not be interpolated; the caller adds the file position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterpolationError {
    /// `${oc.env:VAR}` with `VAR` unset and no default.
    MissingEnv { key: String, var: String },
    /// Anything else: syntax, unsupported resolver.
    Invalid { key: String, message: String },
}

/// Looks up environment variables; a trait object so tests need not touch the process environment.
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Interpolates every string in the tree in place. Node references read the tree as it was before.
pub fn interpolate_tree(value: &mut Value, env: EnvLookup<'_>) -> Result<(), InterpolationError> {
    let root = value.clone();
    let context = Context { env, root: &root };
    walk(value, "", &context)
}

/// What an interpolation may read: the environment and the whole config.
struct Context<'a> {
    env: EnvLookup<'a>,
    root: &'a Value,
}

/// Longest chain of references followed (a reference to a value that is itself a reference).
const MAX_DEPTH: usize = 16;

fn walk(value: &mut Value, path: &str, context: &Context<'_>) -> Result<(), InterpolationError> {
    match value {
        Value::String(text) => {
            if text.contains("${") {
                *value = interpolate_in(text, path, context, 0)?;
            }
            Ok(())
        }
        Value::Array(items) => {
            items.iter_mut().enumerate().try_for_each(|(i, item)| walk(item, &join_index(path, i), context))
        }
        Value::Object(map) => map.iter_mut().try_for_each(|(k, item)| walk(item, &join_key(path, k), context)),
        Value::Null | Value::Bool(_) | Value::Number(_) => Ok(()),
    }
}

/// Interpolates one string value found at `key`, with environment lookups only (no config to refer to).
pub fn interpolate_string(text: &str, key: &str, env: EnvLookup<'_>) -> Result<Value, InterpolationError> {
    interpolate_in(text, key, &Context { env, root: &Value::Null }, 0)
}

fn interpolate_in(text: &str, key: &str, context: &Context<'_>, depth: usize) -> Result<Value, InterpolationError> {
    let invalid = |message: String| InterpolationError::Invalid { key: key.to_owned(), message };
    let mut out = String::new();
    let mut rest = text;
    let mut pieces = 0usize;
    let mut whole: Option<Resolved> = None;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("\\${") {
            out.push_str("${");
            rest = after;
            pieces += 1;
            continue;
        }
        if let Some(after) = rest.strip_prefix("${") {
            let end = closing_brace(after).ok_or_else(|| invalid(format!("unclosed interpolation in `{text}`")))?;
            let resolved = resolve(&after[..end], key, context, depth)?;
            out.push_str(&resolved.text);
            rest = &after[end + 1..];
            pieces += 1;
            whole = Some(resolved);
            continue;
        }
        let first = rest.chars().next().map_or(1, char::len_utf8);
        let next = rest[first..].find(['$', '\\']).map_or(rest.len(), |i| i + first);
        out.push_str(&rest[..next]);
        rest = &rest[next..];
        pieces += 1;
    }
    match whole {
        Some(Resolved { node: Some(node), .. }) if pieces == 1 => Ok(node),
        Some(resolved) if pieces == 1 => {
            if resolved.quoted {
                Ok(Value::String(resolved.text))
            } else {
                plain_scalar(&resolved.text).map_err(invalid)
            }
        }
        _ => Ok(Value::String(out)),
    }
}

/// The position of the `}` that closes an interpolation whose body starts `text`, skipping nested `${...}`.
fn closing_brace(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'$' if bytes.get(i + 1) == Some(&b'{') => {
                depth += 1;
                i += 1;
            }
            b'}' if depth == 0 => return Some(i),
            b'}' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    None
}

struct Resolved {
    text: String,
    /// The default was written in quotes, so it stays a string.
    quoted: bool,
    /// The referenced value of a node reference, with its type.
    node: Option<Value>,
}

fn resolve(expression: &str, key: &str, context: &Context<'_>, depth: usize) -> Result<Resolved, InterpolationError> {
    let invalid = |message: String| InterpolationError::Invalid { key: key.to_owned(), message };
    if let Some(argument) = expression.trim().strip_prefix("oc.decode:") {
        // OmegaConf's `oc.decode`: the (interpolated) string is read as YAML, so `null` is null and `{a: 1}` a map.
        if depth >= MAX_DEPTH {
            return Err(invalid(format!("`${{{expression}}}` nests too deeply")));
        }
        let node = match interpolate_in(argument.trim(), key, context, depth + 1)? {
            Value::String(text) if text.trim_start().starts_with(['{', '[']) => crate::yaml::parse(&text)
                .map(|(value, _)| value)
                .map_err(|e| invalid(format!("`oc.decode`: {}", e.message)))?,
            Value::String(text) => plain_scalar(text.trim()).map_err(invalid)?,
            other => other,
        };
        let text = match &node {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        return Ok(Resolved { text, quoted: false, node: Some(node) });
    }
    let Some(arguments) = expression.trim().strip_prefix("oc.env:") else {
        let path = expression.trim();
        let is_path = !path.is_empty()
            && !path.starts_with('.')
            && path.split('.').all(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        if !is_path {
            return Err(invalid(format!(
                "unsupported interpolation `${{{expression}}}`; only `${{oc.env:VAR}}`, `${{oc.env:VAR,default}}` \
                 and absolute key references `${{a.b.c}}` are supported"
            )));
        }
        if depth >= MAX_DEPTH {
            return Err(invalid(format!("`${{{path}}}` refers to itself through a chain of references")));
        }
        let target = path
            .split('.')
            .try_fold(context.root, |node, segment| match node {
                Value::Object(map) => map.get(segment),
                Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
                _ => None,
            })
            .ok_or_else(|| invalid(format!("`${{{path}}}` refers to a key that is not in the config")))?;
        let node = match target {
            Value::String(text) if text.contains("${") => interpolate_in(text, key, context, depth + 1)?,
            other => other.clone(),
        };
        let text = match &node {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        return Ok(Resolved { text, quoted: false, node: Some(node) });
    };
    let env = context.env;
    let (var, default) = match arguments.split_once(',') {
        Some((var, default)) => (var.trim(), Some(default.trim())),
        None => (arguments.trim(), None),
    };
    if var.is_empty() {
        return Err(InterpolationError::Invalid {
            key: key.to_owned(),
            message: "`oc.env` needs a variable name".to_owned(),
        });
    }
    if let Some(value) = env(var) {
        return Ok(Resolved { text: value, quoted: false, node: None });
    }
    match default {
        Some(default) if default.contains("${") => {
            // OmegaConf resolves a default that is itself an interpolation (`${oc.env:X,${oc.env:Y,d}}`); the
            // inner value keeps the type it resolved to.
            if depth >= MAX_DEPTH {
                return Err(invalid(format!("`${{{expression}}}` nests too deeply")));
            }
            let node = interpolate_in(default, key, context, depth + 1)?;
            let text = match &node {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            Ok(Resolved { text, quoted: false, node: Some(node) })
        }
        Some(default) => {
            let unquoted = default
                .strip_prefix('\'')
                .and_then(|d| d.strip_suffix('\''))
                .or_else(|| default.strip_prefix('"').and_then(|d| d.strip_suffix('"')));
            Ok(match unquoted {
                Some(inner) => Resolved { text: inner.to_owned(), quoted: true, node: None },
                None => Resolved { text: default.to_owned(), quoted: false, node: None },
            })
        }
        None => Err(InterpolationError::MissingEnv { key: key.to_owned(), var: var.to_owned() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env(var: &str) -> Option<String> {
        match var {
            "ROOT" => Some("/data".to_owned()),
            "LR" => Some("2e-6".to_owned()),
            "MAP" => Some("{a: 1}".to_owned()),
            _ => None,
        }
    }

    #[test]
    fn uses_the_variable_then_the_default() {
        let mut tree = json!({
            "a": "${oc.env:ROOT,./x}",
            "b": "${oc.env:NOPE,./checkpoints}",
            "c": "${oc.env:ROOT}/models/${oc.env:NOPE,m}",
        });
        interpolate_tree(&mut tree, &env).unwrap();
        assert_eq!(tree, json!({"a": "/data", "b": "./checkpoints", "c": "/data/models/m"}));
    }

    #[test]
    fn retypes_a_whole_interpolation_but_not_a_quoted_default() {
        let lookup: EnvLookup<'_> = &env;
        assert_eq!(interpolate_string("${oc.env:LR}", "lr", lookup).unwrap(), json!(2e-6));
        assert_eq!(interpolate_string("${oc.env:N,8}", "n", lookup).unwrap(), json!(8));
        assert_eq!(interpolate_string("${oc.env:N,'8'}", "n", lookup).unwrap(), json!("8"));
        assert_eq!(interpolate_string("${oc.env:N,null}", "n", lookup).unwrap(), Value::Null);
    }

    #[test]
    fn missing_variable_without_default_names_it() {
        let error = interpolate_string("${oc.env:MODEL_DIR}", "model.model_path", &env).unwrap_err();
        assert_eq!(error, InterpolationError::MissingEnv { key: "model.model_path".into(), var: "MODEL_DIR".into() });
    }

    #[test]
    fn follows_absolute_key_references_with_their_type() {
        let mut tree = json!({
            "critic": {"ppo_max_token_len_per_gpu": 32768, "forward": "${critic.ppo_max_token_len_per_gpu}"},
            "chain": "${critic.forward}",
            "text": "len=${critic.ppo_max_token_len_per_gpu}",
            "env_ref": "${root_dir}/x",
            "root_dir": "${oc.env:ROOT}",
            "list": ["a", "b"],
            "item": "${list.1}",
        });
        interpolate_tree(&mut tree, &env).unwrap();
        assert_eq!(tree["critic"]["forward"], json!(32768));
        assert_eq!(tree["chain"], json!(32768));
        assert_eq!(tree["text"], json!("len=32768"));
        assert_eq!(tree["env_ref"], json!("/data/x"));
        assert_eq!(tree["item"], json!("b"));
        let mut missing = json!({"a": "${b.c}"});
        let error = interpolate_tree(&mut missing, &env).unwrap_err();
        assert!(
            matches!(&error, InterpolationError::Invalid { message, .. } if message.contains("not in the config")),
            "{error:?}"
        );
        let mut cycle = json!({"a": "${b}", "b": "${a}"});
        assert!(interpolate_tree(&mut cycle, &env).is_err());
    }

    #[test]
    fn decodes_nested_interpolations_as_yaml() {
        let lookup: EnvLookup<'_> = &env;
        assert_eq!(interpolate_string("${oc.decode:${oc.env:NOPE,null}}", "x", lookup).unwrap(), Value::Null);
        assert_eq!(interpolate_string("${oc.decode:${oc.env:MAP}}", "x", lookup).unwrap(), json!({"a": 1}));
        assert_eq!(interpolate_string("${oc.decode:${oc.env:LR}}", "x", lookup).unwrap(), json!(2e-6));
    }

    #[test]
    fn resolves_a_default_that_is_itself_an_interpolation() {
        let lookup: EnvLookup<'_> = &env;
        assert_eq!(interpolate_string("${oc.env:NOPE,${oc.env:ALSO_NOPE,d}}", "x", lookup).unwrap(), json!("d"));
        assert_eq!(interpolate_string("${oc.env:NOPE,${oc.env:ROOT,d}}", "x", lookup).unwrap(), json!("/data"));
        assert_eq!(interpolate_string("${oc.env:ROOT,${oc.env:NOPE,d}}", "x", lookup).unwrap(), json!("/data"));
        assert_eq!(interpolate_string("${oc.env:NOPE,${oc.env:LR,1}}", "x", lookup).unwrap(), json!(2e-6));
        assert_eq!(interpolate_string("${oc.env:NOPE,${oc.env:N,'8'}}", "x", lookup).unwrap(), json!("8"));
        assert_eq!(interpolate_string("p/${oc.env:NOPE,${oc.env:N,7}}/q", "x", lookup).unwrap(), json!("p/7/q"));
        let error = interpolate_string("${oc.env:NOPE,${oc.env:MISSING}}", "k", lookup).unwrap_err();
        assert_eq!(error, InterpolationError::MissingEnv { key: "k".into(), var: "MISSING".into() });
    }

    #[test]
    fn refuses_other_resolvers_and_broken_syntax() {
        assert!(matches!(
            interpolate_string("${oc.select:model.model_path}", "x", &env),
            Err(InterpolationError::Invalid { .. })
        ));
        assert!(matches!(interpolate_string("${.relative}", "x", &env), Err(InterpolationError::Invalid { .. })));
        assert!(matches!(interpolate_string("${oc.env:ROOT", "x", &env), Err(InterpolationError::Invalid { .. })));
    }

    #[test]
    fn keeps_non_ascii_text_around_interpolations() {
        assert_eq!(interpolate_string("数据 ${oc.env:ROOT} ✓", "x", &env).unwrap(), json!("数据 /data ✓"));
    }

    #[test]
    fn escaped_dollar_brace_stays_literal() {
        assert_eq!(interpolate_string("cost \\${oc.env:ROOT}", "x", &env).unwrap(), json!("cost ${oc.env:ROOT}"));
    }
}
