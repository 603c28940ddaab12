//! When the explorer may run and when weights move: Trinity-RFT's `sync_interval` / `sync_offset` semantics.
//!
//! Explore step `s` (1-based) needs weights that include `max(0, ⌊(s − 1 − offset) / interval⌋)` syncs; the
//! trainer publishes a sync after every `interval`-th train step. With interval 2 and offset 1 that gives
//! explorer 1-2-3, sync, 4-5, … and trainer 1-2, sync, 3-4, sync, …: the explorer runs `offset` steps ahead on
//! stale weights (one-step-off-policy with offset 1), and with offset 0 it waits for every sync (on-policy).

/// The sync plan of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncSchedule {
    pub interval: u64,
    pub offset: u64,
}

impl SyncSchedule {
    /// How many syncs the weights must include before explore step `step` (1-based) may start.
    pub fn required_syncs(&self, step: u64) -> u64 {
        let interval = self.interval.max(1);
        step.saturating_sub(1 + self.offset) / interval
    }

    /// Whether the trainer publishes new weights after train step `step` (1-based).
    pub fn syncs_after(&self, step: u64) -> bool {
        step.is_multiple_of(self.interval.max(1))
    }

    /// The most explore steps whose experiences wait in the buffer at once, the one being stored included, under
    /// [`next_action`]'s order: the explorer reaches step `k + offset` before publishing train step `k` runs.
    /// `trinity_config`'s runnable check refuses a buffer too small for it, with the same formula.
    pub fn steps_buffered(&self) -> u64 {
        self.offset + 1
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
/// A train step that publishes no weights changes nothing the explorer sees, so it runs as soon as its explore step
/// is stored, as Trinity-RFT's concurrent trainer would take the batch; a publishing train step waits until the
/// explorer cannot go on without it, so every explore step samples with exactly the weights the sync plan gives it
/// (the explorer runs ahead up to `offset` steps). The buffer then holds at most `offset + 1` steps'
/// experiences ([`SyncSchedule::steps_buffered`]) instead of a whole `sync_interval` of them.
pub fn next_action(schedule: &SyncSchedule, explored: u64, trained: u64, syncs: u64, total_steps: u64) -> Action {
    if trained < explored && !schedule.syncs_after(trained + 1) {
        Action::Train(trained + 1)
    } else if explored < total_steps && schedule.required_syncs(explored + 1) <= syncs {
        Action::Explore(explored + 1)
    } else if trained < explored {
        Action::Train(trained + 1)
    } else {
        Action::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The timeline a run produces, as `E1 E2 T1 S …`.
    fn timeline(interval: u64, offset: u64, total: u64) -> String {
        let schedule = SyncSchedule { interval, offset };
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
                    if schedule.syncs_after(s) {
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
                    syncs += u64::from(schedule.syncs_after(s));
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
                let schedule = SyncSchedule { interval, offset };
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
        let sparse = SyncSchedule { interval: 20, offset: 0 };
        assert_eq!(versions_and_backlog(explore_first, &sparse, 40).1, 20);
        assert_eq!(versions_and_backlog(next_action, &sparse, 40).1, 1);
    }

    #[test]
    fn every_explore_step_waits_for_its_required_syncs() {
        let schedule = SyncSchedule { interval: 3, offset: 2 };
        assert_eq!(schedule.required_syncs(1), 0);
        assert_eq!(schedule.required_syncs(3), 0);
        assert_eq!(schedule.required_syncs(5), 0);
        assert_eq!(schedule.required_syncs(6), 1);
        assert!(schedule.syncs_after(3) && !schedule.syncs_after(4));
    }
}
