//! Prioritised experience replay (`buffer.trainer_input.experience_buffer.replay_buffer`), as Trinity-RFT
//! v0.5.2 defines it in `trinity/buffer/storage/queue.py` (`AsyncPriorityQueue`, the `PriorityFunction`s and
//! the experience pool of `QueueStorage.get_batch`).
//!
//! # How it maps onto Trinity-RFT
//!
//! * **Item.** The unit that is stored, prioritised, counted, cooled down and evicted is one *item*: the list
//!   of experiences one explore step hands the buffer after the experience pipeline (Trinity's `put_batch`
//!   argument, every task group of the step together). [`ReplayBuffer::put`] takes exactly that list.
//! * **Priority.** Computed from the item's first experience when the item enters the queue (a put or a
//!   reinsertion after cooldown) and fixed while it waits:
//!   `model_version − decay · use_count`, plus `N(0, sigma²)` noise for `decay_limit_randomization` when
//!   `sigma > 0`. Defaults: `linear_decay {decay: 2.0}`, `decay_limit_randomization {decay: 2.0,
//!   use_count_limit: 3, sigma: 0.0}`; the user's `priority_fn_args` are merged over these.
//! * **Order.** A read pops the highest priority first; items of equal priority leave in the order they
//!   entered (Trinity keeps a `SortedDict` of priority → FIFO deque; here a `BTreeMap` of the same shape).
//! * **Capacity** counts items, not experiences (Trinity's `item_count`). A put into a full queue compares
//!   with the lowest priority: if that is higher than the newcomer's, the newcomer is dropped; otherwise the
//!   oldest item of the lowest priority is evicted and the newcomer stored. A put never waits: the replay
//!   buffer has no back-pressure on the explorer.
//! * **Use count and cooldown.** Reading an item adds 1 to its `use_count` (stamped into every experience's
//!   `info["use_count"]`, as Trinity does). With `reuse_cooldown_time: null` an item is read once and never
//!   comes back; with `t` seconds it re-enters the queue `t` seconds after the read, with a new priority —
//!   unless `decay_limit_randomization` retires it because `use_count` reached `use_count_limit`
//!   (`use_count_limit ≤ 0`: never retired). `linear_decay` never retires. An infinite cooldown never
//!   reinserts. While cooling, an item is outside the queue and does not count against capacity; when it
//!   comes back into a full queue it competes like a new put.
//! * **Batch.** [`ReplayBuffer::take`] fills a batch of exactly `n` experiences: first the leftovers of the
//!   item read last time, then whole items by priority, each item's experiences in the order they were put.
//!   When `n` is not a multiple of the item size, the rest of the last item read waits in a pool and opens
//!   the next batch (Trinity's `exp_pool`); it was already counted as used.
//! * **Staleness.** With `min_model_version`, items older than it are discarded when a read reaches them
//!   (never reinserted), and older pool leftovers are skipped; [`ReplayStats::stale_dropped`] counts them.
//! * **Close.** [`ReplayBuffer::close`] is Trinity's `close`: reads stop scheduling reinsertions (items
//!   already cooling still come back), so the buffer drains and the trainer can stop.
//!
//! # Where this differs from Trinity-RFT, on purpose
//!
//! * Time is an argument. Nothing runs in the background: an item whose cooldown ended re-enters the queue
//!   at the first `put`/`take` whose `now` is at or after its due time, before that call does anything else,
//!   cooling items in due order. So tests are exact, and an item read in one `take` is never read again in
//!   the same `take`, even with a cooldown of 0 (Trinity's event loop could hand it out twice in one batch).
//! * A short read changes nothing. When fewer than `n` fresh experiences are readable, `take` returns
//!   [`ReplayTake::Short`] with how many are readable and when the next cooling item is due, and consumes
//!   nothing. Trinity pops items while it waits and, on timeout, returns the pool without the experiences it
//!   had already collected (they are lost); its reader then fails anyway.
//! * The use-count limit is decided when the item is read rather than when its cooldown ends. The answer is
//!   the same (the use count does not change while cooling), and a retired item is not kept around.
//! * The noise comes from a SplitMix64 generator seeded by the caller, not NumPy's global generator: runs are
//!   reproducible, but the draws are not NumPy's.
//! * Values Trinity would accept silently or crash on are refused with an error naming the key: a negative
//!   or NaN `reuse_cooldown_time` (Trinity treats it as 0), a capacity of 0 (Trinity fails on the first
//!   put), a `priority_fn_args` value that is not a finite number, an argument the function does not take
//!   (Trinity fails with a Python `TypeError`), and a `use_count_limit` that is not a whole number.
//! * Like Trinity's queue, the contents are not checkpointed: a resumed run starts with an empty buffer.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use trinity_config::buffer::ReplayBufferConfig;
use trinity_rng::SplitMix64;

use crate::error::{Result, json_kind};
use crate::experience::Experience;

/// A `replay_buffer` setting that cannot be honoured. Each message starts with the full config key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplayConfigError {
    #[error(
        "buffer.trainer_input.experience_buffer.replay_buffer.priority_fn: unknown priority function `{name}` (expected `linear_decay` or `decay_limit_randomization`)"
    )]
    UnknownPriorityFn { name: String },
    #[error(
        "buffer.trainer_input.experience_buffer.replay_buffer.priority_fn_args.{arg}: `{priority_fn}` takes no argument `{arg}` (it takes {accepted})"
    )]
    UnknownArg { priority_fn: &'static str, arg: String, accepted: &'static str },
    #[error(
        "buffer.trainer_input.experience_buffer.replay_buffer.priority_fn_args.{arg}: expected {expected}, found {found}"
    )]
    BadArg { arg: String, expected: &'static str, found: String },
    #[error(
        "buffer.trainer_input.experience_buffer.replay_buffer.reuse_cooldown_time: expected seconds ≥ 0 (or null to read each experience once), found {value}"
    )]
    BadCooldown { value: f64 },
    #[error(
        "buffer.trainer_input.experience_buffer.capacity: a replay buffer must hold at least one explore step's experiences, found 0"
    )]
    ZeroCapacity,
}

/// Trinity's two registered priority functions with their arguments resolved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum PriorityFn {
    /// `linear_decay`: always reinserted after cooldown.
    LinearDecay { decay: f64 },
    /// `decay_limit_randomization` (Trinity's `LinearDecayUseCountControlPriority`).
    DecayLimitRandomization { decay: f64, use_count_limit: i64, sigma: f64 },
}

impl PriorityFn {
    /// Resolves `name` with `args` merged over the function's defaults.
    pub(crate) fn from_config(name: &str, args: &Map<String, Value>) -> Result<PriorityFn, ReplayConfigError> {
        match name {
            "linear_decay" => {
                let mut decay = 2.0;
                for (arg, value) in args {
                    match arg.as_str() {
                        "decay" => decay = number(arg, value)?,
                        _ => return Err(unknown_arg("linear_decay", arg, "`decay`")),
                    }
                }
                Ok(PriorityFn::LinearDecay { decay })
            }
            "decay_limit_randomization" => {
                let (mut decay, mut use_count_limit, mut sigma) = (2.0, 3, 0.0);
                for (arg, value) in args {
                    match arg.as_str() {
                        "decay" => decay = number(arg, value)?,
                        "use_count_limit" => use_count_limit = whole_number(arg, value)?,
                        "sigma" => sigma = number(arg, value)?,
                        _ => {
                            return Err(unknown_arg(
                                "decay_limit_randomization",
                                arg,
                                "`decay`, `use_count_limit` and `sigma`",
                            ));
                        }
                    }
                }
                Ok(PriorityFn::DecayLimitRandomization { decay, use_count_limit, sigma })
            }
            _ => Err(ReplayConfigError::UnknownPriorityFn { name: name.to_owned() }),
        }
    }

    /// `model_version − decay · use_count`, plus Gaussian noise when the function has a positive `sigma`
    /// (a non-positive sigma means no noise, as in Trinity).
    fn priority(&self, model_version: u64, use_count: u64, noise: &mut SplitMix64) -> f64 {
        let (decay, sigma) = match *self {
            PriorityFn::LinearDecay { decay } => (decay, 0.0),
            PriorityFn::DecayLimitRandomization { decay, sigma, .. } => (decay, sigma),
        };
        let mut priority = model_version as f64 - decay * use_count as f64;
        if sigma > 0.0 {
            priority += sigma * noise.next_normal();
        }
        priority
    }

    /// Whether an item read `use_count` times goes back into the queue.
    fn reinserts(&self, use_count: u64) -> bool {
        match *self {
            PriorityFn::LinearDecay { .. } => true,
            PriorityFn::DecayLimitRandomization { use_count_limit, .. } => {
                use_count_limit <= 0 || use_count < use_count_limit as u64
            }
        }
    }
}

fn unknown_arg(priority_fn: &'static str, arg: &str, accepted: &'static str) -> ReplayConfigError {
    ReplayConfigError::UnknownArg { priority_fn, arg: arg.to_owned(), accepted }
}

fn number(arg: &str, value: &Value) -> Result<f64, ReplayConfigError> {
    match value.as_f64() {
        Some(x) if x.is_finite() => Ok(x),
        _ => {
            Err(ReplayConfigError::BadArg { arg: arg.to_owned(), expected: "a finite number", found: describe(value) })
        }
    }
}

fn whole_number(arg: &str, value: &Value) -> Result<i64, ReplayConfigError> {
    if let Some(n) = value.as_i64() {
        return Ok(n);
    }
    // YAML `3.0` arrives as a float; Python compares it like 3, so a whole float is accepted.
    match value.as_f64() {
        Some(x) if x.fract() == 0.0 && x.abs() < 2f64.powi(53) => Ok(x as i64),
        _ => Err(ReplayConfigError::BadArg { arg: arg.to_owned(), expected: "a whole number", found: describe(value) }),
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::Number(n) => n.to_string(),
        other => json_kind(other).to_owned(),
    }
}

/// An `f64` priority with a total order, so it can key a `BTreeMap`. Built only from finite values.
#[derive(Debug, Clone, Copy)]
struct Priority(f64);

impl Priority {
    fn new(value: f64) -> Priority {
        // Adding +0.0 turns -0.0 into +0.0: Python's dict treats the two as one key, `total_cmp` would not.
        Priority(value + 0.0)
    }
}

impl PartialEq for Priority {
    fn eq(&self, other: &Priority) -> bool {
        self.0.total_cmp(&other.0).is_eq()
    }
}

impl Eq for Priority {}

impl PartialOrd for Priority {
    fn partial_cmp(&self, other: &Priority) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Priority {
    fn cmp(&self, other: &Priority) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// One explore step's experiences, stored and prioritised together.
#[derive(Debug, Clone)]
struct Item {
    experiences: Vec<Experience>,
    /// The first experience's model version (Trinity assumes one version per item and reads `item[0]`).
    model_version: u64,
    use_count: u64,
}

/// Counters for metrics and logs, over the buffer's lifetime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Items put by the explorer (empty puts are not counted).
    pub items_put: u64,
    /// Item reads (one item read three times counts three).
    pub item_reads: u64,
    /// Items pushed out of a full queue by one with at least their priority.
    pub items_evicted: u64,
    /// Items not let into a full queue because every stored item had a higher priority.
    pub items_rejected: u64,
    /// Items that will not come back after a read (no cooldown, the use-count limit, an infinite cooldown,
    /// or a read after `close`).
    pub items_retired: u64,
    /// Experiences discarded for being older than a read's `min_model_version`.
    pub stale_dropped: u64,
}

/// What [`ReplayBuffer::take`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayTake {
    /// Exactly the `n` experiences asked for.
    Batch(Vec<Experience>),
    /// Fewer than `n` fresh experiences are readable now; nothing was consumed.
    Short {
        /// Fresh experiences readable now (pool leftovers and queued items).
        available: usize,
        /// When the next cooling item is due back, if any is cooling. `None`: only another put can make this
        /// read succeed (after `close`, with the explorer done, the trainer can stop).
        next_reinsert: Option<Instant>,
    },
}

/// Trinity-RFT's priority queue with experience reuse, driven by explicit time. Not thread-safe by itself:
/// the run loop owns it (or wraps it in a mutex) and calls [`put`](Self::put) after each explore step and
/// [`take`](Self::take) for each train step.
#[derive(Debug)]
pub struct ReplayBuffer {
    priority_fn: PriorityFn,
    /// `None`: never reinsert (Trinity's `reuse_cooldown_time: null`, an infinite cooldown, or after close).
    cooldown: Option<Duration>,
    capacity: usize,
    /// Priority → items of that priority, oldest first.
    queue: BTreeMap<Priority, VecDeque<Item>>,
    item_count: usize,
    /// Items waiting out their cooldown, keyed by (due time, read order) so they return in due order.
    cooling: BTreeMap<(Instant, u64), Item>,
    reads_so_far: u64,
    /// Leftovers of the last item read, served first by the next take.
    pool: VecDeque<Experience>,
    /// The `decay_limit_randomization` noise: each draw takes two outputs (Box–Muller, cosine branch only).
    noise: SplitMix64,
    closed: bool,
    stats: ReplayStats,
}

impl ReplayBuffer {
    /// Builds the buffer from `replay_buffer` and the experience buffer's `capacity` (counted in items, i.e.
    /// explore steps, as in Trinity). `seed` drives the `sigma` noise; pass the run's seed so runs repeat.
    /// Validates everything whether or not `enable` is set, so a dry run can check the section.
    pub fn from_config(
        config: &ReplayBufferConfig,
        capacity: u32,
        seed: u64,
    ) -> Result<ReplayBuffer, ReplayConfigError> {
        let priority_fn = PriorityFn::from_config(&config.priority_fn, &config.priority_fn_args)?;
        let cooldown = match config.reuse_cooldown_time {
            None => None,
            Some(value) if value.is_nan() || value < 0.0 => return Err(ReplayConfigError::BadCooldown { value }),
            // An infinite (or unrepresentably long) cooldown never ends: the item is never reused.
            Some(value) => Duration::try_from_secs_f64(value).ok(),
        };
        if capacity == 0 {
            return Err(ReplayConfigError::ZeroCapacity);
        }
        Ok(ReplayBuffer {
            priority_fn,
            cooldown,
            capacity: capacity as usize,
            queue: BTreeMap::new(),
            item_count: 0,
            cooling: BTreeMap::new(),
            reads_so_far: 0,
            pool: VecDeque::new(),
            noise: SplitMix64::new(seed),
            closed: false,
            stats: ReplayStats::default(),
        })
    }

    /// Stores one explore step's experiences as one item (after reinserting items whose cooldown ended by
    /// `now`). Never waits: a full queue evicts or drops by priority. An empty list is ignored. Fails only on
    /// an experience whose lengths are inconsistent, storing nothing.
    pub fn put(&mut self, experiences: Vec<Experience>, now: Instant) -> Result<()> {
        for experience in &experiences {
            experience.validate()?;
        }
        self.reinsert_due(now);
        let Some(first) = experiences.first() else {
            return Ok(());
        };
        let model_version = first.model_version;
        self.stats.items_put += 1;
        self.insert(Item { experiences, model_version, use_count: 0 });
        Ok(())
    }

    /// The next `n` experiences for a train step, by priority (see the module docs), or
    /// [`ReplayTake::Short`] without consuming anything when fewer than `n` fresh ones are readable at `now`.
    /// `min_model_version` discards older items as the read reaches them (`None`: keep all).
    pub fn take(&mut self, n: usize, now: Instant, min_model_version: Option<u64>) -> ReplayTake {
        self.reinsert_due(now);
        let fresh = |version: u64| min_model_version.is_none_or(|min| version >= min);
        let available = self.pool.iter().filter(|e| fresh(e.model_version)).count()
            + self
                .queue
                .values()
                .flatten()
                .filter(|item| fresh(item.model_version))
                .map(|item| item.experiences.len())
                .sum::<usize>();
        if available < n {
            return ReplayTake::Short { available, next_reinsert: self.next_reinsert() };
        }
        let mut batch = Vec::with_capacity(n);
        while batch.len() < n {
            if let Some(experience) = self.pool.pop_front() {
                if fresh(experience.model_version) {
                    batch.push(experience);
                } else {
                    self.stats.stale_dropped += 1;
                }
                continue;
            }
            // The count above guarantees an item is left whenever the batch is short; stop rather than spin
            // if that ever failed.
            let Some(item) = self.pop_highest() else {
                break;
            };
            if !fresh(item.model_version) {
                self.stats.stale_dropped += item.experiences.len() as u64;
                continue;
            }
            self.read(item, now);
        }
        ReplayTake::Batch(batch)
    }

    /// Stops reinsertion for items read from now on, so the buffer drains (Trinity closes the queue when the
    /// explorer is done). Items already cooling still come back when due; puts are still accepted.
    pub fn close(&mut self) {
        self.closed = true;
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Items in the queue now (Trinity's `qsize`); cooling items and pool leftovers are not counted.
    pub fn queued_items(&self) -> usize {
        self.item_count
    }

    /// True when nothing is queued, cooling or left over: no read can succeed before the next put.
    pub fn is_drained(&self) -> bool {
        self.item_count == 0 && self.cooling.is_empty() && self.pool.is_empty()
    }

    /// When the next cooling item is due back in the queue.
    pub fn next_reinsert(&self) -> Option<Instant> {
        self.cooling.keys().next().map(|(due, _)| *due)
    }

    pub fn stats(&self) -> ReplayStats {
        self.stats
    }

    /// Counts a read of `item`, moves its experiences into the pool and schedules its return.
    fn read(&mut self, mut item: Item, now: Instant) {
        item.use_count += 1;
        self.stats.item_reads += 1;
        for experience in &mut item.experiences {
            experience.info.insert("use_count".to_owned(), Value::from(item.use_count));
        }
        let due = match self.cooldown {
            Some(cooldown) if !self.closed && self.priority_fn.reinserts(item.use_count) => now.checked_add(cooldown),
            _ => None,
        };
        match due {
            Some(due) => {
                self.pool.extend(item.experiences.iter().cloned());
                self.cooling.insert((due, self.reads_so_far), item);
            }
            None => {
                self.stats.items_retired += 1;
                self.pool.extend(item.experiences);
            }
        }
        self.reads_so_far += 1;
    }

    /// Moves every item whose cooldown ended by `now` back into the queue, earliest due first.
    fn reinsert_due(&mut self, now: Instant) {
        while let Some(entry) = self.cooling.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let item = entry.remove();
            self.insert(item);
        }
    }

    /// Trinity's `_put`: priority now, then the capacity rule.
    fn insert(&mut self, item: Item) {
        let priority = Priority::new(self.priority_fn.priority(item.model_version, item.use_count, &mut self.noise));
        if self.item_count >= self.capacity {
            let Some(mut lowest) = self.queue.first_entry() else {
                // Unreachable: capacity is at least 1, so a full queue has a lowest entry.
                return;
            };
            if *lowest.key() > priority {
                self.stats.items_rejected += 1;
                return;
            }
            lowest.get_mut().pop_front();
            if lowest.get().is_empty() {
                lowest.remove();
            }
            self.item_count -= 1;
            self.stats.items_evicted += 1;
        }
        self.queue.entry(priority).or_default().push_back(item);
        self.item_count += 1;
    }

    fn pop_highest(&mut self) -> Option<Item> {
        let mut highest = self.queue.last_entry()?;
        let item = highest.get_mut().pop_front();
        if highest.get().is_empty() {
            highest.remove();
        }
        if item.is_some() {
            self.item_count -= 1;
        }
        item
    }

    /// `(priority, model_version, use_count)` of every queued item, highest first.
    #[cfg(test)]
    fn queued(&self) -> Vec<(f64, u64, u64)> {
        self.queue
            .iter()
            .rev()
            .flat_map(|(p, items)| items.iter().map(move |item| (p.0, item.model_version, item.use_count)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::experience::Eid;

    /// One explore step: `groups` tasks × `runs` runs, all at `model_version`; `eid.batch` = `step`.
    fn step(step: u64, model_version: u64, groups: u64, runs: u64) -> Vec<Experience> {
        let mut experiences = Vec::new();
        for task in 0..groups {
            for run in 0..runs {
                let mut exp =
                    Experience::single_turn(Eid { batch: step, task, run, step: 0 }, vec![1, 2, 3], 2, vec![-0.5]);
                exp.model_version = model_version;
                experiences.push(exp);
            }
        }
        experiences
    }

    fn config(priority_fn: &str, cooldown: Option<f64>, args: Value) -> ReplayBufferConfig {
        ReplayBufferConfig {
            enable: true,
            priority_fn: priority_fn.to_owned(),
            reuse_cooldown_time: cooldown,
            priority_fn_args: args.as_object().cloned().unwrap_or_default(),
        }
    }

    fn buffer(priority_fn: &str, cooldown: Option<f64>, args: Value, capacity: u32) -> ReplayBuffer {
        ReplayBuffer::from_config(&config(priority_fn, cooldown, args), capacity, 7).unwrap()
    }

    fn batch(take: ReplayTake) -> Vec<Experience> {
        match take {
            ReplayTake::Batch(batch) => batch,
            short => panic!("expected a batch, got {short:?}"),
        }
    }

    /// `(model_version, use_count)` of each experience.
    fn versions_and_uses(batch: &[Experience]) -> Vec<(u64, u64)> {
        batch.iter().map(|e| (e.model_version, e.info["use_count"].as_u64().unwrap())).collect()
    }

    fn secs(t0: Instant, s: f64) -> Instant {
        t0 + Duration::from_secs_f64(s)
    }

    fn assert_close(actual: &[(f64, u64, u64)], expected: &[(f64, u64, u64)]) {
        assert_eq!(actual.len(), expected.len(), "{actual:?} vs {expected:?}");
        for (a, e) in actual.iter().zip(expected) {
            assert!((a.0 - e.0).abs() < 1e-9 && a.1 == e.1 && a.2 == e.2, "{actual:?} vs {expected:?}");
        }
    }

    /// Trinity's own `test_priority_queue_buffer_reuse` trace: capacity 4 items of 2, `linear_decay` with
    /// decay 0.6, cooldown 0.5 s, a read of 4 every second. Priorities by hand: version − 0.6 · use_count.
    #[test]
    fn linear_decay_follows_trinitys_reuse_trace() {
        let t0 = Instant::now();
        let mut buf = buffer("linear_decay", Some(0.5), json!({"decay": 0.6}), 4);
        for v in 0..4 {
            buf.put(step(v, v, 1, 2), t0).unwrap();
        }
        // Full: version 4 (priority 4) evicts version 0 (priority 0, the lowest).
        buf.put(step(4, 4, 1, 2), t0).unwrap();
        assert_close(&buf.queued(), &[(4.0, 4, 0), (3.0, 3, 0), (2.0, 2, 0), (1.0, 1, 0)]);
        assert_eq!(buf.stats().items_evicted, 1);

        let reads = [
            // (time, expected (version, use_count) at positions 0 and 2, queue after the cooldown)
            (0.0, [(4, 1), (3, 1)], vec![(3.4, 4, 1), (2.4, 3, 1), (2.0, 2, 0), (1.0, 1, 0)]),
            (1.0, [(4, 2), (3, 2)], vec![(2.8, 4, 2), (2.0, 2, 0), (1.8, 3, 2), (1.0, 1, 0)]),
            (2.0, [(4, 3), (2, 1)], vec![(2.2, 4, 3), (1.8, 3, 2), (1.4, 2, 1), (1.0, 1, 0)]),
            (3.0, [(4, 4), (3, 3)], vec![(1.6, 4, 4), (1.4, 2, 1), (1.2, 3, 3), (1.0, 1, 0)]),
            (4.0, [(4, 5), (2, 2)], vec![(1.2, 3, 3), (1.0, 1, 0), (1.0, 4, 5), (0.8, 2, 2)]),
            (5.0, [(3, 4), (1, 1)], vec![(1.0, 4, 5), (0.8, 2, 2), (0.6, 3, 4), (0.4, 1, 1)]),
        ];
        for (t, expected, queue_after) in reads {
            let got = batch(buf.take(4, secs(t0, t), None));
            let got = versions_and_uses(&got);
            assert_eq!([got[0], got[2]], expected, "read at {t} s: {got:?}");
            assert_eq!(got[0], got[1], "an item's experiences come out together");
            buf.put(Vec::new(), secs(t0, t + 0.5)).unwrap();
            assert_close(&buf.queued(), &queue_after);
        }
    }

    /// Trinity's `test_priority_queue_reuse_count_control` trace: `decay_limit_randomization` with decay 1.2,
    /// use_count_limit 2, sigma 0; an item read twice does not come back.
    #[test]
    fn use_count_limit_retires_items_as_trinity_does() {
        let t0 = Instant::now();
        let args = json!({"decay": 1.2, "use_count_limit": 2, "sigma": 0.0});
        let mut buf = buffer("decay_limit_randomization", Some(0.5), args, 4);
        for v in 0..5 {
            buf.put(step(v, v, 1, 2), t0).unwrap();
        }
        let first = versions_and_uses(&batch(buf.take(4, t0, None)));
        assert_eq!([first[0], first[2]], [(4, 1), (3, 1)]);
        buf.put(Vec::new(), secs(t0, 1.0)).unwrap();
        assert_close(&buf.queued(), &[(2.8, 4, 1), (2.0, 2, 0), (1.8, 3, 1), (1.0, 1, 0)]);

        let second = versions_and_uses(&batch(buf.take(4, secs(t0, 1.0), None)));
        assert_eq!([second[0], second[2]], [(4, 2), (2, 1)]);
        buf.put(Vec::new(), secs(t0, 2.0)).unwrap();
        // Version 4 reached the limit: 3 items left.
        assert_eq!(buf.queued_items(), 3);
        assert_close(&buf.queued(), &[(1.8, 3, 1), (1.0, 1, 0), (0.8, 2, 1)]);

        let third = versions_and_uses(&batch(buf.take(4, secs(t0, 2.0), None)));
        assert_eq!([third[0], third[2]], [(3, 2), (1, 1)]);
        buf.put(Vec::new(), secs(t0, 3.0)).unwrap();
        assert_close(&buf.queued(), &[(0.8, 2, 1), (-0.2, 1, 1)]);
        assert_eq!(buf.stats().items_retired, 2);
    }

    #[test]
    fn use_count_limit_zero_or_negative_never_retires() {
        let t0 = Instant::now();
        for limit in [0, -1] {
            let args = json!({"use_count_limit": limit});
            let mut buf = buffer("decay_limit_randomization", Some(0.0), args, 4);
            buf.put(step(0, 0, 1, 2), t0).unwrap();
            for read in 1..=10u64 {
                let got = versions_and_uses(&batch(buf.take(2, secs(t0, read as f64), None)));
                assert_eq!(got, vec![(0, read); 2]);
            }
            assert_eq!(buf.stats().items_retired, 0);
        }
    }

    #[test]
    fn an_item_is_not_readable_before_its_cooldown_and_is_after() {
        let t0 = Instant::now();
        let mut buf = buffer("linear_decay", Some(40.0), json!({}), 10);
        buf.put(step(0, 3, 2, 2), t0).unwrap();
        assert_eq!(versions_and_uses(&batch(buf.take(4, t0, None))), vec![(3, 1); 4]);

        let due = secs(t0, 40.0);
        let just_before = due - Duration::from_millis(1);
        assert_eq!(buf.take(4, just_before, None), ReplayTake::Short { available: 0, next_reinsert: Some(due) });
        assert_eq!(buf.queued_items(), 0);
        // At the due time it is back, with priority 3 − 2·1 = 1, and its second read counts 2.
        assert_eq!(versions_and_uses(&batch(buf.take(4, due, None))), vec![(3, 2); 4]);
    }

    #[test]
    fn no_cooldown_reads_each_item_once() {
        let t0 = Instant::now();
        let mut buf = buffer("linear_decay", None, json!({}), 10);
        buf.put(step(0, 0, 1, 2), t0).unwrap();
        buf.put(step(1, 1, 1, 2), t0).unwrap();
        // Without reuse every use count is 0 while queued, so the newest version comes first.
        assert_eq!(versions_and_uses(&batch(buf.take(2, t0, None))), vec![(1, 1); 2]);
        assert_eq!(versions_and_uses(&batch(buf.take(2, secs(t0, 1e6), None))), vec![(0, 1); 2]);
        assert_eq!(buf.take(1, secs(t0, 2e6), None), ReplayTake::Short { available: 0, next_reinsert: None });
        assert!(buf.is_drained());
        assert_eq!(buf.stats().items_retired, 2);
    }

    #[test]
    fn an_infinite_cooldown_never_reinserts() {
        let t0 = Instant::now();
        let mut buf = buffer("linear_decay", Some(f64::INFINITY), json!({}), 10);
        buf.put(step(0, 0, 1, 2), t0).unwrap();
        batch(buf.take(2, t0, None));
        assert_eq!(buf.next_reinsert(), None);
        assert!(buf.is_drained());
    }

    #[test]
    fn a_zero_cooldown_item_is_not_read_twice_in_one_take() {
        let t0 = Instant::now();
        let mut buf = buffer("linear_decay", Some(0.0), json!({}), 10);
        buf.put(step(0, 5, 1, 2), t0).unwrap();
        // Two experiences readable: a take of 4 is short, and consumes nothing.
        assert_eq!(buf.take(4, t0, None), ReplayTake::Short { available: 2, next_reinsert: None });
        assert_eq!(versions_and_uses(&batch(buf.take(2, t0, None))), vec![(5, 1); 2]);
        assert_eq!(versions_and_uses(&batch(buf.take(2, t0, None))), vec![(5, 2); 2]);
    }

    #[test]
    fn a_full_queue_evicts_the_oldest_lowest_priority_item() {
        let t0 = Instant::now();
        let mut buf = buffer("linear_decay", None, json!({}), 3);
        // Versions 1, 1, 2: two items share the lowest priority, the first put is the oldest.
        buf.put(step(10, 1, 1, 1), t0).unwrap();
        buf.put(step(11, 1, 1, 1), t0).unwrap();
        buf.put(step(12, 2, 1, 1), t0).unwrap();
        // Equal to the lowest priority: let in, evicting step 10.
        buf.put(step(13, 1, 1, 1), t0).unwrap();
        // Below the lowest: dropped.
        buf.put(step(14, 0, 1, 1), t0).unwrap();
        let stats = buf.stats();
        assert_eq!((stats.items_evicted, stats.items_rejected, buf.queued_items()), (1, 1, 3));
        let order: Vec<u64> = batch(buf.take(3, t0, None)).iter().map(|e| e.eid.batch).collect();
        // Highest first; among equal priorities, first in first out.
        assert_eq!(order, vec![12, 11, 13]);
    }

    #[test]
    fn a_returning_item_competes_for_room_like_a_new_put() {
        let t0 = Instant::now();
        let mut buf = buffer("linear_decay", Some(1.0), json!({"decay": 2.0}), 2);
        buf.put(step(0, 5, 1, 1), t0).unwrap();
        batch(buf.take(1, t0, None));
        buf.put(step(1, 4, 1, 1), t0).unwrap();
        buf.put(step(2, 6, 1, 1), t0).unwrap();
        // Step 0 comes back at priority 5 − 2 = 3 into a full queue whose lowest is 4: dropped.
        buf.put(Vec::new(), secs(t0, 1.0)).unwrap();
        assert_eq!(buf.stats().items_rejected, 1);
        assert_close(&buf.queued(), &[(6.0, 6, 0), (4.0, 4, 0)]);
    }

    #[test]
    fn reads_return_whole_items_in_put_order_and_leftovers_open_the_next_read() {
        let t0 = Instant::now();
        let mut buf = buffer("linear_decay", None, json!({}), 10);
        // Two explore steps of 2 tasks × 2 runs; step 1 is newer, so it is read first.
        buf.put(step(0, 0, 2, 2), t0).unwrap();
        buf.put(step(1, 1, 2, 2), t0).unwrap();
        let ids = |batch: &[Experience]| batch.iter().map(|e| (e.eid.batch, e.eid.task, e.eid.run)).collect::<Vec<_>>();
        let first = batch(buf.take(4, t0, None));
        assert_eq!(ids(&first), vec![(1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]);
        // A read of 2 takes task 0 of step 0 whole; task 1 waits in the pool and opens the next read.
        let second = batch(buf.take(2, t0, None));
        assert_eq!(ids(&second), vec![(0, 0, 0), (0, 0, 1)]);
        assert_eq!(buf.queued_items(), 0);
        assert!(!buf.is_drained());
        let third = batch(buf.take(2, t0, None));
        assert_eq!(ids(&third), vec![(0, 1, 0), (0, 1, 1)]);
        assert!(buf.is_drained());
    }

    #[test]
    fn a_short_read_consumes_nothing() {
        let t0 = Instant::now();
        let mut buf = buffer("linear_decay", Some(10.0), json!({}), 10);
        buf.put(step(0, 0, 1, 3), t0).unwrap();
        assert_eq!(buf.take(4, t0, None), ReplayTake::Short { available: 3, next_reinsert: None });
        assert_eq!(buf.stats().item_reads, 0);
        buf.put(step(1, 1, 1, 3), t0).unwrap();
        let got = batch(buf.take(4, t0, None));
        assert_eq!(versions_and_uses(&got), vec![(1, 1), (1, 1), (1, 1), (0, 1)]);
        // Two experiences of step 0 are left over; the next read needs 2 more than that.
        assert_eq!(buf.take(4, t0, None), ReplayTake::Short { available: 2, next_reinsert: Some(secs(t0, 10.0)) });
    }

    #[test]
    fn stale_items_and_leftovers_are_discarded_when_a_read_reaches_them() {
        let t0 = Instant::now();
        let mut buf = buffer("linear_decay", Some(0.0), json!({"decay": 10.0}), 10);
        buf.put(step(0, 2, 1, 2), t0).unwrap();
        batch(buf.take(2, t0, None));
        // Step 0 returns at 2 − 10 = −8, below step 1's fresh item at 1, which is older than version 2.
        buf.put(step(1, 1, 1, 2), t0).unwrap();
        assert_close(&buf.queued(), &[(1.0, 1, 0), (-8.0, 2, 1)]);
        let got = batch(buf.take(2, t0, Some(2)));
        assert_eq!(versions_and_uses(&got), vec![(2, 2), (2, 2)]);
        assert_eq!(buf.stats().stale_dropped, 2, "step 1 was reached first and discarded whole");

        // A leftover in the pool older than the minimum is skipped too.
        buf.put(step(2, 3, 1, 3), t0).unwrap();
        assert_eq!(versions_and_uses(&batch(buf.take(2, t0, None))), vec![(3, 1), (3, 1)]);
        // Nothing is version 4 or newer: short, and a short read discards nothing.
        assert_eq!(buf.take(1, t0, Some(4)), ReplayTake::Short { available: 0, next_reinsert: None });
        assert_eq!(buf.stats().stale_dropped, 2);
        buf.put(step(3, 4, 1, 1), t0).unwrap();
        let got = batch(buf.take(1, t0, Some(4)));
        assert_eq!(got[0].eid.batch, 3);
        assert_eq!(buf.stats().stale_dropped, 3, "the step 2 leftover");
        // Lower items the read did not reach stay queued (step 2 at 3 − 10 = −7, step 0 at 2 − 20 = −18).
        assert_close(&buf.queued(), &[(-7.0, 3, 1), (-18.0, 2, 2)]);
    }

    #[test]
    fn close_stops_reinsertion_but_cooling_items_still_return() {
        let t0 = Instant::now();
        let mut buf = buffer("linear_decay", Some(1.0), json!({}), 10);
        buf.put(step(0, 0, 1, 1), t0).unwrap();
        buf.put(step(1, 1, 1, 1), t0).unwrap();
        batch(buf.take(1, t0, None));
        buf.close();
        batch(buf.take(1, t0, None));
        // Step 1 was read before close and comes back; step 0 was read after and does not.
        assert_eq!(buf.next_reinsert(), Some(secs(t0, 1.0)));
        let got = batch(buf.take(1, secs(t0, 1.0), None));
        assert_eq!((got[0].eid.batch, got[0].info["use_count"].as_u64()), (1, Some(2)));
        assert_eq!(buf.take(1, secs(t0, 9.0), None), ReplayTake::Short { available: 0, next_reinsert: None });
        assert!(buf.is_drained());
    }

    #[test]
    fn the_noise_is_seeded_and_has_the_configured_spread() {
        let t0 = Instant::now();
        let args = json!({"sigma": 0.5, "decay": 0.0});
        let priorities = |seed: u64| {
            let mut buf =
                ReplayBuffer::from_config(&config("decay_limit_randomization", None, args.clone()), 1000, seed)
                    .unwrap();
            for s in 0..500 {
                buf.put(step(s, 10, 1, 1), t0).unwrap();
            }
            buf.queued().iter().map(|q| q.0).collect::<Vec<f64>>()
        };
        let a = priorities(1);
        assert_eq!(a, priorities(1), "same seed, same priorities");
        assert_ne!(a, priorities(2), "another seed draws other noise");
        let mean = a.iter().sum::<f64>() / a.len() as f64;
        let sd = (a.iter().map(|p| (p - mean).powi(2)).sum::<f64>() / a.len() as f64).sqrt();
        // 500 draws: the sample mean is within ±0.07 of 10 and the sd within ±0.05 of 0.5 with overwhelming
        // probability; the seed is fixed, so this cannot flake.
        assert!((mean - 10.0).abs() < 0.07 && (sd - 0.5).abs() < 0.05, "mean {mean}, sd {sd}");
    }

    #[test]
    fn a_non_positive_sigma_adds_no_noise() {
        let t0 = Instant::now();
        let mut buf = buffer("decay_limit_randomization", None, json!({"sigma": -1.0}), 10);
        buf.put(step(0, 4, 1, 1), t0).unwrap();
        assert_close(&buf.queued(), &[(4.0, 4, 0)]);
    }

    #[test]
    fn user_args_merge_over_each_functions_defaults() {
        let f = |name: &str, args: Value| PriorityFn::from_config(name, args.as_object().unwrap());
        assert_eq!(f("linear_decay", json!({})), Ok(PriorityFn::LinearDecay { decay: 2.0 }));
        assert_eq!(f("linear_decay", json!({"decay": 0.1})), Ok(PriorityFn::LinearDecay { decay: 0.1 }));
        assert_eq!(
            f("decay_limit_randomization", json!({"decay": 2})),
            Ok(PriorityFn::DecayLimitRandomization { decay: 2.0, use_count_limit: 3, sigma: 0.0 })
        );
        assert_eq!(
            f("decay_limit_randomization", json!({"use_count_limit": 5.0, "sigma": 0.3})),
            Ok(PriorityFn::DecayLimitRandomization { decay: 2.0, use_count_limit: 5, sigma: 0.3 })
        );
        // The config's own default (`priority_fn_args: {decay: 2.0}`) is valid for both functions.
        for name in ["linear_decay", "decay_limit_randomization"] {
            let config = ReplayBufferConfig { priority_fn: name.to_owned(), ..ReplayBufferConfig::default() };
            assert!(ReplayBuffer::from_config(&config, 10, 0).is_ok(), "{name}");
        }
    }

    #[test]
    fn bad_settings_are_refused_naming_the_key() {
        let err = |priority_fn: &str, cooldown: Option<f64>, args: Value, capacity: u32| {
            ReplayBuffer::from_config(&config(priority_fn, cooldown, args), capacity, 0).unwrap_err().to_string()
        };
        let prefix = "buffer.trainer_input.experience_buffer.replay_buffer.";
        assert_eq!(
            err("exponential", None, json!({}), 10),
            format!(
                "{prefix}priority_fn: unknown priority function `exponential` (expected `linear_decay` or `decay_limit_randomization`)"
            )
        );
        assert_eq!(
            err("linear_decay", None, json!({"sigma": 1.0}), 10),
            format!("{prefix}priority_fn_args.sigma: `linear_decay` takes no argument `sigma` (it takes `decay`)")
        );
        assert_eq!(
            err("decay_limit_randomization", None, json!({"limit": 3}), 10),
            format!(
                "{prefix}priority_fn_args.limit: `decay_limit_randomization` takes no argument `limit` (it takes `decay`, `use_count_limit` and `sigma`)"
            )
        );
        assert_eq!(
            err("linear_decay", None, json!({"decay": "fast"}), 10),
            format!("{prefix}priority_fn_args.decay: expected a finite number, found a string")
        );
        assert_eq!(
            err("decay_limit_randomization", None, json!({"use_count_limit": 2.5}), 10),
            format!("{prefix}priority_fn_args.use_count_limit: expected a whole number, found 2.5")
        );
        assert!(err("linear_decay", Some(-1.0), json!({}), 10).starts_with(&format!("{prefix}reuse_cooldown_time:")));
        assert!(
            err("linear_decay", Some(f64::NAN), json!({}), 10).starts_with(&format!("{prefix}reuse_cooldown_time:"))
        );
        assert!(
            err("linear_decay", None, json!({}), 0).starts_with("buffer.trainer_input.experience_buffer.capacity:")
        );
    }

    #[test]
    fn an_invalid_experience_is_refused_and_nothing_is_stored() {
        let t0 = Instant::now();
        let mut buf = buffer("linear_decay", None, json!({}), 10);
        let mut experiences = step(0, 0, 1, 2);
        experiences[1].prompt_length = 99;
        assert!(buf.put(experiences, t0).is_err());
        assert!(buf.is_drained());
    }
}
