//! A JSON Schema compiled into the node graph the automaton walks.
//!
//! The subset tools use: `type` (`object`, `array`, `string`, `number`, `integer`, `boolean`, `null`, or a list
//! of them), `properties` / `required` / `additionalProperties`, `items` / `minItems` / `maxItems`, `enum`,
//! `const`, `anyOf` (and `oneOf`, taken as `anyOf`), a one-element `allOf`, and `$ref` into the schema's own
//! `$defs` / `definitions` (recursion included). Every other keyword (`minLength`, `pattern`, `format`,
//! `minimum`, `prefixItems`, ...) is ignored, and a schema none of these describe (`{}`, `true`, `not`, a
//! multi-element `allOf`, an unresolvable `$ref`) accepts any JSON value: the output is then valid JSON that may
//! not satisfy the ignored keyword, which is what a client parsing arguments needs first.
//!
//! Objects follow xgrammar's strict mode, which vLLM's structured outputs default to: properties come in the
//! schema's order, required ones always and optional ones possibly skipped, and other keys only when
//! `additionalProperties` is `true` or a schema (absent counts as `false`). A schema without `type` but with
//! `properties` is an object (vLLM's `required` schema writes its tool alternatives that way).

use serde_json::{Map, Value};

/// Index of a node in [`Schema::nodes`].
pub(crate) type NodeId = u32;
/// Index of an exact byte string in [`Schema::literals`].
pub(crate) type LitId = u32;

pub(crate) const ANY: NodeId = 0;
pub(crate) const STRING: NodeId = 1;
pub(crate) const NUMBER: NodeId = 2;
pub(crate) const INTEGER: NodeId = 3;
pub(crate) const BOOLEAN: NodeId = 4;
pub(crate) const NULL: NodeId = 5;
const ANY_OBJECT: NodeId = 6;
const ANY_ARRAY: NodeId = 7;

/// What `ANY` may start as.
pub(crate) const ANY_ALTERNATIVES: [NodeId; 6] = [ANY_OBJECT, ANY_ARRAY, STRING, NUMBER, BOOLEAN, NULL];

pub(crate) const LIT_TRUE: LitId = 0;
pub(crate) const LIT_FALSE: LitId = 1;
pub(crate) const LIT_NULL: LitId = 2;

/// One property of an object node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Property {
    /// The key as JSON text after its opening quote (`city"`).
    pub(crate) key: LitId,
    pub(crate) value: NodeId,
    pub(crate) required: bool,
}

/// A compiled schema node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    /// Any JSON value.
    Any,
    Object {
        properties: Vec<Property>,
        /// The schema of keys not in `properties`; `None` forbids them.
        additional: Option<NodeId>,
    },
    Array {
        items: NodeId,
        min: usize,
        max: Option<usize>,
    },
    String,
    Number,
    Integer,
    Boolean,
    Null,
    /// Exactly one of these JSON texts (`enum`, `const`).
    Literals(Vec<LitId>),
    AnyOf(Vec<NodeId>),
    /// A `$ref` being compiled (replaced before compilation ends).
    Pending,
}

/// The node graph of one constraint (one schema, or the tool alternatives of `tool_choice: "required"`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Schema {
    pub(crate) nodes: Vec<Node>,
    pub(crate) literals: Vec<Box<[u8]>>,
    /// The node the output must be.
    pub(crate) root: NodeId,
}

impl Schema {
    /// The fixed nodes and literals every schema starts with.
    fn base() -> Self {
        let nodes = vec![
            Node::Any,
            Node::String,
            Node::Number,
            Node::Integer,
            Node::Boolean,
            Node::Null,
            Node::Object { properties: Vec::new(), additional: Some(ANY) },
            Node::Array { items: ANY, min: 0, max: None },
        ];
        let literals = [&b"true"[..], b"false", b"null"].iter().map(|l| Box::from(*l)).collect();
        Self { nodes, literals, root: ANY }
    }

    /// `schema` compiled; `$ref`s resolve against `schema` itself.
    pub(crate) fn compile(schema: &Value) -> Self {
        let mut out = Self::base();
        out.root = Compiler { schema: &mut out, root: schema, refs: Vec::new() }.node(schema);
        out
    }

    /// vLLM's schema for `tool_choice: "required"`: a non-empty array whose items are each
    /// `{"name": <a tool's name>, "parameters": <that tool's parameters>}` (both required, in that order), each
    /// tool's parameters compiled against its own `$defs`; a tool without parameters takes an empty object.
    pub(crate) fn tool_calls<'a>(tools: impl IntoIterator<Item = (&'a str, Option<&'a Value>)>) -> Self {
        let mut out = Self::base();
        let mut alternatives = Vec::new();
        for (name, parameters) in tools {
            let empty = serde_json::json!({"type": "object", "properties": {}});
            let parameters = parameters.filter(|p| !p.is_null()).unwrap_or(&empty);
            let params = Compiler { schema: &mut out, root: parameters, refs: Vec::new() }.node(parameters);
            let name_text = Value::String(name.to_owned()).to_string();
            let name_lit = out.literal(name_text.as_bytes());
            let name_node = out.push(Node::Literals(vec![name_lit]));
            let name_key = out.literal(b"name\"");
            let params_key = out.literal(b"parameters\"");
            let call = Node::Object {
                properties: vec![
                    Property { key: name_key, value: name_node, required: true },
                    Property { key: params_key, value: params, required: true },
                ],
                additional: None,
            };
            alternatives.push(out.push(call));
        }
        let items = out.push(Node::AnyOf(alternatives));
        out.root = out.push(Node::Array { items, min: 1, max: None });
        out
    }

    fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        (self.nodes.len() - 1) as NodeId
    }

    fn literal(&mut self, bytes: &[u8]) -> LitId {
        if let Some(i) = self.literals.iter().position(|l| &l[..] == bytes) {
            return i as LitId;
        }
        self.literals.push(bytes.into());
        (self.literals.len() - 1) as LitId
    }
}

struct Compiler<'a> {
    schema: &'a mut Schema,
    /// The document `$ref`s point into.
    root: &'a Value,
    /// `$ref`s compiled or being compiled, with their nodes (recursive references reuse them).
    refs: Vec<(String, NodeId)>,
}

impl Compiler<'_> {
    fn node(&mut self, value: &Value) -> NodeId {
        let Value::Object(map) = value else { return ANY };
        if let Some(Value::String(reference)) = map.get("$ref") {
            return self.reference(reference);
        }
        if let Some(Value::Array(values)) = map.get("enum") {
            return self.literals(values);
        }
        if let Some(value) = map.get("const") {
            return self.literals(std::slice::from_ref(value));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(alternatives)) = map.get(key) {
                let nodes = alternatives.iter().map(|a| self.node(a)).collect();
                return self.schema.push(Node::AnyOf(nodes));
            }
        }
        if let Some(Value::Array(all)) = map.get("allOf")
            && let [only] = all.as_slice()
        {
            return self.node(only);
        }
        match map.get("type") {
            Some(Value::String(kind)) => self.typed(kind, map),
            Some(Value::Array(kinds)) => {
                let nodes = kinds.iter().filter_map(Value::as_str).map(|k| self.typed(k, map)).collect();
                self.schema.push(Node::AnyOf(nodes))
            }
            _ if map.contains_key("properties") => self.typed("object", map),
            _ => ANY,
        }
    }

    fn typed(&mut self, kind: &str, map: &Map<String, Value>) -> NodeId {
        match kind {
            "object" => self.object(map),
            "array" => {
                let items = map.get("items").map_or(ANY, |items| self.node(items));
                let count = |key| map.get(key).and_then(Value::as_u64).map(|n| n as usize);
                self.schema.push(Node::Array { items, min: count("minItems").unwrap_or(0), max: count("maxItems") })
            }
            "string" => STRING,
            "number" => NUMBER,
            "integer" => INTEGER,
            "boolean" => BOOLEAN,
            "null" => NULL,
            _ => ANY,
        }
    }

    fn object(&mut self, map: &Map<String, Value>) -> NodeId {
        let required: Vec<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map_or(Vec::new(), |r| r.iter().filter_map(Value::as_str).collect());
        let mut properties = Vec::new();
        if let Some(Value::Object(props)) = map.get("properties") {
            for (name, schema) in props {
                let value = self.node(schema);
                let text = Value::String(name.clone()).to_string();
                let key = self.schema.literal(&text.as_bytes()[1..]);
                properties.push(Property { key, value, required: required.contains(&name.as_str()) });
            }
        }
        let additional = match map.get("additionalProperties") {
            Some(Value::Bool(true)) => Some(ANY),
            Some(schema @ Value::Object(_)) => Some(self.node(schema)),
            _ => None,
        };
        self.schema.push(Node::Object { properties, additional })
    }

    fn literals(&mut self, values: &[Value]) -> NodeId {
        let lits = values.iter().map(|v| self.schema.literal(v.to_string().as_bytes())).collect();
        self.schema.push(Node::Literals(lits))
    }

    /// A `$ref` into the document (`#`, `#/$defs/..`, `#/definitions/..`, any JSON pointer); anything else is
    /// any value.
    fn reference(&mut self, reference: &str) -> NodeId {
        if let Some((_, node)) = self.refs.iter().find(|(r, _)| r == reference) {
            return *node;
        }
        let Some(target) = reference.strip_prefix('#').and_then(|pointer| self.root.pointer(pointer)) else {
            return ANY;
        };
        let slot = self.schema.push(Node::Pending);
        self.refs.push((reference.to_owned(), slot));
        let compiled = self.node(target);
        // The slot stands for the target: an alias of its compiled node.
        self.schema.nodes[slot as usize] = Node::AnyOf(vec![compiled]);
        slot
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn tools_parameters_compile_in_order_with_required_flags() {
        let schema = Schema::compile(&json!({
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        }));
        let Node::Object { properties, additional } = &schema.nodes[schema.root as usize] else { panic!() };
        assert_eq!(*additional, None);
        assert_eq!(&schema.literals[properties[0].key as usize][..], b"city\"");
        assert!(properties[0].required && !properties[1].required);
        assert_eq!(properties[0].value, STRING);
        let Node::Literals(lits) = &schema.nodes[properties[1].value as usize] else { panic!() };
        assert_eq!(&schema.literals[lits[1] as usize][..], b"\"f\"");
    }

    #[test]
    fn references_resolve_and_recurse() {
        let schema = Schema::compile(&json!({
            "$defs": {"Tree": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Tree"}}}}},
            "$ref": "#/$defs/Tree",
        }));
        assert!(!schema.nodes.contains(&Node::Pending));
        assert_eq!(Schema::compile(&json!({"$ref": "https://elsewhere"})).root, ANY);
    }
}
