//! What every experience store shares: the records it keeps beside the experiences, and the rules of a claim.
//!
//! The buffer is the contract between explorer and trainer processes (`mode: explore` / `mode: train`), possibly
//! on several machines, so these rules hold for the SQLite and PostgreSQL stores alike (the in-memory store keeps
//! the parts that make sense inside one process):
//!
//! * **Producers** (Trinity's `explorer.name`) write explore steps. A step is stored with the explorer's opaque
//!   state in one transaction, keyed by (producer, step): storing it again is a no-op, so a step retried after a
//!   lost connection never duplicates rows. Experiences are keyed by (producer, uid) as well.
//! * **A consumer** (a trainer) claims rows for train step `s`; the claim records (consumer, `s`). Claiming step
//!   `s` again returns the same rows, so a claim retried after an unknown outcome does not take a second batch.
//!   [`commit_through`](crate::ExperienceBuffer::commit_through)`(s)` makes the consumer's claims of steps ≤ `s`
//!   final once its checkpoint of `s` is durable; [`release_after`](crate::ExperienceBuffer::release_after)`(s)`
//!   hands back its claims of later steps when it resumes from that checkpoint. Final claims are never released.
//! * **Leases**: every consumer call is a heartbeat. A claim whose consumer has not been seen for the lease period
//!   may be taken by another consumer (never by the same consumer, which gets its rows back through
//!   `release_after` instead and would otherwise train them twice).
//! * Rows older than the reader's minimum model version are marked stale in the claiming transaction, with the
//!   claim's step, so that a resumed trainer sees them again exactly as the interrupted one did.
//!
//! Row states (`consumed`): 0 waiting, 1 claimed, 2 skipped as stale; `committed` marks a claim final.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The producer that rows written before producers existed belong to (one-process runs of older trinity).
pub const LEGACY_PRODUCER: &str = "explorer";

/// The consumer a buffer claims as unless told otherwise ([`crate::ExperienceBuffer::with_consumer`]).
pub const DEFAULT_CONSUMER: &str = "trainer";

/// How long a consumer may stay silent before another consumer may take its claims. Long, because a train step
/// on a large model can take many minutes without touching the buffer and, with a single trainer, nobody else
/// is there to take over anyway; Trinity-RFT's default `max_read_timeout` is the same 30 minutes.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(1800);

/// What opening a store did to its schema. Both stores share it so that they log an upgrade and refuse a newer
/// schema in the same words.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Migration {
    /// Already at the version this code writes.
    Current,
    /// A new, empty database.
    Created,
    /// A database of version `from`, brought up to date.
    Migrated { from: i64 },
    /// Written by a newer trinity: left untouched, because this code cannot know what the newer columns mean.
    TooNew { found: i64 },
}

impl Migration {
    /// Logs an upgrade of `store` to `version`, or refuses a schema newer than `version`.
    pub(crate) fn accept(self, store: impl FnOnce() -> String, version: i64) -> crate::error::Result<()> {
        match self {
            Migration::Current | Migration::Created => Ok(()),
            Migration::Migrated { from } => {
                tracing::info!("{}: schema upgraded from version {from} to {version}", store());
                Ok(())
            }
            Migration::TooNew { found } => {
                Err(crate::error::BufferError::SchemaTooNew { store: store(), found, supported: version })
            }
        }
    }
}

/// `consumed` value of a claimed row.
pub(crate) const CLAIMED: i64 = 1;
/// `consumed` value of a row skipped because its model version was older than the reader's minimum.
pub(crate) const STALE: i64 = 2;

/// A recorded explore step: its producer and number, how many experiences it stored, and the explorer's state
/// after it (opaque JSON chosen by the caller: taskset position, metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExploreStep {
    pub producer: String,
    pub step: u64,
    pub count: usize,
    pub state: String,
}

/// What a producer last said about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProducerState {
    /// Exploring; also sent as a heartbeat.
    Running,
    /// Done: it will store no more steps.
    Finished,
}

impl ProducerState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ProducerState::Running => "running",
            ProducerState::Finished => "finished",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<ProducerState> {
        match text {
            "running" => Some(ProducerState::Running),
            "finished" => Some(ProducerState::Finished),
            _ => None,
        }
    }
}

/// A producer as the buffer knows it, so that a trainer in another process can tell when every explorer is done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerStatus {
    pub name: String,
    pub state: ProducerState,
    /// When it last stored a step or reported its state, in Unix seconds (the database's clock for PostgreSQL,
    /// so that machines with skewed clocks agree).
    pub last_seen: u64,
    /// Explore steps it has stored.
    pub steps: u64,
}

/// Seconds since the Unix epoch on this machine's clock.
pub(crate) fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// A step, version or count as a database integer; values beyond `i64::MAX` never occur in a run, and saturating
/// keeps comparisons ordered if one ever did.
pub(crate) fn db_int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A database integer read back as a count or step (negative values never occur; they read as 0).
pub(crate) fn from_db_int(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// The uid column of each experience of one batch: `eid.uid()`, with `#k` appended to the k-th repeat of a uid
/// within the batch. Advantage functions may repeat groups, and those repeats are real training rows, so the
/// unique key (producer, uid) must tell them apart; the suffix is deterministic, so a retried step produces the
/// same keys and stays a no-op.
pub(crate) fn batch_uids(batch: &[crate::Experience]) -> Vec<String> {
    let mut seen = std::collections::HashMap::<String, usize>::new();
    batch
        .iter()
        .map(|exp| {
            let uid = exp.eid.uid();
            let repeats = seen.entry(uid.clone()).or_insert(0);
            *repeats += 1;
            if *repeats == 1 { uid } else { format!("{uid}#{}", *repeats - 1) }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experience::{Eid, Experience};

    #[test]
    fn repeated_uids_in_a_batch_get_stable_suffixes() {
        let exp = |task| Experience::single_turn(Eid { batch: 3, task, ..Eid::default() }, vec![1, 2], 1, vec![0.0]);
        let batch = vec![exp(0), exp(1), exp(0), exp(0)];
        assert_eq!(batch_uids(&batch), ["3/0/0/0", "3/1/0/0", "3/0/0/0#1", "3/0/0/0#2"]);
    }

    #[test]
    fn producer_states_round_trip_through_text() {
        for state in [ProducerState::Running, ProducerState::Finished] {
            assert_eq!(ProducerState::parse(state.as_str()), Some(state));
        }
        assert_eq!(ProducerState::parse("lost"), None);
    }
}
