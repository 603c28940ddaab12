//! Integration tests of trinity-reward: every reward through the registry, with tricky responses, and the
//! task generators scored by their own rewards.

mod generators;
mod no_panic;
mod tricky;
