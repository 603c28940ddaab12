//! OmegaConf's environment interpolation: `${oc.env:VAR}` and `${oc.env:VAR,default}`.
//!
//! A value that is exactly one interpolation is re-typed like a plain YAML scalar (so
//! `lr: ${oc.env:LR,1e-5}` is a number, as OmegaConf's schema conversion makes it); an interpolation inside a
//! longer string is substituted as text. `\${` is a literal `${`. Other resolvers and node references are
//! refused by name rather than left as text that would fail later in a confusing way.

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

/// Interpolates every string in the tree in place.
pub fn interpolate_tree(value: &mut Value, env: EnvLookup<'_>) -> Result<(), InterpolationError> {
    walk(value, "", env)
}

fn walk(value: &mut Value, path: &str, env: EnvLookup<'_>) -> Result<(), InterpolationError> {
    match value {
        Value::String(text) => {
            if text.contains("${") {
                *value = interpolate_string(text, path, env)?;
            }
            Ok(())
        }
        Value::Array(items) => {
            items.iter_mut().enumerate().try_for_each(|(i, item)| walk(item, &join_index(path, i), env))
        }
        Value::Object(map) => map.iter_mut().try_for_each(|(k, item)| walk(item, &join_key(path, k), env)),
        Value::Null | Value::Bool(_) | Value::Number(_) => Ok(()),
    }
}

/// Interpolates one string value found at `key`.
pub fn interpolate_string(text: &str, key: &str, env: EnvLookup<'_>) -> Result<Value, InterpolationError> {
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
            let end = after.find('}').ok_or_else(|| invalid(format!("unclosed interpolation in `{text}`")))?;
            let resolved = resolve(&after[..end], key, env)?;
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

struct Resolved {
    text: String,
    /// The default was written in quotes, so it stays a string.
    quoted: bool,
}

fn resolve(expression: &str, key: &str, env: EnvLookup<'_>) -> Result<Resolved, InterpolationError> {
    let Some(arguments) = expression.trim().strip_prefix("oc.env:") else {
        return Err(InterpolationError::Invalid {
            key: key.to_owned(),
            message: format!(
                "unsupported interpolation `${{{expression}}}`; only `${{oc.env:VAR}}` and \
                 `${{oc.env:VAR,default}}` are supported"
            ),
        });
    };
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
        return Ok(Resolved { text: value, quoted: false });
    }
    match default {
        Some(default) => {
            let unquoted = default
                .strip_prefix('\'')
                .and_then(|d| d.strip_suffix('\''))
                .or_else(|| default.strip_prefix('"').and_then(|d| d.strip_suffix('"')));
            Ok(match unquoted {
                Some(inner) => Resolved { text: inner.to_owned(), quoted: true },
                None => Resolved { text: default.to_owned(), quoted: false },
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
    fn refuses_other_resolvers_and_broken_syntax() {
        assert!(matches!(
            interpolate_string("${model.model_path}", "x", &env),
            Err(InterpolationError::Invalid { .. })
        ));
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
