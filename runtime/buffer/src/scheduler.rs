//! The task scheduler: batches of tasks per explore step from one or several training tasksets.
//!
//! Steps: `total_steps` if set, else `total_epochs × N / batch_size` (N = rows of all tasksets; a final partial
//! batch is dropped, as Trinity drops it for training). Each batch holds `batch_size` tasks.
//!
//! Mixing several tasksets — the choice made here is **proportional, shuffled per epoch** (Trinity's
//! `TasksetScheduler` does the same): one epoch is N draws; in it taskset `k` gets exactly `len_k` draws, at
//! positions given by a permutation of the membership list seeded by `(seed of the first taskset, epoch)`.
//! Within its share, each taskset draws rows with its own selector. So every epoch visits each row of every
//! taskset once (with `sequential`/`shuffle`), and a batch's mix follows the tasksets' sizes. Round-robin was
//! rejected: it over-samples small tasksets, which repeats their rows within an epoch.
//!
//! Resume: [`SchedulerState`] (serialisable) holds the step and the draw counters; [`TaskScheduler::restore`]
//! followed by [`TaskScheduler::next_batch`] yields exactly the batch the stopped run would have drawn next.

use serde::{Deserialize, Serialize};
use trinity_config::buffer::BufferConfig;

use crate::error::{BufferError, Result};
use crate::reader::Taskset;
use crate::selector::{DifficultyEstimator, PassRates, Selector, SelectorKind, mix, permutation};
use crate::task::Task;

/// Where a run stands; saved in checkpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulerState {
    /// Batches handed out so far (the last batch's `batch_id`).
    pub step: u64,
    /// Draws made over all tasksets.
    pub draws: u64,
    /// Draws made from each taskset, in taskset order.
    pub taskset_draws: Vec<u64>,
}

/// Hands out batches of training tasks.
#[derive(Debug)]
pub struct TaskScheduler {
    tasksets: Vec<Taskset>,
    selectors: Vec<Selector>,
    batch_size: usize,
    total_steps: u64,
    rows: usize,
    mix_seed: u64,
    /// Membership list of the last epoch asked for (several tasksets only).
    membership: Option<(u64, Vec<usize>)>,
    state: SchedulerState,
}

impl TaskScheduler {
    /// Loads the resolved config's training tasksets (`buffer.explorer_input.tasksets`).
    pub fn from_config(buffer: &BufferConfig) -> Result<TaskScheduler> {
        let tasksets = buffer
            .explorer_input
            .tasksets
            .iter()
            .chain(buffer.explorer_input.taskset.iter())
            .enumerate()
            .map(|(i, config)| Taskset::load(config, i, false))
            .collect::<Result<Vec<_>>>()?;
        TaskScheduler::new(tasksets, buffer.batch_size as usize, buffer.total_epochs, buffer.total_steps)
    }

    /// A scheduler over loaded tasksets; their `data_selector` picks each one's selector.
    pub fn new(
        tasksets: Vec<Taskset>,
        batch_size: usize,
        total_epochs: u32,
        total_steps: Option<u64>,
    ) -> Result<TaskScheduler> {
        let batch_size = batch_size.max(1);
        let rows: usize = tasksets.iter().map(Taskset::len).sum();
        let mut selectors = Vec::with_capacity(tasksets.len());
        for taskset in &tasksets {
            let selector =
                taskset.config.data_selector.clone().or(taskset.config.task_selector.clone()).unwrap_or_default();
            let kind = SelectorKind::parse(taskset.name(), &selector.selector_type)?;
            selectors.push(match kind {
                SelectorKind::DifficultyBased => Selector::difficulty_based(
                    taskset.name(),
                    difficulty_features(taskset, &selector.feature_keys)?,
                    selector.seed,
                    &selector.kwargs,
                )?,
                SelectorKind::OfflineEasy2Hard => {
                    if selector.feature_keys.is_empty() {
                        return Err(BufferError::SelectorArgs {
                            taskset: taskset.name().to_owned(),
                            problem: "offline_easy2hard needs feature_keys (row fields, higher = easier)".to_owned(),
                        });
                    }
                    Selector::offline_easy2hard(&feature_columns(taskset, &selector.feature_keys)?, selector.seed)
                }
                _ => Selector::new(kind, taskset.len(), selector.seed),
            });
        }
        let total_steps = match total_steps {
            Some(steps) => steps,
            None if rows < batch_size => return Err(BufferError::TooFewRows { rows, batch_size }),
            None => u64::from(total_epochs) * rows as u64 / batch_size as u64,
        };
        if rows == 0 {
            return Err(BufferError::TooFewRows { rows, batch_size });
        }
        let mix_seed = tasksets.first().and_then(|t| t.config.data_selector.as_ref().map(|s| s.seed)).unwrap_or(42);
        let state = SchedulerState { step: 0, draws: 0, taskset_draws: vec![0; tasksets.len()] };
        Ok(TaskScheduler { tasksets, selectors, batch_size, total_steps, rows, mix_seed, membership: None, state })
    }

    pub fn total_steps(&self) -> u64 {
        self.total_steps
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    pub fn tasksets(&self) -> &[Taskset] {
        &self.tasksets
    }

    /// The current epoch (0-based): draws made over rows of all tasksets.
    pub fn epoch(&self) -> u64 {
        self.state.draws / self.rows as u64
    }

    /// A copy of the position, to save in a checkpoint.
    pub fn state(&self) -> SchedulerState {
        self.state.clone()
    }

    /// Continues from a saved position; the tasksets must be the same ones (same count).
    pub fn restore(&mut self, state: SchedulerState) -> Result<()> {
        if state.taskset_draws.len() != self.tasksets.len() {
            return Err(BufferError::BadState {
                reason: format!(
                    "it has draw counts for {} tasksets, the config has {}",
                    state.taskset_draws.len(),
                    self.tasksets.len()
                ),
            });
        }
        if state.taskset_draws.iter().sum::<u64>() != state.draws {
            return Err(BufferError::BadState { reason: "taskset draw counts do not add up to `draws`".to_owned() });
        }
        self.state = state;
        Ok(())
    }

    /// The next batch of `batch_size` tasks (their `batch_id` is the new step number, from 1), or `None` once
    /// `total_steps` batches were handed out.
    pub fn next_batch(&mut self) -> Result<Option<Vec<Task>>> {
        if self.state.step >= self.total_steps {
            return Ok(None);
        }
        let step = self.state.step + 1;
        // Which taskset each draw of the batch belongs to, then each taskset's rows for its share at once (a
        // `difficulty_based` selector picks its share together, without repeats).
        let owners: Vec<usize> = (0..self.batch_size as u64).map(|i| self.taskset_of(self.state.draws + i)).collect();
        let mut picks: Vec<std::vec::IntoIter<usize>> = (0..self.tasksets.len())
            .map(|k| {
                let share = owners.iter().filter(|&&owner| owner == k).count();
                self.selectors[k].indices(self.state.taskset_draws[k], share).into_iter()
            })
            .collect();
        let mut batch = Vec::with_capacity(self.batch_size);
        for k in owners {
            // Each taskset's iterator holds exactly its share of the owners, so it never runs dry.
            let index = picks[k].next().unwrap_or(0);
            let mut task = self.tasksets[k].task(index)?;
            task.batch_id = step;
            batch.push(task);
            self.state.taskset_draws[k] += 1;
            self.state.draws += 1;
        }
        self.state.step = step;
        Ok(Some(batch))
    }

    /// Hands observed pass rates (the `pass_rate_calculator` operator's feedback) to the tasksets' selectors;
    /// only `difficulty_based` selectors learn from them. Call it after each explore step's pipeline, before the
    /// next [`TaskScheduler::next_batch`].
    pub fn feedback(&mut self, rates: &[PassRates]) -> Result<()> {
        for rate in rates {
            let (Some(selector), Some(taskset)) =
                (self.selectors.get_mut(rate.taskset_id), self.tasksets.get(rate.taskset_id))
            else {
                return Err(BufferError::BadState {
                    reason: format!("feedback names taskset {}, there are {}", rate.taskset_id, self.tasksets.len()),
                });
            };
            selector.feedback(taskset.name(), rate)?;
        }
        Ok(())
    }

    /// The selector of each taskset, in taskset order.
    pub fn selectors(&self) -> &[Selector] {
        &self.selectors
    }

    /// The `difficulty_based` selectors' beliefs, one entry per taskset (`None` for other selectors): save them
    /// with a checkpoint (serde) so that [`TaskScheduler::restore_beliefs`] resumes the selection exactly.
    pub fn beliefs(&self) -> Vec<Option<DifficultyEstimator>> {
        self.selectors.iter().map(|s| s.estimator().cloned()).collect()
    }

    /// Puts back beliefs saved by [`TaskScheduler::beliefs`]; they must be for the same tasksets.
    pub fn restore_beliefs(&mut self, saved: Vec<Option<DifficultyEstimator>>) -> Result<()> {
        if saved.len() != self.selectors.len() {
            return Err(BufferError::BadState {
                reason: format!("beliefs for {} tasksets, the config has {}", saved.len(), self.selectors.len()),
            });
        }
        for ((selector, taskset), beliefs) in self.selectors.iter_mut().zip(&self.tasksets).zip(saved) {
            if let Some(beliefs) = beliefs {
                selector.restore_estimator(taskset.name(), beliefs)?;
            }
        }
        Ok(())
    }

    /// Which taskset global draw `draw` belongs to.
    fn taskset_of(&mut self, draw: u64) -> usize {
        if self.tasksets.len() == 1 {
            return 0;
        }
        let rows = self.rows as u64;
        let epoch = draw / rows;
        let position = (draw % rows) as usize;
        if self.membership.as_ref().is_none_or(|(e, _)| *e != epoch) {
            let members: Vec<usize> =
                self.tasksets.iter().enumerate().flat_map(|(k, t)| std::iter::repeat_n(k, t.len())).collect();
            let order = permutation(members.len(), mix(self.mix_seed, epoch));
            self.membership = Some((epoch, order.into_iter().map(|i| members[i]).collect()));
        }
        self.membership.as_ref().map_or(0, |(_, list)| list[position])
    }
}

/// The two offline pass-rate columns a `difficulty_based` selector starts from, one `[weak, strong]` pair per row.
fn difficulty_features(taskset: &Taskset, keys: &[String]) -> Result<Vec<[f64; 2]>> {
    if keys.len() != 2 {
        return Err(BufferError::SelectorArgs {
            taskset: taskset.name().to_owned(),
            problem: format!(
                "difficulty_based needs exactly 2 feature_keys (offline pass rates of a weaker and a stronger \
                 model), found {}",
                keys.len()
            ),
        });
    }
    Ok(feature_columns(taskset, keys)?.into_iter().map(|row| [row[0], row[1]]).collect())
}

/// The numeric `keys` fields of every row of `taskset` (a selector's `feature_keys`).
fn feature_columns(taskset: &Taskset, keys: &[String]) -> Result<Vec<Vec<f64>>> {
    let value = |row: usize, key: &String| -> Result<f64> {
        let found = taskset.rows[row].get(key);
        found.and_then(serde_json::Value::as_f64).filter(|v| v.is_finite()).ok_or_else(|| BufferError::BadField {
            taskset: taskset.name().to_owned(),
            row,
            key: key.clone(),
            problem: match found {
                None => "is missing (a feature_keys column of the taskset's selector)".to_owned(),
                Some(other) => format!("must be a number (a feature_keys column), found {other}"),
            },
        })
    };
    (0..taskset.len()).map(|row| keys.iter().map(|key| value(row, key)).collect()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::Path;
    use trinity_config::buffer::{SelectorConfig, TasksetConfig};

    fn taskset(name: &str, id: usize, n: usize, selector: &str) -> Taskset {
        let config = TasksetConfig {
            name: name.into(),
            data_selector: Some(SelectorConfig { selector_type: selector.into(), ..Default::default() }),
            ..Default::default()
        };
        let rows = (0..n).map(|i| json!({"prompt": format!("{name}{i}")}).as_object().unwrap().clone()).collect();
        Taskset::from_rows(&config, rows, id, false, Path::new("mem")).unwrap()
    }

    fn ids(batch: &[Task]) -> Vec<(usize, usize)> {
        batch.iter().map(|t| (t.taskset_id, t.index)).collect()
    }

    #[test]
    fn steps_from_epochs_drop_the_partial_batch() {
        let s = TaskScheduler::new(vec![taskset("a", 0, 10, "sequential")], 3, 2, None).unwrap();
        assert_eq!(s.total_steps(), 6);
        let err = TaskScheduler::new(vec![taskset("a", 0, 2, "sequential")], 3, 1, None).unwrap_err();
        assert!(err.to_string().contains("fewer than batch_size 3"));
        // total_steps wins and may wrap over epochs.
        let mut s = TaskScheduler::new(vec![taskset("a", 0, 2, "sequential")], 3, 1, Some(2)).unwrap();
        assert_eq!(ids(&s.next_batch().unwrap().unwrap()), [(0, 0), (0, 1), (0, 0)]);
        assert_eq!(s.next_batch().unwrap().unwrap()[0].batch_id, 2);
        assert!(s.next_batch().unwrap().is_none());
    }

    #[test]
    fn mixing_is_proportional_per_epoch() {
        let tasksets = vec![taskset("a", 0, 6, "shuffle"), taskset("b", 1, 2, "sequential")];
        let mut s = TaskScheduler::new(tasksets, 4, 3, None).unwrap();
        assert_eq!(s.total_steps(), 6);
        let mut per_epoch = vec![Vec::new(); 3];
        let mut step = 0;
        while let Some(batch) = s.next_batch().unwrap() {
            per_epoch[step / 2].extend(ids(&batch));
            step += 1;
        }
        for epoch in per_epoch {
            let mut seen = epoch.clone();
            seen.sort();
            assert_eq!(seen, [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (1, 0), (1, 1)]);
        }
    }

    #[test]
    fn restore_rejects_a_state_for_other_tasksets() {
        let mut s = TaskScheduler::new(vec![taskset("a", 0, 4, "sequential")], 2, 1, None).unwrap();
        let bad = SchedulerState { step: 1, draws: 2, taskset_draws: vec![1, 1] };
        assert!(s.restore(bad).unwrap_err().to_string().contains("2 tasksets"));
        let bad = SchedulerState { step: 1, draws: 3, taskset_draws: vec![2] };
        assert!(s.restore(bad).is_err());
    }

    fn bots_taskset(rows: Vec<serde_json::Value>, feature_keys: &[&str], kwargs: serde_json::Value) -> Taskset {
        let config = TasksetConfig {
            name: "math".into(),
            data_selector: Some(SelectorConfig {
                selector_type: "difficulty_based".into(),
                feature_keys: feature_keys.iter().map(|k| (*k).to_owned()).collect(),
                kwargs: kwargs.as_object().cloned().unwrap_or_default(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let rows = rows.into_iter().map(|r| r.as_object().unwrap().clone()).collect();
        Taskset::from_rows(&config, rows, 0, false, Path::new("mem")).unwrap()
    }

    #[test]
    fn offline_easy2hard_orders_by_the_feature_columns() {
        let config = |keys: Vec<String>| TasksetConfig {
            name: "ts".into(),
            data_selector: Some(SelectorConfig {
                selector_type: "offline_easy2hard".into(),
                feature_keys: keys,
                ..Default::default()
            }),
            ..Default::default()
        };
        let rows: Vec<crate::Row> =
            [0.5, 0.9, 0.1].iter().map(|p| json!({"prompt": "p", "pass": p}).as_object().unwrap().clone()).collect();
        let ts = Taskset::from_rows(&config(vec!["pass".into()]), rows.clone(), 0, false, Path::new("mem")).unwrap();
        let mut s = TaskScheduler::new(vec![ts], 3, 1, None).unwrap();
        assert_eq!(ids(&s.next_batch().unwrap().unwrap()), [(0, 1), (0, 0), (0, 2)]);
        let no_keys = Taskset::from_rows(&config(Vec::new()), rows, 0, false, Path::new("mem")).unwrap();
        let err = TaskScheduler::new(vec![no_keys], 1, 1, None).unwrap_err().to_string();
        assert!(err.contains("offline_easy2hard needs feature_keys"), "{err}");
    }

    #[test]
    fn difficulty_based_needs_two_numeric_feature_columns() {
        let rows = vec![json!({"prompt": "p", "weak": 0.1, "strong": 0.9}), json!({"prompt": "q", "weak": 0.2})];
        let one_key = bots_taskset(rows.clone(), &["weak"], json!({}));
        let err = TaskScheduler::new(vec![one_key], 1, 1, None).unwrap_err().to_string();
        assert!(err.contains("exactly 2 feature_keys") && err.contains("`math`"), "{err}");
        let missing = bots_taskset(rows, &["weak", "strong"], json!({}));
        let err = TaskScheduler::new(vec![missing], 1, 1, None).unwrap_err().to_string();
        assert!(err.contains("row 1") && err.contains("strong"), "{err}");
    }

    #[test]
    fn difficulty_based_batches_follow_the_fed_back_pass_rates() {
        // Offline pass rates say every row is equally hard; the feedback then says row 2 and row 3 sit at the
        // 0.5 target and the others at 0 or 1.
        let rows: Vec<serde_json::Value> =
            (0..6).map(|i| json!({"prompt": format!("p{i}"), "weak": 0.5, "strong": 0.5})).collect();
        let kwargs = json!({"tau": 0, "target_reward": 0.5, "lamb": 0.1, "rho": 0.1});
        let mut s = TaskScheduler::new(vec![bots_taskset(rows, &["weak", "strong"], kwargs)], 2, 10, None).unwrap();
        let first = ids(&s.next_batch().unwrap().unwrap());
        assert_eq!(first.len(), 2);
        let rates =
            PassRates { taskset_id: 0, indices: vec![0, 1, 2, 3, 4, 5], values: vec![0.0, 1.0, 0.5, 0.5, 1.0, 0.0] };
        s.feedback(&[rates]).unwrap();
        assert_eq!(ids(&s.next_batch().unwrap().unwrap()), [(0, 2), (0, 3)]);
        assert_eq!(s.state().taskset_draws, [4]);
        let unknown = PassRates { taskset_id: 3, indices: vec![0], values: vec![0.5] };
        assert!(s.feedback(&[unknown]).unwrap_err().to_string().contains("taskset 3"));

        // A resumed scheduler given the saved position and beliefs draws what this one draws next.
        let (position, beliefs) = (s.state(), s.beliefs());
        let saved: Vec<Option<DifficultyEstimator>> =
            serde_json::from_str(&serde_json::to_string(&beliefs).unwrap()).unwrap();
        let rows: Vec<serde_json::Value> =
            (0..6).map(|i| json!({"prompt": format!("p{i}"), "weak": 0.5, "strong": 0.5})).collect();
        let kwargs = json!({"tau": 0, "target_reward": 0.5, "lamb": 0.1, "rho": 0.1});
        let mut resumed =
            TaskScheduler::new(vec![bots_taskset(rows, &["weak", "strong"], kwargs)], 2, 10, None).unwrap();
        resumed.restore(position).unwrap();
        resumed.restore_beliefs(saved).unwrap();
        assert_eq!(ids(&resumed.next_batch().unwrap().unwrap()), ids(&s.next_batch().unwrap().unwrap()));
        assert!(resumed.restore_beliefs(vec![None, None]).is_err());
    }
}
