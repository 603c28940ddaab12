//! Constrained decoding for forced tool choices and `response_format`: a JSON Schema compiled to a byte-level
//! pushdown automaton (`schema.rs`, `automaton.rs`), lifted to the tokenizer's vocabulary so that the engine
//! samples only tokens that keep the output a valid prefix of a schema-valid JSON text.
//!
//! [`Constraints`] keeps, per server, each model's token index and the compiled constraints of recent schemas:
//! an agent sends the same tools (or the same response schema) on every turn, and a constraint's masks (33 ms
//! fresh inside a string on a 49k vocabulary, 2 µs cached) then carry over from one request to the next.

mod after_reasoning;
mod automaton;
mod schema;
mod vocab;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use trinity_engine::Constraint;
use trinity_explorer::RolloutModel;

pub(crate) use after_reasoning::after_reasoning;
pub(crate) use schema::Schema;
pub(crate) use vocab::{JsonConstraint, SharedJson, TokenIndex};

/// How many compiled constraints a server keeps across requests. Each holds up to 256 cached masks of one byte
/// per vocabulary entry (12.6 MB at 49k, 39 MB at Qwen's 152k), so this bounds the cache at a few hundred MB in
/// the worst case while covering the handful of tool sets an agent workload uses.
const SHARED_CONSTRAINTS: usize = 8;

/// The token indexes of the models a server answers with (built on first use) and its recently used
/// constraints, most recent first.
#[derive(Debug, Default)]
pub(crate) struct Constraints {
    indexes: Mutex<Vec<(usize, Arc<TokenIndex>)>>,
    recent: Mutex<VecDeque<Shared>>,
}

#[derive(Debug)]
struct Shared {
    model: usize,
    /// What the schema was compiled from, as JSON text: equal text, equal constraint.
    key: String,
    constraint: Arc<JsonConstraint>,
}

impl Constraints {
    /// `model`'s index; the first call for a model builds it (hundreds of milliseconds for a 49k vocabulary).
    fn index(&self, model: usize, rollout: &RolloutModel) -> Arc<TokenIndex> {
        let mut indexes = self.indexes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, index)) = indexes.iter().find(|(k, _)| *k == model) {
            return Arc::clone(index);
        }
        let index = Arc::new(TokenIndex::new(rollout.tokenizer()));
        indexes.push((model, Arc::clone(&index)));
        index
    }

    /// The engine constraint for the schema `key` describes over `model`'s vocabulary: the one a recent request
    /// with the same key used (its masks cached), else `schema()` compiled.
    pub(crate) fn get(&self, model: &Arc<RolloutModel>, key: String, schema: impl FnOnce() -> Schema) -> Constraint {
        let id = Arc::as_ptr(model) as usize;
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let at = recent.iter().position(|s| s.model == id && s.key == key);
        let shared = match at.and_then(|at| recent.remove(at)) {
            Some(hit) => hit,
            // Compiling under the lock keeps two requests with one new schema from building it twice; it costs
            // microseconds to milliseconds, and the masks are built lazily by the engine.
            None => {
                Shared { model: id, key, constraint: Arc::new(JsonConstraint::new(schema(), self.index(id, model))) }
            }
        };
        let constraint = Arc::clone(&shared.constraint);
        recent.push_front(shared);
        recent.truncate(SHARED_CONSTRAINTS);
        Constraint(Arc::new(SharedJson(constraint)))
    }
}
