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

/// The next action of a run that alternates explorer and trainer on one device: explore whenever the
/// schedule allows it (the explorer runs ahead up to `offset` steps), otherwise train.
pub fn next_action(schedule: &SyncSchedule, explored: u64, trained: u64, syncs: u64, total_steps: u64) -> Action {
    if explored < total_steps && schedule.required_syncs(explored + 1) <= syncs {
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

    #[test]
    fn interval_two_offset_one_matches_trinity() {
        assert_eq!(timeline(2, 1, 6), "E1 E2 E3 T1 T2 S E4 E5 T3 T4 S E6 T5 T6 S");
    }

    #[test]
    fn offset_zero_is_on_policy() {
        assert_eq!(timeline(1, 0, 3), "E1 T1 S E2 T2 S E3 T3 S");
        assert_eq!(timeline(2, 0, 4), "E1 E2 T1 T2 S E3 E4 T3 T4 S");
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
