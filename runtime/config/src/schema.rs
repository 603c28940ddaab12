//! The JSON Schema of the config, generated from the Rust types, and the Markdown key reference made from it.
//!
//! Both files are committed (`schemas/config.schema.json`, `docs/config-reference.md`) so editors and readers
//! get them without building; a test regenerates them and fails when the committed copies are stale.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde_json::Value;

use crate::config::Config;

/// The config's JSON Schema (draft 2020-12).
pub fn json_schema() -> Value {
    let mut schema = schemars::schema_for!(Config).to_value();
    crate::category::annotate(&mut schema);
    schema
}

/// The committed text of `schemas/config.schema.json`.
pub fn json_schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&json_schema()).unwrap_or_default();
    text.push('\n');
    text
}

/// A Markdown page listing every key with its type, default and meaning.
pub fn markdown_reference() -> String {
    let schema = json_schema();
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the Rust types by `trinity-config` (a test keeps it current; do not edit by hand).\n\
         Keys and meanings follow Trinity-RFT; `null` as a default means \"derived at resolution\" (see\n\
         `trinity run --dry-run`, which prints every value after resolution).\n\n\
         Every key has a category: **honoured** (its value changes what runs), **placement** (how Trinity-RFT\n\
         spreads work over devices or manages engine memory; accepted, and a value other than the default is logged\n\
         with what it maps to or why it has no effect here), **derived** (Trinity-RFT itself overwrites it from\n\
         another key; accepted, with a note naming that key), **refused** (a value other than the default would change results in\n\
         a way trinity cannot honour; such a value is an error saying why and what to do).\n",
    );
    let mut seen = BTreeSet::new();
    let mut queue = vec![("Config".to_owned(), String::new())];
    while let Some((name, path)) = queue.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let def = if name == "Config" { &schema } else { &schema["$defs"][&name] };
        let Some(properties) = def.get("properties").and_then(Value::as_object) else {
            continue;
        };
        let title = if path.is_empty() { "top level".to_owned() } else { format!("`{path}`") };
        let _ = write!(out, "\n## {name} ({title})\n\n");
        if let Some(description) = def.get("description").and_then(Value::as_str) {
            let _ = write!(out, "{}\n\n", one_line(description));
        }
        out.push_str("| key | category | type | default | meaning |\n|---|---|---|---|---|\n");
        let mut children = Vec::new();
        for (key, property) in properties {
            let (kind, reference) = describe_type(&schema, property);
            // A nested section lists its own defaults in its own table.
            let default = if reference.as_ref().is_some_and(|(_, list)| !list) {
                "see below".to_owned()
            } else {
                def.get("default")
                    .and_then(|d| d.get(key))
                    .or_else(|| property.get("default"))
                    .map(|d| format!("`{}`", serde_json::to_string(d).unwrap_or_default()))
                    .unwrap_or_else(|| "—".to_owned())
            };
            let mut description = property.get("description").and_then(Value::as_str).map(one_line).unwrap_or_default();
            if let Some(note) = property.get("x-trinity-note").and_then(Value::as_str) {
                description = format!("{description} *Here:* {note}.");
            }
            let category = property.get("x-trinity-category").and_then(Value::as_str).unwrap_or("—");
            let _ =
                writeln!(out, "| `{key}` | {category} | {kind} | {default} | {} |", description.replace('|', "\\|"));
            if let Some((reference, list)) = reference {
                let sep = if path.is_empty() { "" } else { "." };
                let suffix = if list { "[]" } else { "" };
                children.push((reference, format!("{path}{sep}{key}{suffix}")));
            }
        }
        // Depth-first in file order: the stack pops the first child first.
        queue.extend(children.into_iter().rev());
    }
    out.push_str(
        "\n## Refused Trinity-RFT keys\n\n\
         Keys of Trinity-RFT's schema that trinity has no field for. Any value is an error with this reason.\n\n\
         | section | key | reason |\n|---|---|---|\n",
    );
    for (def, key, reason) in crate::keys::UNSUPPORTED {
        let _ = writeln!(out, "| {def} | `{key}` | {} |", reason.replace('|', "\\|"));
    }
    out
}

/// A readable type name, and the definition it refers to (with whether it is a list of them).
fn describe_type(root: &Value, property: &Value) -> (String, Option<(String, bool)>) {
    if let Some(reference) = property.get("$ref").and_then(Value::as_str) {
        let name = reference.trim_start_matches("#/$defs/").to_owned();
        let target = &root["$defs"][&name];
        if target.get("properties").is_none() {
            // Enums and other leaf types are described in place rather than in a section of their own.
            return describe_type(root, target);
        }
        return (format!("[{name}](#{})", name.to_lowercase()), Some((name, false)));
    }
    if let Some(branches) = property.get("anyOf").and_then(Value::as_array) {
        let mut names = Vec::new();
        let mut reference = None;
        for branch in branches {
            let (name, r) = describe_type(root, branch);
            names.push(name);
            reference = reference.or(r);
        }
        return (names.join(" or "), reference);
    }
    if let Some(values) = property.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values.iter().map(|v| format!("`{}`", v.as_str().unwrap_or_default())).collect();
        return (values.join(" \\| "), None);
    }
    if let Some(branches) = property.get("oneOf").and_then(Value::as_array) {
        let values: Vec<String> =
            branches.iter().filter_map(|b| b.get("const").and_then(Value::as_str).map(|v| format!("`{v}`"))).collect();
        if !values.is_empty() {
            return (values.join(" \\| "), None);
        }
    }
    match property.get("type") {
        Some(Value::String(t)) if t == "array" => {
            let (item, reference) = property.get("items").map(|items| describe_type(root, items)).unwrap_or_default();
            (format!("list of {item}"), reference.map(|(r, _)| (r, true)))
        }
        Some(Value::String(t)) => (t.clone(), None),
        Some(Value::Array(types)) => {
            // `Option<Vec<T>>`: a list that may be null; its items keep their section.
            if types.iter().any(|t| t == "array")
                && let Some(items) = property.get("items")
            {
                let (item, reference) = describe_type(root, items);
                let others: Vec<&str> = types.iter().filter_map(Value::as_str).filter(|t| *t != "array").collect();
                let name = std::iter::once(format!("list of {item}")).chain(others.iter().map(|t| (*t).to_owned()));
                return (name.collect::<Vec<_>>().join(" or "), reference.map(|(r, _)| (r, true)));
            }
            let names: Vec<&str> = types.iter().filter_map(Value::as_str).collect();
            (names.join(" or "), None)
        }
        _ => ("any".to_owned(), None),
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Rewrites a committed generated file when it is stale, and fails so that the change is reviewed.
    fn ensure_file_contents(relative: &str, contents: &str) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative);
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        if old == contents {
            return;
        }
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, contents).unwrap();
        panic!("{relative} was stale and has been regenerated; review and commit it, then rerun the tests");
    }

    #[test]
    fn committed_schema_is_current() {
        ensure_file_contents("schemas/config.schema.json", &json_schema_text());
    }

    #[test]
    fn committed_reference_is_current() {
        ensure_file_contents("docs/config-reference.md", &markdown_reference());
    }

    #[test]
    fn reference_lists_nested_keys_with_defaults() {
        let text = markdown_reference();
        assert!(text.contains("## OptimizerConfig (`algorithm.optimizer`)"), "{text}");
        assert!(text.contains("| `lr` | honoured | number | `1e-6` |"), "{text}");
        assert!(text.contains("| `engine_num` | placement |"), "{text}");
        assert!(text.contains("| ModelConfig | `tinker` |"), "{text}");
        assert!(text.contains("## TasksetConfig (`buffer.explorer_input.taskset`)"), "{text}");
    }
}
