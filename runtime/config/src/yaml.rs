//! YAML text to a JSON tree, remembering where every key and value came from.
//!
//! The typed configuration is deserialized from `serde_json::Value` (so interpolation, `--set` overrides and
//! unknown-key checks work on one simple tree), but users need errors that point into their file. The parser
//! therefore records the line and column of every node by its key path (`buffer.eval_tasksets[0].name`).
//!
//! Plain scalars are typed by YAML 1.2 core rules (`1e-5` is a float, `yes` is a string); quoted scalars stay
//! strings, as in OmegaConf.

use std::collections::HashMap;

use serde_json::{Map, Number, Value};
use yaml_rust2::Yaml;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A position in a config file, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

/// Key path → position of the node (for a mapping entry, the position of its key).
pub type Positions = HashMap<String, Position>;

/// A parse failure with its position when the parser knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub position: Option<Position>,
    pub message: String,
}

/// The most nodes a document may hold once its aliases are expanded. Trinity-RFT's largest shipped config has
/// a few hundred; the bound is far above any real config and far below what an alias bomb (a few hundred bytes
/// whose aliases of aliases expand to billions of nodes) would need before it is refused.
pub const MAX_NODES: usize = 100_000;

/// Parses one YAML document. An empty document yields `Value::Null`.
pub fn parse(text: &str) -> Result<(Value, Positions), SyntaxError> {
    let mut builder = TreeBuilder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, false).map_err(|error| SyntaxError {
        position: Some(Position { line: error.marker().line(), column: error.marker().col() + 1 }),
        message: error.info().to_owned(),
    })?;
    if let Some(error) = builder.error {
        return Err(error);
    }
    Ok((builder.root.unwrap_or(Value::Null), builder.positions))
}

/// Types a plain (unquoted) scalar the way YAML 1.2's core schema does.
pub fn plain_scalar(text: &str) -> Result<Value, String> {
    match Yaml::from_str(text) {
        Yaml::Integer(i) => Ok(Value::Number(i.into())),
        Yaml::Real(real) => match real.parse::<f64>().ok().and_then(Number::from_f64) {
            Some(number) => Ok(Value::Number(number)),
            None => match real.trim_start_matches(['+', '-']) {
                // `.inf` and `.nan` have no JSON form; no config key wants them.
                ".inf" | ".Inf" | ".INF" | ".nan" | ".NaN" | ".NAN" => Err(format!("`{text}` is not a finite number")),
                _ => Ok(Value::String(text.to_owned())),
            },
        },
        Yaml::Boolean(b) => Ok(Value::Bool(b)),
        Yaml::Null => Ok(Value::Null),
        _ => Ok(Value::String(text.to_owned())),
    }
}

/// Appends a mapping key to a key path.
pub fn join_key(parent: &str, key: &str) -> String {
    if parent.is_empty() { key.to_owned() } else { format!("{parent}.{key}") }
}

/// Removes the value at a key path (as [`join_key`] and [`join_index`] write them) from `tree`; whether there
/// was one. Loading drops a refused value this way so that the rest of the config can still be checked. Only a
/// mapping's key is removed: a list item is not, because the items after it would move to other indexes than
/// the ones their errors name.
pub fn remove(tree: &mut Value, key: &str) -> bool {
    enum Step<'k> {
        Key(&'k str),
        Index(usize),
    }
    let mut steps = Vec::new();
    for part in key.split('.') {
        let (name, indexes) = part.split_at(part.find('[').unwrap_or(part.len()));
        if !name.is_empty() {
            steps.push(Step::Key(name));
        }
        for index in indexes.split_terminator(']') {
            match index.strip_prefix('[').and_then(|i| i.parse::<usize>().ok()) {
                Some(i) => steps.push(Step::Index(i)),
                None => return false,
            }
        }
    }
    let Some((last, parents)) = steps.split_last() else {
        return false;
    };
    let mut node = tree;
    for step in parents {
        let child = match (step, node) {
            (Step::Key(name), Value::Object(map)) => map.get_mut(*name),
            (Step::Index(index), Value::Array(items)) => items.get_mut(*index),
            _ => None,
        };
        match child {
            Some(child) => node = child,
            None => return false,
        }
    }
    match (last, node) {
        (Step::Key(name), Value::Object(map)) => map.shift_remove(*name).is_some(),
        _ => false,
    }
}

/// Appends a sequence index to a key path.
pub fn join_index(parent: &str, index: usize) -> String {
    format!("{parent}[{index}]")
}

enum Frame {
    Mapping { map: Map<String, Value>, pending_key: Option<String>, anchor: usize },
    Sequence { items: Vec<Value>, anchor: usize },
}

/// An anchored node, kept so that its aliases can copy it.
struct Anchored {
    value: Value,
    /// Nodes in `value`, counting what its own aliases expanded to: what one more alias adds.
    nodes: usize,
    /// Where the anchor was defined, for the refusal of an expansion past [`MAX_NODES`].
    position: Position,
}

#[derive(Default)]
struct TreeBuilder {
    /// Open collections, each with its key path and the node count when it opened (for its anchor's size).
    stack: Vec<(Frame, String, usize)>,
    root: Option<Value>,
    positions: Positions,
    anchors: HashMap<usize, Anchored>,
    /// Nodes of the document so far, aliases counted as the copies they become. Counted before an alias is
    /// copied, so an expansion past [`MAX_NODES`] is refused without being built.
    nodes: usize,
    /// Where each open collection started, for an anchor on it.
    starts: Vec<Position>,
    error: Option<SyntaxError>,
}

impl TreeBuilder {
    fn fail(&mut self, mark: Marker, message: String) {
        if self.error.is_none() {
            self.error = Some(SyntaxError { position: Some(position(mark)), message });
        }
    }

    /// Counts `nodes` more nodes into the document; false (with the error set) past [`MAX_NODES`].
    fn count(&mut self, nodes: usize, mark: Marker, alias_of: Option<Position>) -> bool {
        self.nodes = self.nodes.saturating_add(nodes);
        if self.nodes <= MAX_NODES {
            return true;
        }
        let message = match alias_of {
            Some(anchor) => format!(
                "aliases expand the document past {MAX_NODES} nodes (this alias copies {nodes} nodes of the anchor \
                 defined at line {}); write the repeated values out or use fewer nested aliases",
                anchor.line
            ),
            None => format!("the document has more than {MAX_NODES} nodes"),
        };
        self.fail(mark, message);
        false
    }

    /// The key path a new node at the current point would get.
    fn child_path(&self) -> String {
        match self.stack.last() {
            None => String::new(),
            Some((Frame::Mapping { pending_key, .. }, path, _)) => {
                join_key(path, pending_key.as_deref().unwrap_or_default())
            }
            Some((Frame::Sequence { items, .. }, path, _)) => join_index(path, items.len()),
        }
    }

    /// Whether the next scalar is a mapping key rather than a value.
    fn expects_key(&self) -> bool {
        matches!(self.stack.last(), Some((Frame::Mapping { pending_key: None, .. }, _, _)))
    }

    fn push_value(&mut self, value: Value, mark: Marker) {
        match self.stack.last_mut() {
            None => self.root = Some(value),
            Some((Frame::Mapping { map, pending_key, .. }, _, _)) => {
                if let Some(key) = pending_key.take() {
                    map.insert(key, value);
                }
            }
            Some((Frame::Sequence { items, .. }, path, _)) => {
                let path = join_index(path, items.len());
                self.positions.entry(path).or_insert(position(mark));
                items.push(value);
            }
        }
    }

    fn set_key(&mut self, key: String, mark: Marker) {
        let duplicate = match self.stack.last() {
            Some((Frame::Mapping { map, .. }, _, _)) => map.contains_key(&key),
            _ => false,
        };
        if duplicate {
            let path = match self.stack.last() {
                Some((_, path, _)) => join_key(path, &key),
                None => key.clone(),
            };
            self.fail(mark, format!("duplicate key `{path}`"));
        }
        if let Some((Frame::Mapping { pending_key, .. }, path, _)) = self.stack.last_mut() {
            let path = join_key(path, &key);
            self.positions.insert(path, position(mark));
            *pending_key = Some(key);
        }
    }
}

impl MarkedEventReceiver for TreeBuilder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        if self.error.is_some() {
            return;
        }
        match event {
            Event::Scalar(text, style, anchor, _tag) => {
                if self.expects_key() {
                    self.set_key(text, mark);
                    return;
                }
                let value = if style == TScalarStyle::Plain {
                    match plain_scalar(&text) {
                        Ok(value) => value,
                        Err(message) => {
                            self.fail(mark, message);
                            return;
                        }
                    }
                } else {
                    Value::String(text)
                };
                if !self.count(1, mark, None) {
                    return;
                }
                if anchor > 0 {
                    self.anchors.insert(anchor, Anchored { value: value.clone(), nodes: 1, position: position(mark) });
                }
                self.push_value(value, mark);
            }
            Event::MappingStart(anchor, _) | Event::SequenceStart(anchor, _) => {
                if self.expects_key() {
                    self.fail(mark, "a mapping key must be a plain scalar".to_owned());
                    return;
                }
                let path = self.child_path();
                if !path.is_empty() {
                    self.positions.entry(path.clone()).or_insert(position(mark));
                }
                if !self.count(1, mark, None) {
                    return;
                }
                let frame = if matches!(event, Event::MappingStart(..)) {
                    Frame::Mapping { map: Map::new(), pending_key: None, anchor }
                } else {
                    Frame::Sequence { items: Vec::new(), anchor }
                };
                // The collection's own node is counted; its size is what the count grows by until it closes.
                self.stack.push((frame, path, self.nodes - 1));
                self.starts.push(position(mark));
            }
            Event::MappingEnd | Event::SequenceEnd => {
                let (Some((frame, _, opened_at)), Some(start)) = (self.stack.pop(), self.starts.pop()) else {
                    return;
                };
                let (value, anchor) = match frame {
                    Frame::Mapping { map, anchor, .. } => (Value::Object(map), anchor),
                    Frame::Sequence { items, anchor } => (Value::Array(items), anchor),
                };
                if anchor > 0 {
                    let nodes = self.nodes - opened_at;
                    self.anchors.insert(anchor, Anchored { value: value.clone(), nodes, position: start });
                }
                self.push_value(value, mark);
            }
            Event::Alias(anchor) => {
                if self.expects_key() {
                    self.fail(mark, "an alias cannot be a mapping key".to_owned());
                    return;
                }
                let Some((nodes, defined)) = self.anchors.get(&anchor).map(|a| (a.nodes, a.position)) else {
                    self.fail(mark, "alias to an unknown anchor".to_owned());
                    return;
                };
                if !self.count(nodes, mark, Some(defined)) {
                    return;
                }
                let value = self.anchors[&anchor].value.clone();
                self.push_value(value, mark);
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentStart | Event::DocumentEnd => {}
        }
    }
}

fn position(mark: Marker) -> Position {
    Position { line: mark.line(), column: mark.col() + 1 }
}

/// Writes a JSON tree as block-style YAML, for `--dry-run` output.
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    let yaml = to_yaml_node(value);
    let mut emitter = yaml_rust2::YamlEmitter::new(&mut out);
    // Emitting into a String cannot fail for trees made of plain data; keep the text produced so far otherwise.
    let _ = emitter.dump(&yaml);
    let body = out.strip_prefix("---\n").unwrap_or(&out);
    format!("{body}\n")
}

fn to_yaml_node(value: &Value) -> Yaml {
    match value {
        Value::Null => Yaml::Null,
        Value::Bool(b) => Yaml::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Yaml::Integer(i),
            None => Yaml::Real(format_float(n.as_f64().unwrap_or(f64::NAN))),
        },
        Value::String(s) => Yaml::String(s.clone()),
        Value::Array(items) => Yaml::Array(items.iter().map(to_yaml_node).collect()),
        Value::Object(map) => Yaml::Hash(map.iter().map(|(k, v)| (Yaml::String(k.clone()), to_yaml_node(v))).collect()),
    }
}

/// Keeps floats recognisable as floats when read back (`1.0`, not `1`).
fn format_float(f: f64) -> String {
    let text = format!("{f:?}");
    if text.contains(['.', 'e', 'E']) || !f.is_finite() { text } else { format!("{text}.0") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn removes_mapping_keys_by_path_but_never_list_items() {
        let mut tree = json!({"a": {"b": [{"c": 1, "d": 2}], "e": 3}});
        assert!(remove(&mut tree, "a.b[0].c"));
        assert!(remove(&mut tree, "a.e"));
        assert_eq!(tree, json!({"a": {"b": [{"d": 2}]}}));
        assert!(!remove(&mut tree, "a.b[0]"), "later items would change index");
        assert!(!remove(&mut tree, "a.x.y"));
        assert!(!remove(&mut tree, "a.b[9].d"));
        assert!(!remove(&mut tree, "."));
        assert_eq!(tree, json!({"a": {"b": [{"d": 2}]}}));
    }

    #[test]
    fn types_plain_scalars_and_keeps_quoted_strings() {
        let (value, _) = parse("a: 1e-5\nb: '1'\nc: true\nd: ~\ne: yes\nf: 3\n").unwrap();
        assert_eq!(value, json!({"a": 1e-5, "b": "1", "c": true, "d": null, "e": "yes", "f": 3}));
    }

    #[test]
    fn records_positions_by_key_path() {
        let text = "buffer:\n  tasksets:\n    - name: a\n      path: x\n    - name: b\n";
        let (_, positions) = parse(text).unwrap();
        assert_eq!(positions["buffer"], Position { line: 1, column: 1 });
        assert_eq!(positions["buffer.tasksets"], Position { line: 2, column: 3 });
        assert_eq!(positions["buffer.tasksets[1].name"].line, 5);
        assert_eq!(positions["buffer.tasksets[0].path"], Position { line: 4, column: 7 });
    }

    #[test]
    fn rejects_duplicate_keys_with_their_line() {
        let error = parse("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(error.position.map(|p| p.line), Some(3));
        assert!(error.message.contains("duplicate key `a`"), "{}", error.message);
    }

    #[test]
    fn resolves_anchors_and_aliases() {
        let (value, _) = parse("base: &b {lr: 1}\ncopy: *b\n").unwrap();
        assert_eq!(value["copy"], json!({"lr": 1}));
    }

    #[test]
    fn an_alias_bomb_is_refused_at_its_alias_with_the_anchors_line() {
        // Nine levels of ten aliases each: 10^9 nodes expanded, 300 bytes written.
        let mut text = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n".to_owned();
        for level in 1..=9 {
            let previous = format!("*a{}", level - 1);
            let items = [previous.as_str(); 10].join(", ");
            text.push_str(&format!("a{level}: &a{level} [{items}]\n"));
        }
        let started = std::time::Instant::now();
        let error = parse(&text).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "took {:?}", started.elapsed());
        assert!(error.message.contains("past 100000 nodes"), "{}", error.message);
        // Levels 0-3 hold 12,345 nodes; level 4's aliases copy 11,111 each, so its eighth crosses the bound.
        assert_eq!(error.position.map(|p| p.line), Some(5), "{}", error.message);
        assert!(error.message.contains("copies 11111 nodes of the anchor defined at line 4"), "{}", error.message);
    }

    #[test]
    fn aliases_within_the_bound_still_expand() {
        let (value, _) = parse("a: &a [1, 2]\nb: &b [*a, *a]\nc: [*b, *b]\n").unwrap();
        assert_eq!(value["c"], json!([[[1, 2], [1, 2]], [[1, 2], [1, 2]]]));
        let mut builder = TreeBuilder::default();
        Parser::new_from_str("a: &a [1, 2]\nb: &b [*a, *a]\nc: [*b, *b]\n").load(&mut builder, false).unwrap();
        // 1 root + 3 keys' values: a = 3, b = 1 + 2·3 = 7, c = 1 + 2·7 = 15.
        assert_eq!(builder.nodes, 1 + 3 + 7 + 15);
    }

    #[test]
    fn reports_syntax_errors_with_a_position() {
        let error = parse("a: [1, 2\nb: 3\n").unwrap_err();
        assert!(error.position.is_some());
    }

    #[test]
    fn empty_text_is_null() {
        assert_eq!(parse("").unwrap().0, Value::Null);
        assert_eq!(parse("# only a comment\n").unwrap().0, Value::Null);
    }

    #[test]
    fn yaml_output_reads_back_to_the_same_tree() {
        let tree = json!({"a": {"b": [1, 2.0, "x: y"], "c": null, "lr": 1e-6}, "s": "true"});
        let (back, _) = parse(&to_yaml(&tree)).unwrap();
        assert_eq!(back, tree);
    }
}
