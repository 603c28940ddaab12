//! SQLite persistence across processes and through kill -9.
//!
//! The crash test re-runs this test binary as a child that runs the same test with an environment variable
//! naming the database: the child takes the writer's part (`write_until_killed`), the parent kills it with SIGKILL
//! mid-stream and checks the database.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use trinity_buffer::{JsonlWriter, SqliteStore, read_experiences};

use crate::support::experience;

const CHILD_DB: &str = "TRINITY_BUFFER_TEST_CHILD_DB";
const GROUP: u64 = 4;
const LEASE: Duration = Duration::from_secs(60);

/// The child's part: write groups of 4 forever, announcing each commit, until the parent kills the process.
fn write_until_killed(db: &str) -> ! {
    let store = SqliteStore::open(std::path::Path::new(db)).unwrap();
    let mut jsonl = JsonlWriter::open(&std::path::Path::new(db).with_extension("jsonl")).unwrap();
    for step in 0.. {
        let batch: Vec<_> = (0..GROUP).map(|run| experience(step, 0, run, step)).collect();
        store.put_step("explorer", step, &batch, "{}").unwrap();
        jsonl.write_batch(&batch).unwrap();
        println!("committed {step}");
    }
    unreachable!("the step counter of a test writer does not run out")
}

#[test]
fn kill_9_loses_no_committed_experience_and_leaves_no_half_batch() {
    if let Ok(db) = std::env::var(CHILD_DB) {
        write_until_killed(&db);
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("buffer/experience_buffer.db");
    let reader = SqliteStore::open(&db).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "sqlite_crash::kill_9_loses_no_committed_experience_and_leaves_no_half_batch",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB, &db)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut last_committed = None;
    let mut consumed = Vec::new();
    for line in lines {
        let line = line.unwrap();
        if let Some(step) = line.strip_prefix("committed ") {
            let step: u64 = step.trim().parse().unwrap();
            last_committed = Some(step);
            // The trainer process reads while the explorer writes.
            if step.is_multiple_of(5)
                && let Some(batch) = reader.try_take("trainer", LEASE, step, GROUP as usize, None).unwrap()
            {
                consumed.extend(batch);
            }
            if step >= 30 {
                break;
            }
        }
    }
    child.kill().unwrap(); // SIGKILL on Unix: no destructor, no rollback handler runs in the child.
    child.wait().unwrap();
    let last_committed = last_committed.expect("the child committed batches");

    let reopened = SqliteStore::open(&db).unwrap();
    let total = reopened.total_count().unwrap();
    assert_eq!(reopened.explored_after("explorer", 0).unwrap().len() + 1, total / GROUP as usize, "a record per step");
    assert_eq!(total as u64 % GROUP, 0, "a batch is all there or not at all");
    assert!(total as u64 >= (last_committed + 1) * GROUP, "every announced commit is in the database");
    let unconsumed: Vec<_> = reopened.waiting().unwrap().into_iter().map(|(_, e)| e).collect();
    assert_eq!(unconsumed.len() + consumed.len(), total, "consumed and unconsumed rows partition the table");
    let mut steps: Vec<(u64, u64)> = consumed.iter().chain(&unconsumed).map(|e| (e.eid.batch, e.eid.run)).collect();
    steps.sort();
    let expected: Vec<(u64, u64)> = (0..total as u64 / GROUP).flat_map(|s| (0..GROUP).map(move |r| (s, r))).collect();
    assert_eq!(steps, expected, "no row lost, duplicated or read twice");
    for exp in &unconsumed {
        exp.validate().unwrap();
    }

    // The JSONL copy has every announced batch too (a torn last line, if any, is skipped).
    let copied = read_experiences(&db.with_extension("jsonl")).unwrap();
    assert!(copied.len() as u64 >= (last_committed + 1) * GROUP);
}

#[tokio::test]
async fn two_handles_share_one_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let explorer = SqliteStore::open(&db).unwrap();
    let trainer = SqliteStore::open(&db).unwrap();
    let writer = tokio::spawn(async move {
        for step in 0..5 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let batch: Vec<_> = (0..GROUP).map(|r| experience(step, 0, r, step)).collect();
            explorer.put_step("explorer", step, &batch, "{}").unwrap();
        }
    });
    let mut got = Vec::new();
    for step in 0..5 {
        loop {
            if let Some(batch) = trainer.try_take("trainer", LEASE, step, 4, None).unwrap() {
                got.extend(batch);
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    writer.await.unwrap();
    assert_eq!(got.len(), 20);
    assert_eq!(trainer.waiting_count().unwrap(), 0);
}
