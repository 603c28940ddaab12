//! A byte-level pushdown automaton that accepts exactly the JSON texts of a compiled [`Schema`].
//!
//! A state is a set of stacks, one per alternative still alive (`anyOf`, `enum`, which property a key starts,
//! `true` or `false`): feeding a byte steps every stack, forks where the schema branches, and drops the stacks
//! that cannot take the byte. A prefix is valid while at least one stack is left; the value is complete when a
//! stack is empty (or holds only a top-level number that may still grow). Identical stacks are merged after
//! every byte, so a state's size stays that of the schema's live ambiguity, and a state is a value (`Hash`,
//! `Eq`) that the token masks are cached by.
//!
//! Whitespace (space, tab, newline, carriage return) is allowed where JSON allows it between tokens, but at
//! most [`MAX_WHITESPACE`] bytes in a row and none after the top-level value: vLLM's grammars allow whitespace
//! too, and without a cap a small model can spend its whole budget on spaces. Numbers are capped at
//! [`MAX_NUMBER_BYTES`] bytes for the same reason. String contents are taken byte by byte: any byte but a
//! control character, `"` and `\` (escapes are checked), with no check that the bytes form UTF-8; the reply is
//! decoded lossily, so a client always gets valid JSON text.

use super::schema::{ANY_ALTERNATIVES, LIT_FALSE, LIT_NULL, LIT_TRUE, LitId, Node, NodeId, Schema};

/// The most whitespace bytes in a row.
pub(crate) const MAX_WHITESPACE: u8 = 4;
/// The longest number, in bytes.
pub(crate) const MAX_NUMBER_BYTES: u8 = 24;
/// The most alternatives a state keeps; beyond it the last ones are dropped (tool schemas stay far below it).
const MAX_STACKS: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum NumPhase {
    Start,
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Phase {
    /// After `{` / `[`: a first member or the close.
    Open,
    /// After an object key: `:`.
    Key,
    /// After a member or item: `,` or the close.
    Member,
    /// After `,`: a member or item.
    Comma,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Frame {
    /// A value of the node is expected.
    Value(NodeId),
    /// Inside an exact text, `pos` bytes matched.
    Lit {
        lit: LitId,
        pos: u16,
    },
    /// Inside a string (after its opening quote); `escape` 1 after a backslash, 2..=5 while `\u` hex digits
    /// remain (5 - escape + 1 of them).
    Str {
        escape: u8,
    },
    Num {
        integer: bool,
        phase: NumPhase,
        len: u8,
    },
    /// Inside an object: `next` is the first property not yet written or skipped, `pending` the value node of
    /// the key just read.
    Obj {
        node: NodeId,
        next: u16,
        phase: Phase,
        pending: NodeId,
    },
    Arr {
        node: NodeId,
        count: u32,
        phase: Phase,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Stack {
    frames: Vec<Frame>,
    /// Whitespace bytes since the last other byte.
    whitespace: u8,
}

/// Where the automaton is: every alternative still alive.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct State {
    stacks: Vec<Stack>,
}

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl State {
    /// Before the first byte of a value of the schema's root.
    pub(crate) fn start(schema: &Schema) -> Self {
        Self { stacks: vec![Stack { frames: vec![Frame::Value(schema.root)], whitespace: 0 }] }
    }

    /// Whether no continuation is valid any more (a byte that could not follow was fed).
    pub(crate) fn is_dead(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Whether the bytes so far are a whole value of the schema.
    pub(crate) fn can_end(&self) -> bool {
        self.stacks.iter().any(|s| match s.frames.as_slice() {
            [] => true,
            [Frame::Num { phase, .. }] => number_accepting(*phase),
            _ => false,
        })
    }

    /// Whether the value is complete and nothing may follow.
    pub(crate) fn must_end(&self) -> bool {
        !self.stacks.is_empty() && self.stacks.iter().all(|s| s.frames.is_empty())
    }

    /// The state after `bytes`; dead once one of them cannot follow.
    pub(crate) fn feed(&self, schema: &Schema, bytes: &[u8]) -> Self {
        let mut state = self.clone();
        for &b in bytes {
            if state.is_dead() {
                break;
            }
            state = state.feed_byte(schema, b);
        }
        state
    }

    /// The state after one byte.
    pub(crate) fn feed_byte(&self, schema: &Schema, b: u8) -> Self {
        let mut out = Vec::with_capacity(self.stacks.len());
        for stack in &self.stacks {
            step(schema, stack.clone(), b, &mut out);
        }
        if out.len() > 1 {
            out.sort_unstable();
            out.dedup();
            out.truncate(MAX_STACKS);
        }
        Self { stacks: out }
    }
}

fn number_accepting(phase: NumPhase) -> bool {
    matches!(phase, NumPhase::Zero | NumPhase::Int | NumPhase::Frac | NumPhase::ExpDigits)
}

/// What a number does with a byte.
enum NumStep {
    Took(NumPhase),
    /// The number ended before this byte (which goes to the frame below).
    Ended,
    Dead,
}

fn number_step(integer: bool, phase: NumPhase, len: u8, b: u8) -> NumStep {
    use NumPhase::*;
    let next = match (phase, b) {
        (Start, b'-') => Some(Minus),
        (Start | Minus, b'0') => Some(Zero),
        (Start | Minus, b'1'..=b'9') => Some(Int),
        (Int, b'0'..=b'9') => Some(Int),
        (Zero | Int, b'.') if !integer => Some(Dot),
        (Zero | Int | Frac, b'e' | b'E') if !integer => Some(Exp),
        (Dot | Frac, b'0'..=b'9') => Some(Frac),
        (Exp, b'+' | b'-') => Some(ExpSign),
        (Exp | ExpSign | ExpDigits, b'0'..=b'9') => Some(ExpDigits),
        _ => None,
    };
    match next {
        Some(next) if len < MAX_NUMBER_BYTES => NumStep::Took(next),
        _ if number_accepting(phase) => NumStep::Ended,
        _ => NumStep::Dead,
    }
}

/// Steps one stack over `b`, pushing what survives (several stacks where the schema branches) to `out`.
fn step(schema: &Schema, mut stack: Stack, b: u8, out: &mut Vec<Stack>) {
    loop {
        let Some(top) = stack.frames.last_mut() else { return };
        let gap = matches!(top, Frame::Value(_) | Frame::Obj { .. } | Frame::Arr { .. });
        if gap && is_whitespace(b) {
            if stack.whitespace < MAX_WHITESPACE {
                stack.whitespace += 1;
                out.push(stack);
            }
            return;
        }
        match top {
            Frame::Value(node) => {
                let node = *node;
                stack.frames.pop();
                return start_value(schema, stack, node, b, out);
            }
            Frame::Lit { lit, pos } => {
                let text = &schema.literals[*lit as usize];
                if text.get(*pos as usize) != Some(&b) {
                    return;
                }
                *pos += 1;
                if *pos as usize == text.len() {
                    stack.frames.pop();
                }
            }
            Frame::Str { escape } => match (*escape, b) {
                (0, b'"') => {
                    stack.frames.pop();
                }
                (0, b'\\') => *escape = 1,
                (0, 0..=0x1f) => return,
                (0, _) => {}
                (1, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => *escape = 0,
                (1, b'u') => *escape = 2,
                (2..=5, b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F') => {
                    *escape = if *escape == 5 { 0 } else { *escape + 1 }
                }
                _ => return,
            },
            Frame::Num { integer, phase, len } => match number_step(*integer, *phase, *len, b) {
                NumStep::Took(next) => {
                    *phase = next;
                    *len += 1;
                }
                NumStep::Ended => {
                    stack.frames.pop();
                    continue;
                }
                NumStep::Dead => return,
            },
            Frame::Obj { .. } => return object_step(schema, stack, b, out),
            Frame::Arr { .. } => return array_step(schema, stack, b, out),
        }
        stack.whitespace = 0;
        out.push(stack);
        return;
    }
}

/// The first byte of a value of `node` (already popped from `stack`).
fn start_value(schema: &Schema, mut stack: Stack, node: NodeId, b: u8, out: &mut Vec<Stack>) {
    let fork = |stack: &Stack, frame: Frame, out: &mut Vec<Stack>| {
        let mut fork = stack.clone();
        fork.frames.push(frame);
        step(schema, fork, b, out);
    };
    let opened = |mut stack: Stack, frame: Frame, out: &mut Vec<Stack>| {
        stack.frames.push(frame);
        stack.whitespace = 0;
        out.push(stack);
    };
    match &schema.nodes[node as usize] {
        Node::Any => ANY_ALTERNATIVES.iter().for_each(|&alt| fork(&stack, Frame::Value(alt), out)),
        Node::AnyOf(alternatives) => alternatives.iter().for_each(|&alt| fork(&stack, Frame::Value(alt), out)),
        Node::Literals(lits) => lits.iter().for_each(|&lit| fork(&stack, Frame::Lit { lit, pos: 0 }, out)),
        Node::Boolean => {
            for lit in [LIT_TRUE, LIT_FALSE] {
                fork(&stack, Frame::Lit { lit, pos: 0 }, out);
            }
        }
        Node::Null => fork(&stack, Frame::Lit { lit: LIT_NULL, pos: 0 }, out),
        Node::Object { .. } if b == b'{' => {
            opened(stack, Frame::Obj { node, next: 0, phase: Phase::Open, pending: 0 }, out);
        }
        Node::Array { .. } if b == b'[' => opened(stack, Frame::Arr { node, count: 0, phase: Phase::Open }, out),
        Node::String if b == b'"' => opened(stack, Frame::Str { escape: 0 }, out),
        Node::Number | Node::Integer => {
            let integer = matches!(schema.nodes[node as usize], Node::Integer);
            stack.frames.push(Frame::Num { integer, phase: NumPhase::Start, len: 0 });
            step(schema, stack, b, out);
        }
        _ => {}
    }
}

/// A byte in an object, between its members.
fn object_step(schema: &Schema, mut stack: Stack, b: u8, out: &mut Vec<Stack>) {
    let Some(&Frame::Obj { node, next, phase, pending }) = stack.frames.last() else { return };
    let Node::Object { properties, additional } = &schema.nodes[node as usize] else { return };
    let rest = &properties[(next as usize).min(properties.len())..];
    let may_close = rest.iter().all(|p| !p.required);
    // The properties a key may name now: the next ones, up to and including the first required one.
    let eligible = rest.iter().enumerate().take(rest.iter().position(|p| p.required).map_or(rest.len(), |i| i + 1));
    let set = |stack: &mut Stack, frame: Frame| {
        if let Some(top) = stack.frames.last_mut() {
            *top = frame;
        }
        stack.whitespace = 0;
    };
    match (phase, b) {
        (Phase::Open | Phase::Member, b'}') if may_close => {
            stack.frames.pop();
            stack.whitespace = 0;
            out.push(stack);
        }
        (Phase::Member, b',') if !rest.is_empty() || additional.is_some() => {
            set(&mut stack, Frame::Obj { node, next, phase: Phase::Comma, pending });
            out.push(stack);
        }
        (Phase::Open | Phase::Comma, b'"') => {
            for (i, property) in eligible {
                let mut fork = stack.clone();
                let after = next + i as u16 + 1;
                set(&mut fork, Frame::Obj { node, next: after, phase: Phase::Key, pending: property.value });
                fork.frames.push(Frame::Lit { lit: property.key, pos: 0 });
                out.push(fork);
            }
            if let Some(value) = additional {
                set(&mut stack, Frame::Obj { node, next, phase: Phase::Key, pending: *value });
                stack.frames.push(Frame::Str { escape: 0 });
                out.push(stack);
            }
        }
        (Phase::Key, b':') => {
            set(&mut stack, Frame::Obj { node, next, phase: Phase::Member, pending });
            stack.frames.push(Frame::Value(pending));
            out.push(stack);
        }
        _ => {}
    }
}

/// A byte in an array, between its items.
fn array_step(schema: &Schema, mut stack: Stack, b: u8, out: &mut Vec<Stack>) {
    let Some(&Frame::Arr { node, count, phase }) = stack.frames.last() else { return };
    let Node::Array { items, min, max } = &schema.nodes[node as usize] else { return };
    let (count_now, min, max) = (count as usize, *min, *max);
    match (phase, b) {
        (Phase::Open | Phase::Member, b']') if count_now >= min => {
            stack.frames.pop();
            stack.whitespace = 0;
            out.push(stack);
        }
        (Phase::Member, b',') if max.is_none_or(|m| count_now < m) => {
            if let Some(top) = stack.frames.last_mut() {
                *top = Frame::Arr { node, count, phase: Phase::Comma };
            }
            stack.whitespace = 0;
            out.push(stack);
        }
        (Phase::Open | Phase::Comma, _) if max.is_none_or(|m| count_now < m) => {
            if let Some(top) = stack.frames.last_mut() {
                *top = Frame::Arr { node, count: count + 1, phase: Phase::Member };
            }
            stack.frames.push(Frame::Value(*items));
            step(schema, stack, b, out);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn accepts(schema: &Schema, text: &str) -> bool {
        State::start(schema).feed(schema, text.as_bytes()).can_end()
    }

    fn prefix_ok(schema: &Schema, text: &str) -> bool {
        !State::start(schema).feed(schema, text.as_bytes()).is_dead()
    }

    fn weather() -> Schema {
        Schema::compile(&json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            },
            "required": ["city"],
        }))
    }

    #[test]
    fn objects_take_required_keys_in_order_and_skip_optional_ones() {
        let s = weather();
        assert!(accepts(&s, r#"{"city": "Paris"}"#));
        assert!(accepts(&s, r#"{"city":"Paris","unit":"celsius","days":3}"#));
        assert!(accepts(&s, r#"{"city":"Paris","days":-3}"#));
        assert!(!accepts(&s, r#"{}"#), "city is required");
        assert!(!prefix_ok(&s, r#"{"unit""#), "a required key cannot be skipped");
        assert!(!prefix_ok(&s, r#"{"city":"x","city""#), "a key comes once");
        assert!(!prefix_ok(&s, r#"{"town""#), "no additional keys by default");
        assert!(!prefix_ok(&s, r#"{"city":"x","days":1.5"#), "integers have no fraction");
        assert!(!prefix_ok(&s, r#"{"city":"x",}"#), "no trailing comma");
        assert!(prefix_ok(&s, r#"{"city":"Pa"#) && !accepts(&s, r#"{"city":"Pa"#));
    }

    #[test]
    fn enums_and_consts_are_exact() {
        let s = weather();
        assert!(prefix_ok(&s, r#"{"city":"x","unit":"fahr"#));
        assert!(!prefix_ok(&s, r#"{"city":"x","unit":"kelvin"#));
        let c = Schema::compile(&json!({"const": {"a": [1, true]}}));
        assert!(accepts(&c, r#"{"a":[1,true]}"#));
        assert!(!prefix_ok(&c, r#"{"a": "#), "a const is its compact JSON text");
    }

    #[test]
    fn nested_arrays_any_of_and_any_values() {
        let s = Schema::compile(&json!({
            "type": "object",
            "properties": {
                "steps": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]}]}, "minItems": 1, "maxItems": 2},
                "extra": {},
            },
            "required": ["steps", "extra"],
        }));
        assert!(accepts(&s, r#"{"steps":["a",{"n":1e5}],"extra":{"k":[null,false,"v",-0.5]}}"#));
        assert!(!prefix_ok(&s, r#"{"steps":[]"#), "minItems");
        assert!(!prefix_ok(&s, r#"{"steps":["a","b","#), "maxItems");
        assert!(!prefix_ok(&s, r#"{"steps":[1"#), "items are strings or objects");
        assert!(!prefix_ok(&s, r#"{"steps":["a"],"extra":tru "#));
        assert!(!prefix_ok(&s, r#"{"steps":["a"],"extra":01"#), "no leading zeros");
    }

    #[test]
    fn strings_check_escapes_and_control_bytes() {
        let s = Schema::compile(&json!({"type": "string"}));
        assert!(accepts(&s, r#""a\"b\\c\u00e9\n""#));
        assert!(accepts(&s, "\"caf\u{e9} \u{1F600}\""));
        assert!(!prefix_ok(&s, r#""\x"#));
        assert!(!prefix_ok(&s, r#""\u00g"#));
        assert!(!prefix_ok(&s, "\"a\nb"));
    }

    #[test]
    fn whitespace_is_capped_and_nothing_follows_the_value() {
        let s = weather();
        assert!(accepts(&s, "{ \n  \"city\" :  \"x\"\n}"));
        assert!(prefix_ok(&s, "{    "));
        assert!(!prefix_ok(&s, "{     "), "five whitespace bytes in a row");
        assert!(prefix_ok(&s, "{  \"city\"    :    "), "the count restarts after each other byte");
        let done = State::start(&s).feed(&s, br#"{"city":"x"}"#);
        assert!(done.must_end() && done.can_end());
        assert!(done.feed(&s, b" ").is_dead(), "no trailing whitespace");
        let n = Schema::compile(&json!({"type": "number"}));
        let twelve = State::start(&n).feed(&n, b"12");
        assert!(twelve.can_end() && !twelve.must_end(), "a top-level number may still grow");
        assert!(State::start(&n).feed(&n, &[b'1'; 25]).is_dead(), "numbers are capped");
    }

    #[test]
    fn the_required_tool_schema_names_a_tool_and_its_parameters() {
        let city = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
        let s = Schema::tool_calls([("get_weather", Some(&city)), ("now", None)]);
        assert!(accepts(&s, r#"[{"name": "get_weather", "parameters": {"city": "Paris"}}]"#));
        assert!(accepts(&s, r#"[{"name":"now","parameters":{}},{"name":"now","parameters":{}}]"#));
        assert!(!accepts(&s, "[]"), "at least one call");
        assert!(!prefix_ok(&s, r#"[{"name":"get_time""#), "only the tools' names");
        assert!(!prefix_ok(&s, r#"[{"name":"now","parameters":{"city""#), "each tool its own parameters");
        assert!(!prefix_ok(&s, r#"[{"parameters""#), "name first");
        // Stacks of the two tools merge back once their names diverge and close.
        let state = State::start(&s).feed(&s, br#"[{"name":"get_weather","parameters":{"city":"P"#);
        assert_eq!(state.stacks.len(), 1);
    }

    #[test]
    fn a_recursive_schema_nests() {
        let s = Schema::compile(&json!({
            "$defs": {"T": {"type": "object", "properties": {"k": {"type": "array", "items": {"$ref": "#/$defs/T"}}}}},
            "$ref": "#/$defs/T",
        }));
        assert!(accepts(&s, r#"{"k":[{"k":[{}]},{}]}"#));
        assert!(!prefix_ok(&s, r#"{"k":[{"j""#));
    }
}
