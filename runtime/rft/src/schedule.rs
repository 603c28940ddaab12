//! When the explorer may run and when weights move: Trinity-RFT's `sync_interval` / `sync_offset` semantics,
//! with 0.6.0's separate `explorer_sync_interval` (`ei`) and `trainer_sync_interval` (`ti`).
//!
//! The trainer publishes after every `ti`-th train step. The explorer syncs after explore step `n` when `n > offset`
//! and `(n − offset)` is a multiple of `ei` (Trinity-RFT's `need_sync`), so explore step `s` (1-based) comes after
//! `⌊(s − 1 − offset) / ei⌋` syncs. Its `j`-th sync takes the weights of train step `⌊j·ei / ti⌋·ti`: the newest the
//! trainer published from the explore steps before the sync point, less the `offset` the explorer runs ahead. With
//! one interval 2 and offset 1 that gives explorer 1-2-3, sync, 4-5, … and trainer 1-2, sync, 3-4, sync, …: the
//! explorer runs `offset` steps ahead on stale weights (one-step-off-policy with offset 1), and with offset 0 it
//! waits for every sync (on-policy).
//!
//! Trinity-RFT's explorer, running beside its trainer, takes whatever is newest when it reaches a sync point; one
//! process that alternates the two needs a rule, and this one is the plan trinity ran before the intervals split,
//! which it still is when they are equal. Every sync takes newer weights than the one before only when `ei ≥ ti`;
//! with `ei < ti` some of Trinity-RFT's `fixed` syncs wait for weights that come after the steps the explorer would
//! have to explore first, until `sync_timeout`, so the config crate refuses that where the explorer waits.

use trinity_config::synchronizer::SynchronizerConfig;

/// The sync plan of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncSchedule {
    /// `explorer_sync_interval`: explore steps between the explorer's syncs.
    pub explorer_interval: u64,
    /// `trainer_sync_interval`: train steps between the trainer's publishes.
    pub trainer_interval: u64,
    pub offset: u64,
}

impl SyncSchedule {
    /// The plan of `synchronizer` (each interval unset is `sync_interval`).
    pub fn of(synchronizer: &SynchronizerConfig) -> SyncSchedule {
        SyncSchedule {
            explorer_interval: u64::from(synchronizer.explorer_interval()),
            trainer_interval: u64::from(synchronizer.trainer_interval()),
            offset: u64::from(synchronizer.sync_offset),
        }
    }

    /// One interval for both sides.
    #[cfg(test)]
    fn equal(interval: u64, offset: u64) -> SyncSchedule {
        SyncSchedule { explorer_interval: interval, trainer_interval: interval, offset }
    }

    /// How many syncs the explorer makes before explore step `step` (1-based).
    pub fn required_syncs(&self, step: u64) -> u64 {
        step.saturating_sub(1 + self.offset) / self.explorer_interval.max(1)
    }

    /// The train step whose weights the explorer's `sync`-th sync (1-based) takes.
    pub fn version_of_sync(&self, sync: u64) -> u64 {
        let trainer = self.trainer_interval.max(1);
        sync * self.explorer_interval.max(1) / trainer * trainer
    }

    /// Whether the trainer publishes new weights after train step `step` (1-based).
    pub fn publishes_after(&self, step: u64) -> bool {
        step.is_multiple_of(self.trainer_interval.max(1))
    }

    /// Whether one of the explorer's syncs takes the weights of train step `step`: in one process, the steps after
    /// which the weights go into the engine.
    pub fn loads_after(&self, step: u64) -> bool {
        if step == 0 || !self.publishes_after(step) {
            return false;
        }
        // The first sync whose version reaches `step`.
        let sync = step.div_ceil(self.explorer_interval.max(1));
        self.version_of_sync(sync) == step
    }

    /// The most explore steps whose experiences wait in the buffer at once, the one being stored included, under
    /// [`next_action`]'s order. The config crate owns the formula ([`trinity_config::synchronizer::steps_buffered`]):
    /// its runnable check refuses a buffer too small for the same number.
    pub fn steps_buffered(&self) -> u64 {
        trinity_config::synchronizer::steps_buffered(self.explorer_interval, self.trainer_interval, self.offset)
    }
}

/// What a single-device run does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Run explore step N.
    Explore(u64),
    /// Run train step N.
    Train(u64),
    /// Nothing is left.
    Done,
}

/// The next action of a run that alternates explorer and trainer on one device.
///
/// A train step whose weights no sync takes changes nothing the explorer sees, so it runs as soon as its explore
/// step is stored, as Trinity-RFT's concurrent trainer would take the batch; one whose weights a sync takes waits
/// until the explorer cannot go on without it, so every explore step samples with exactly the weights the sync plan
/// gives it (the explorer runs ahead up to `offset` steps). The buffer then holds at most
/// [`SyncSchedule::steps_buffered`] steps' experiences instead of a whole interval of them.
pub fn next_action(schedule: &SyncSchedule, explored: u64, trained: u64, syncs: u64, total_steps: u64) -> Action {
    if trained < explored && !schedule.loads_after(trained + 1) {
        Action::Train(trained + 1)
    } else if explored < total_steps && schedule.required_syncs(explored + 1) <= syncs {
        Action::Explore(explored + 1)
    } else if trained < explored {
        Action::Train(trained + 1)
    } else {
        Action::Done
    }
}

/// The next action of a one-device run with `sync_style: fully_async`: explorer and trainer take turns, so a batch
/// is in flight from its explore step until its train step. The explorer runs while fewer than `max_inflight`
/// batches are in flight and never waits for weights; the trainer takes the oldest batch, and its weights go into
/// the engine after every `trainer_sync_interval`-th step ([`SyncSchedule::publishes_after`]), as soon as they exist.
pub fn next_action_fully_async(max_inflight: u64, explored: u64, trained: u64, total_steps: u64) -> Action {
    if explored < total_steps && explored - trained < max_inflight.max(1) {
        Action::Explore(explored + 1)
    } else if trained < explored {
        Action::Train(trained + 1)
    } else {
        Action::Done
    }
}

/// What a one-device run reading fixed-size train batches does next (`modes/both/fixed.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixedAction {
    /// Run train step N on the batch just read.
    Train(u64),
    /// Run explore step N.
    Explore(u64),
    /// The explorer is at a sync point: take the trainer's newest weights.
    Sync,
    /// Nothing is left.
    Done,
}

/// The next action of a one-device run whose train steps read fixed-size batches in arrival order: train whenever
/// a full batch waits (`batch_ready`) and `train_limit` allows, as Trinity-RFT's trainer takes a batch as soon as
/// its queue can fill one; else explore while the sync plan allows, syncing at each of the explorer's sync points
/// ([`SyncSchedule::required_syncs`]); done once the limit is reached, or the tasksets are used up and no full
/// batch waits.
pub fn next_action_fixed(
    schedule: &SyncSchedule,
    batch_ready: bool,
    (explored, explore_steps): (u64, u64),
    (trained, train_limit): (u64, u64),
    syncs: u64,
) -> FixedAction {
    if trained < train_limit && batch_ready {
        FixedAction::Train(trained + 1)
    } else if trained >= train_limit || explored >= explore_steps {
        FixedAction::Done
    } else if schedule.required_syncs(explored + 1) <= syncs {
        FixedAction::Explore(explored + 1)
    } else {
        FixedAction::Sync
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The timeline a run produces, as `E1 E2 T1 S …`.
    fn timeline(interval: u64, offset: u64, total: u64) -> String {
        let schedule = SyncSchedule::equal(interval, offset);
        let (mut explored, mut trained, mut syncs) = (0, 0, 0);
        let mut out = Vec::new();
        loop {
            match next_action(&schedule, explored, trained, syncs, total) {
                Action::Explore(s) => {
                    explored = s;
                    out.push(format!("E{s}"));
                }
                Action::Train(s) => {
                    trained = s;
                    out.push(format!("T{s}"));
                    if schedule.loads_after(s) {
                        syncs += 1;
                        out.push("S".to_owned());
                    }
                }
                Action::Done => break,
            }
        }
        out.join(" ")
    }

    /// The order before this one explored whenever the plan allowed: the reference for which weights each explore
    /// step samples with.
    fn explore_first(schedule: &SyncSchedule, explored: u64, trained: u64, syncs: u64, total: u64) -> Action {
        if explored < total && schedule.required_syncs(explored + 1) <= syncs {
            Action::Explore(explored + 1)
        } else if trained < explored {
            Action::Train(trained + 1)
        } else {
            Action::Done
        }
    }

    type Next = fn(&SyncSchedule, u64, u64, u64, u64) -> Action;

    /// The syncs each explore step samples after, and the most steps buffered when one is stored.
    fn versions_and_backlog(next: Next, schedule: &SyncSchedule, total: u64) -> (Vec<u64>, u64) {
        let (mut explored, mut trained, mut syncs, mut backlog) = (0, 0, 0, 0);
        let mut versions = Vec::new();
        loop {
            match next(schedule, explored, trained, syncs, total) {
                Action::Explore(s) => {
                    explored = s;
                    versions.push(syncs);
                    backlog = backlog.max(explored - trained);
                }
                Action::Train(s) => {
                    trained = s;
                    syncs += u64::from(schedule.loads_after(s));
                }
                Action::Done => return (versions, backlog),
            }
        }
    }

    #[test]
    fn interval_two_offset_one_matches_trinity() {
        // Explore steps 1-3 sample with the first weights, 4-5 after the first sync, 6 after the second.
        assert_eq!(timeline(2, 1, 6), "E1 T1 E2 E3 T2 S T3 E4 E5 T4 S T5 E6 T6 S");
    }

    #[test]
    fn offset_zero_is_on_policy() {
        assert_eq!(timeline(1, 0, 3), "E1 T1 S E2 T2 S E3 T3 S");
        assert_eq!(timeline(2, 0, 4), "E1 T1 E2 T2 S E3 T3 E4 T4 S");
    }

    #[test]
    fn every_explore_step_samples_with_the_weights_the_plan_gives_it_and_the_buffer_holds_offset_plus_one_steps() {
        for interval in 1..=6 {
            for offset in 0..=4 {
                let schedule = SyncSchedule::equal(interval, offset);
                let (versions, backlog) = versions_and_backlog(next_action, &schedule, 30);
                let (reference, _) = versions_and_backlog(explore_first, &schedule, 30);
                assert_eq!(versions, reference, "interval {interval}, offset {offset}");
                assert_eq!(versions.len(), 30);
                for (i, version) in versions.iter().enumerate() {
                    assert_eq!(*version, schedule.required_syncs(i as u64 + 1), "interval {interval}, offset {offset}");
                }
                assert_eq!(backlog, schedule.steps_buffered(), "interval {interval}, offset {offset}");
            }
        }
        // Trinity-RFT's GSM8K examples sync every 20 steps: the buffer held 20 steps before the first train step.
        let sparse = SyncSchedule::equal(20, 0);
        assert_eq!(versions_and_backlog(explore_first, &sparse, 40).1, 20);
        assert_eq!(versions_and_backlog(next_action, &sparse, 40).1, 1);
    }

    #[test]
    fn every_explore_step_waits_for_its_required_syncs() {
        let schedule = SyncSchedule::equal(3, 2);
        assert_eq!(schedule.required_syncs(1), 0);
        assert_eq!(schedule.required_syncs(3), 0);
        assert_eq!(schedule.required_syncs(5), 0);
        assert_eq!(schedule.required_syncs(6), 1);
        assert!(schedule.loads_after(3) && !schedule.loads_after(4));
        assert!(schedule.publishes_after(3) && !schedule.publishes_after(4));
    }

    #[test]
    fn fully_async_keeps_the_batches_in_flight_and_takes_every_published_version() {
        let schedule = SyncSchedule { explorer_interval: 1, trainer_interval: 1, offset: 0 };
        let (mut explored, mut trained, mut version) = (0, 0, 0);
        let mut out = Vec::new();
        loop {
            match next_action_fully_async(2, explored, trained, 4) {
                Action::Explore(s) => {
                    explored = s;
                    out.push(format!("E{s}@{version}"));
                }
                Action::Train(s) => {
                    trained = s;
                    if schedule.publishes_after(s) {
                        version = s;
                    }
                    out.push(format!("T{s}"));
                }
                Action::Done => break,
            }
        }
        assert_eq!(out.join(" "), "E1@0 E2@0 T1 E3@1 T2 E4@2 T3 T4");
        assert_eq!(next_action_fully_async(1, 1, 0, 4), Action::Train(1), "one batch in flight is on-policy");
    }

    /// The weights (train step) each explore step samples with and the most steps buffered, when the engine takes
    /// the trainer's weights after every train step that [`SyncSchedule::loads_after`] names.
    fn sampled_versions(schedule: &SyncSchedule, total: u64) -> (Vec<u64>, u64) {
        let (mut explored, mut trained, mut syncs, mut backlog, mut version) = (0, 0, 0, 0, 0);
        let mut versions = Vec::new();
        loop {
            match next_action(schedule, explored, trained, syncs, total) {
                Action::Explore(s) => {
                    explored = s;
                    versions.push(version);
                    backlog = backlog.max(explored - trained);
                }
                Action::Train(s) => {
                    trained = s;
                    if schedule.loads_after(s) {
                        syncs += 1;
                        version = s;
                    }
                }
                Action::Done => return (versions, backlog),
            }
        }
    }

    #[test]
    fn separate_intervals_sync_where_trinity_rft_does_and_take_the_planned_weights() {
        // Explorer every 3 steps, trainer every 2: the explorer syncs after explore steps 3, 6, 9 (0.6.0's
        // `need_sync`) and takes the weights of train steps 2, 6, 8 (the newest published from the steps before).
        let schedule = SyncSchedule { explorer_interval: 3, trainer_interval: 2, offset: 0 };
        assert_eq!(
            (1..=10).filter(|&s| schedule.required_syncs(s + 1) > schedule.required_syncs(s)).collect::<Vec<_>>(),
            [3, 6, 9]
        );
        assert_eq!((1..=3).map(|j| schedule.version_of_sync(j)).collect::<Vec<_>>(), [2, 6, 8]);
        assert_eq!((1..=10).filter(|&t| schedule.publishes_after(t)).collect::<Vec<_>>(), [2, 4, 6, 8, 10]);
        assert_eq!((1..=10).filter(|&t| schedule.loads_after(t)).collect::<Vec<_>>(), [2, 6, 8]);
        let (versions, _) = sampled_versions(&schedule, 10);
        assert_eq!(versions, [0, 0, 0, 2, 2, 2, 6, 6, 6, 8]);
        // Explorer every 2 steps, trainer every step, one step ahead.
        let ahead = SyncSchedule { explorer_interval: 2, trainer_interval: 1, offset: 1 };
        assert_eq!(sampled_versions(&ahead, 7).0, [0, 0, 0, 2, 2, 4, 4]);
        for explorer in 1..=6 {
            for trainer in 1..=explorer {
                for offset in 0..=3 {
                    let schedule = SyncSchedule { explorer_interval: explorer, trainer_interval: trainer, offset };
                    let (versions, backlog) = sampled_versions(&schedule, 40);
                    assert_eq!(versions.len(), 40);
                    for (i, version) in versions.iter().enumerate() {
                        let syncs = schedule.required_syncs(i as u64 + 1);
                        let planned = if syncs == 0 { 0 } else { schedule.version_of_sync(syncs) };
                        assert_eq!(*version, planned, "{schedule:?}, step {}", i + 1);
                    }
                    assert_eq!(backlog, schedule.steps_buffered(), "{schedule:?}");
                    let config = SynchronizerConfig {
                        explorer_sync_interval: Some(explorer as u32),
                        trainer_sync_interval: Some(trainer as u32),
                        sync_offset: offset as u32,
                        ..SynchronizerConfig::default()
                    };
                    assert_eq!(config.steps_buffered(2), backlog, "the config crate's capacity check agrees");
                }
            }
        }
    }

    /// The timeline of a fixed-size run: `steps` explore steps making `made(step)` experiences each, batches of
    /// `per_batch`, `E1(16) T1 S …` with what waits after each action.
    fn fixed_timeline(schedule: &SyncSchedule, made: impl Fn(u64) -> u64, per_batch: u64, steps: u64) -> String {
        fixed_timeline_to(schedule, made, per_batch, steps, u64::MAX)
    }

    fn fixed_timeline_to(
        schedule: &SyncSchedule,
        made: impl Fn(u64) -> u64,
        per_batch: u64,
        steps: u64,
        train_steps: u64,
    ) -> String {
        let (mut explored, mut trained, mut syncs, mut waiting, mut version) = (0, 0, 0, 0, 0);
        let mut out = Vec::new();
        loop {
            match next_action_fixed(schedule, waiting >= per_batch, (explored, steps), (trained, train_steps), syncs) {
                FixedAction::Train(s) => {
                    trained = s;
                    waiting -= per_batch;
                    out.push(format!("T{s}({waiting})"));
                }
                FixedAction::Explore(s) => {
                    explored = s;
                    waiting += made(s);
                    out.push(format!("E{s}@{version}({waiting})"));
                }
                FixedAction::Sync => {
                    syncs += 1;
                    version = trained;
                    out.push("S".to_owned());
                }
                FixedAction::Done => return out.join(" "),
            }
        }
    }

    #[test]
    fn fixed_size_batches_read_in_arrival_order_and_sync_at_the_explorers_sync_points() {
        // 16 experiences a step, batches of 20 (Trinity's RULER example: 768 rollouts, 960 a train step), sync
        // every step: the surplus is carried over, and a sync with no train step before it keeps the weights.
        let every = SyncSchedule::equal(1, 0);
        assert_eq!(
            fixed_timeline(&every, |_| 16, 20, 5),
            "E1@0(16) S E2@0(32) T1(12) S E3@1(28) T2(8) S E4@2(24) T3(4) S E5@3(20) T4(0)"
        );
        // Every second step, one step ahead: explore steps 1-3 sample with the first weights, 4-5 with step 2's.
        let ahead = SyncSchedule::equal(2, 1);
        assert_eq!(
            fixed_timeline(&ahead, |_| 16, 20, 6),
            "E1@0(16) E2@0(32) T1(12) E3@0(28) T2(8) S E4@2(24) T3(4) E5@2(20) T4(0) S E6@4(16)"
        );
        // Steps that make more than a batch (a judge's experiences on top): two train steps after one explore step.
        assert_eq!(fixed_timeline(&every, |s| if s == 1 { 44 } else { 4 }, 20, 2), "E1@0(44) T1(24) T2(4) S E2@2(8)");
        // trainer.total_steps stops the run at its train step.
        assert_eq!(fixed_timeline_to(&every, |_| 16, 20, 5, 2), "E1@0(16) S E2@0(32) T1(12) S E3@1(28) T2(8)");
    }
}
