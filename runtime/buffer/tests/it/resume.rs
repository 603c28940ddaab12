//! Selectors with epochs and `total_steps`, and exact resume from a saved state.

use std::path::Path;

use serde_json::json;
use trinity_buffer::{SchedulerState, TaskScheduler, Taskset};
use trinity_config::buffer::{SelectorConfig, TasksetConfig};

fn taskset(name: &str, id: usize, rows: usize, selector: &str, seed: u64) -> Taskset {
    let config = TasksetConfig {
        name: name.into(),
        data_selector: Some(SelectorConfig { selector_type: selector.into(), seed, ..Default::default() }),
        ..Default::default()
    };
    let rows = (0..rows).map(|i| json!({"prompt": format!("{name}-{i}")}).as_object().unwrap().clone()).collect();
    Taskset::from_rows(&config, rows, id, false, Path::new("memory")).unwrap()
}

fn scheduler(selector: &str) -> TaskScheduler {
    let tasksets = vec![taskset("a", 0, 7, selector, 3), taskset("b", 1, 3, selector, 3)];
    TaskScheduler::new(tasksets, 4, 3, None).unwrap()
}

fn all_batches(s: &mut TaskScheduler) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    while let Some(batch) = s.next_batch().unwrap() {
        out.push(batch.iter().map(|t| t.prompt().unwrap()).collect());
    }
    out
}

#[test]
fn resume_continues_exactly_for_every_selector() {
    for selector in ["sequential", "shuffle", "random"] {
        let full = all_batches(&mut scheduler(selector));
        assert_eq!(full.len(), 7, "3 epochs of 10 rows in batches of 4: {selector}");
        for stop_after in [1, 3, 5] {
            let mut first = scheduler(selector);
            for _ in 0..stop_after {
                first.next_batch().unwrap().unwrap();
            }
            // The state goes through JSON, as it does through a checkpoint.
            let saved = serde_json::to_string(&first.state()).unwrap();
            drop(first);
            let mut resumed = scheduler(selector);
            resumed.restore(serde_json::from_str::<SchedulerState>(&saved).unwrap()).unwrap();
            let rest = all_batches(&mut resumed);
            assert_eq!(rest, full[stop_after..], "{selector} resumed after {stop_after} steps");
        }
    }
}

#[test]
fn shuffle_orders_differ_between_epochs_and_cover_every_row() {
    let mut s = TaskScheduler::new(vec![taskset("a", 0, 8, "shuffle", 42)], 8, 2, None).unwrap();
    let e1: Vec<usize> = s.next_batch().unwrap().unwrap().iter().map(|t| t.index).collect();
    let e2: Vec<usize> = s.next_batch().unwrap().unwrap().iter().map(|t| t.index).collect();
    assert_ne!(e1, e2);
    for epoch in [&e1, &e2] {
        let mut sorted = epoch.clone();
        sorted.sort();
        assert_eq!(sorted, (0..8).collect::<Vec<_>>());
    }
    assert!(s.next_batch().unwrap().is_none());
    assert_eq!(s.epoch(), 2);
}

#[test]
fn total_steps_overrides_epochs_and_batch_ids_count_steps() {
    let mut s = TaskScheduler::new(vec![taskset("a", 0, 5, "sequential", 0)], 2, 1, Some(4)).unwrap();
    assert_eq!(s.total_steps(), 4);
    let batches: Vec<_> = std::iter::from_fn(|| s.next_batch().unwrap()).collect();
    assert_eq!(batches.len(), 4);
    assert_eq!(batches.iter().map(|b| b[0].batch_id).collect::<Vec<_>>(), [1, 2, 3, 4]);
    let indices: Vec<usize> = batches.iter().flatten().map(|t| t.index).collect();
    assert_eq!(indices, [0, 1, 2, 3, 4, 0, 1, 2]);
}
