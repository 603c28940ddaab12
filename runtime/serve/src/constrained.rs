//! Constrained decoding for forced tool choices: a JSON Schema compiled to a byte-level pushdown automaton
//! (`schema.rs`, `automaton.rs`), lifted to the tokenizer's vocabulary so that the engine samples only tokens
//! that keep the output a valid prefix of a schema-valid JSON text.

mod automaton;
mod schema;
mod vocab;

pub(crate) use schema::Schema;
pub(crate) use vocab::{JsonConstraint, SharedJson, TokenIndex};
