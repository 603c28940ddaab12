//! The buffer's behaviour, written once and run on every backend it applies to: memory, SQLite, and PostgreSQL
//! (a throwaway server shared by the tests of this binary, one schema per test).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use trinity_config::buffer::{ExperienceBufferConfig, StorageType};

use super::ExperienceBuffer;
use crate::error::BufferError;
use crate::experience::{Eid, Experience};
use crate::store::ProducerState;
use crate::testing::PgServer;

/// One buffer's configuration and whatever must live as long as it.
struct Fixture {
    config: ExperienceBufferConfig,
    base: PathBuf,
    /// The in-memory buffer: one per process, so "another handle" is a clone of it.
    memory: std::sync::OnceLock<ExperienceBuffer>,
    _dir: tempfile::TempDir,
    _server: Option<Arc<PgServer>>,
}

impl Fixture {
    fn new(backend: &str, test: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut server = None;
        let (storage_type, path) = match backend {
            "memory" => (StorageType::Queue, None),
            "sqlite" => (StorageType::Sql, Some("sqlite:///buffer/exp.db".to_owned())),
            "postgres" => {
                let shared = PgServer::shared().unwrap();
                let url = shared.url();
                server = Some(shared);
                (StorageType::Sql, Some(url))
            }
            other => panic!("no backend {other}"),
        };
        let config = ExperienceBufferConfig {
            name: test.to_owned(),
            storage_type,
            path,
            capacity: 100,
            max_read_timeout: 0.05,
            ..Default::default()
        };
        Fixture { config, base: dir.path().to_owned(), memory: std::sync::OnceLock::new(), _dir: dir, _server: server }
    }

    /// A new handle on the buffer, as another process would open it.
    async fn open(&self) -> ExperienceBuffer {
        if let Some(buffer) = self.memory.get() {
            return buffer.clone();
        }
        let buffer = ExperienceBuffer::open(&self.config, &self.base).await.unwrap();
        if !buffer.is_persistent() {
            let _ = self.memory.set(buffer.clone());
        }
        buffer
    }
}

fn exp(step: u64, task: u64, version: u64) -> Experience {
    let mut e =
        Experience::single_turn(Eid { batch: step, task, run: 0, step: 0 }, vec![1, 2, 3], 1, vec![-0.5, -0.25]);
    e.model_version = version;
    e.reward = task as f64;
    e
}

fn step_rows(step: u64, n: u64) -> Vec<Experience> {
    (0..n).map(|task| exp(step, task, 0)).collect()
}

fn ids(batch: &[Experience]) -> Vec<(u64, u64)> {
    batch.iter().map(|e| (e.eid.batch, e.eid.task)).collect()
}

async fn idempotent_put(f: Fixture) {
    let buffer = f.open().await;
    buffer.put_step("explorer", 1, step_rows(1, 2), "{\"first\":true}").await.unwrap();
    // A retry (or a restarted explorer) stores the same step again, even with other rows: a no-op.
    buffer.put_step("explorer", 1, step_rows(1, 3), "{\"first\":false}").await.unwrap();
    assert_eq!(buffer.len().await.unwrap(), 2);
    let steps = buffer.explored_after("explorer", 0).await.unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!((steps[0].count, steps[0].state.as_str()), (2, "{\"first\":true}"));
    assert_eq!(buffer.producers().await.unwrap()[0].steps, 1);
}

/// An experience with routed experts (uint8 and uint16 ids) comes back as it went in.
async fn routed_experts_survive_the_store(f: Fixture) {
    let buffer = f.open().await;
    let mut small = exp(1, 0, 0);
    small.routed_experts = Some(crate::RoutedExperts { layers: 2, top_k: 2, ids: vec![0, 5, 3, 1, 7, 2, 255, 4] });
    let mut large = exp(1, 1, 0);
    large.routed_experts = Some(crate::RoutedExperts { layers: 1, top_k: 2, ids: vec![300, 2, 4095, 0] });
    let rows = vec![small, large];
    buffer.put_step("explorer", 1, rows.clone(), "{}").await.unwrap();
    let batch = buffer.try_take_for_step(2, None, 1).await.unwrap().unwrap();
    assert_eq!(batch, rows);
}

async fn two_producers_interleave(f: Fixture) {
    let buffer = f.open().await;
    let other = f.open().await;
    buffer.put_step("a", 1, step_rows(1, 2), "a1").await.unwrap();
    other.put_step("b", 1, vec![exp(1, 7, 0)], "b1").await.unwrap();
    buffer.put_step("a", 2, step_rows(2, 1), "a2").await.unwrap();
    other.put_step("b", 2, vec![exp(2, 7, 0)], "b2").await.unwrap();
    let a: Vec<_> = buffer.explored_after("a", 0).await.unwrap().into_iter().map(|s| (s.step, s.state)).collect();
    assert_eq!(a, [(1, "a1".to_owned()), (2, "a2".to_owned())]);
    assert_eq!(buffer.explored_after("b", 1).await.unwrap()[0].state, "b2");
    assert_eq!(buffer.last_explored("b").await.unwrap().unwrap().step, 2);
    assert_eq!(buffer.last_explored("c").await.unwrap(), None);
    // The trainer takes rows of all producers, oldest first.
    let batch = buffer.try_take_for_step(5, None, 1).await.unwrap().unwrap();
    assert_eq!(ids(&batch), [(1, 0), (1, 1), (1, 7), (2, 0), (2, 7)]);
    let producers: Vec<_> = buffer.producers().await.unwrap().into_iter().map(|p| (p.name, p.steps)).collect();
    assert_eq!(producers, [("a".to_owned(), 2), ("b".to_owned(), 2)]);
}

async fn a_short_take_takes_nothing(f: Fixture) {
    let buffer = f.open().await;
    buffer.put_step("explorer", 1, step_rows(1, 2), "{}").await.unwrap();
    assert_eq!(buffer.try_take_for_step(3, None, 1).await.unwrap(), None);
    assert_eq!(buffer.len().await.unwrap(), 2);
    assert_eq!(buffer.try_take_for_step(2, None, 1).await.unwrap().unwrap().len(), 2);
    assert!(buffer.is_empty().await.unwrap());
    let err = buffer.get_batch_for_step(1, Duration::from_millis(50), 2).await.unwrap_err();
    assert!(matches!(err, BufferError::Timeout { wanted: 1, available: 0, .. }), "{err}");
}

async fn stale_rows_are_skipped(f: Fixture) {
    let buffer = f.open().await;
    buffer.put_step("explorer", 1, vec![exp(1, 0, 1), exp(1, 1, 5), exp(1, 2, 6)], "{}").await.unwrap();
    let batch = buffer.try_take_for_step(2, Some(5), 1).await.unwrap().unwrap();
    assert_eq!(ids(&batch), [(1, 1), (1, 2)]);
    assert_eq!(buffer.len().await.unwrap(), 0);
    if buffer.is_persistent() {
        // Stale marks belong to the step that made them: a trainer resumed before it sees the row again.
        assert_eq!(buffer.release_after(0).await.unwrap(), 3);
        assert_eq!(buffer.len().await.unwrap(), 3);
    }
}

async fn take_release_commit(f: Fixture) {
    let buffer = f.open().await;
    for step in 1..=3 {
        buffer.put_step("explorer", step, step_rows(step, 2), &format!("{{\"pos\":{step}}}")).await.unwrap();
    }
    for step in 1..=3 {
        let batch = buffer.get_batch_for_step(2, Duration::from_secs(5), step).await.unwrap();
        assert_eq!(ids(&batch), [(step, 0), (step, 1)]);
    }
    // A claim retried after an unknown outcome gets the same rows; another size for the step is an error.
    assert_eq!(ids(&buffer.try_take_for_step(2, None, 2).await.unwrap().unwrap()), [(2, 0), (2, 1)]);
    let err = buffer.try_take_for_step(3, None, 2).await.unwrap_err();
    assert!(matches!(err, BufferError::StepClaimMismatch { held: 2, wanted: 3, .. }), "{err}");
    buffer.commit_through(1).await.unwrap();
    assert_eq!(buffer.committed_step().await.unwrap(), Some(1));
    // The trainer restarts (another process) from its checkpoint of step 1: steps 2 and 3 come back.
    let restarted = f.open().await;
    let explored = restarted.resume_after("explorer", 1).await.unwrap();
    assert_eq!(explored.iter().map(|s| (s.step, s.count)).collect::<Vec<_>>(), [(2, 2), (3, 2)]);
    assert_eq!(explored[1].state, "{\"pos\":3}");
    assert_eq!(restarted.len().await.unwrap(), 4);
    // Committed claims are final: resuming from before them releases nothing more.
    assert_eq!(restarted.release_after(0).await.unwrap(), 0);
    assert_eq!(ids(&restarted.try_take_for_step(2, None, 2).await.unwrap().unwrap()), [(2, 0), (2, 1)]);
    restarted.commit_through(3).await.unwrap();
    restarted.commit_through(2).await.unwrap();
    assert_eq!(restarted.committed_step().await.unwrap(), Some(3), "the committed step never goes back");
    assert_eq!(restarted.release_after(1).await.unwrap(), 0);
    assert_eq!(restarted.len().await.unwrap(), 2);
}

async fn consumers_are_separate(f: Fixture) {
    let a = f.open().await.with_consumer("trainer-a");
    let b = f.open().await.with_consumer("trainer-b");
    a.put_step("explorer", 1, step_rows(1, 4), "{}").await.unwrap();
    assert_eq!(ids(&a.try_take_for_step(2, None, 1).await.unwrap().unwrap()), [(1, 0), (1, 1)]);
    assert_eq!(ids(&b.try_take_for_step(2, None, 1).await.unwrap().unwrap()), [(1, 2), (1, 3)]);
    // Each consumer releases only its own claims.
    assert_eq!(b.release_after(0).await.unwrap(), 2);
    assert_eq!(a.len().await.unwrap(), 2);
    assert_eq!(a.committed_step().await.unwrap(), None);
}

async fn a_silent_consumers_claims_pass_to_another(f: Fixture) {
    let lease = Duration::from_millis(300);
    let a = f.open().await.with_consumer("trainer-a").with_lease(lease);
    let b = f.open().await.with_consumer("trainer-b").with_lease(lease);
    a.put_step("explorer", 1, step_rows(1, 2), "{}").await.unwrap();
    a.put_step("explorer", 2, step_rows(2, 2), "{}").await.unwrap();
    a.try_take_for_step(2, None, 1).await.unwrap().unwrap();
    a.commit_through(1).await.unwrap();
    a.try_take_for_step(2, None, 2).await.unwrap().unwrap();
    tokio::time::sleep(lease * 2).await;
    // `a` never takes its own lapsed claims (it would train them twice): it gets them back by release_after.
    assert_eq!(a.try_take_for_step(2, None, 3).await.unwrap(), None);
    tokio::time::sleep(lease * 2).await;
    // `b` takes the open claim of silent `a`, never its committed one.
    assert_eq!(ids(&b.try_take_for_step(2, None, 1).await.unwrap().unwrap()), [(2, 0), (2, 1)]);
    assert_eq!(b.try_take_for_step(2, None, 2).await.unwrap(), None);
    assert_eq!(a.release_after(1).await.unwrap(), 0, "the rows are b's now");
}

async fn producers_report_their_state(f: Fixture) {
    let buffer = f.open().await;
    let before = crate::store::unix_now() as u64;
    buffer.set_producer("a", ProducerState::Running).await.unwrap();
    buffer.put_step("b", 1, step_rows(1, 1), "{}").await.unwrap();
    buffer.put_step("b", 2, step_rows(2, 1), "{}").await.unwrap();
    buffer.set_producer("a", ProducerState::Finished).await.unwrap();
    let producers = buffer.producers().await.unwrap();
    let summary: Vec<_> = producers.iter().map(|p| (p.name.as_str(), p.state, p.steps)).collect();
    assert_eq!(summary, [("a", ProducerState::Finished, 0), ("b", ProducerState::Running, 2)]);
    for producer in &producers {
        assert!(producer.last_seen + 5 >= before && producer.last_seen <= before + 60, "{producer:?}");
    }
    // Another process sees the same.
    assert_eq!(f.open().await.producers().await.unwrap(), producers);
}

async fn a_full_buffer_holds_the_explorer(f: Fixture) {
    let mut f = f;
    f.config.capacity = 4;
    let buffer = f.open().await;
    buffer.put_step("explorer", 1, step_rows(1, 2), "{}").await.unwrap();
    buffer.put_step("explorer", 2, step_rows(2, 2), "{}").await.unwrap();
    let writer = {
        let buffer = buffer.clone();
        tokio::spawn(async move { buffer.put_step("explorer", 3, step_rows(3, 2), "{}").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "the put must wait while the buffer is full");
    buffer.get_batch_for_step(2, Duration::from_secs(5), 1).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), writer).await.unwrap().unwrap().unwrap();
    assert_eq!(buffer.len().await.unwrap(), 4);
}

async fn a_full_buffer_nobody_drains_fails_after_the_room_timeout(f: Fixture) {
    let mut f = f;
    f.config.capacity = 2;
    let buffer = f.open().await.with_room_timeout(Duration::from_millis(300));
    buffer.put_step("explorer", 1, step_rows(1, 2), "{}").await.unwrap();
    let error = buffer.put_step("explorer", 2, step_rows(2, 2), "{}").await.unwrap_err();
    assert!(matches!(error, BufferError::NoRoom { step: 2, incoming: 2, waiting: 2, capacity: 2, .. }), "{error}");
    let text = error.to_string();
    assert!(text.contains(&f.config.name) && text.contains("synchronizer.sync_timeout"), "{text}");
    // Nothing of the failed step was stored: once room is made, the same step goes in.
    assert!(buffer.explored_after("explorer", 1).await.unwrap().is_empty());
    buffer.get_batch_for_step(2, Duration::from_secs(5), 1).await.unwrap();
    buffer.put_step("explorer", 2, step_rows(2, 2), "{}").await.unwrap();
    assert_eq!(buffer.len().await.unwrap(), 2);
}

async fn experiences_survive_reopening(f: Fixture) {
    let buffer = f.open().await;
    buffer.put_step("explorer", 1, step_rows(1, 2), "{}").await.unwrap();
    buffer.put_step("explorer", 2, step_rows(2, 2), "{}").await.unwrap();
    assert_eq!(ids(&buffer.get_batch_for_step(2, Duration::from_secs(5), 1).await.unwrap()), [(1, 0), (1, 1)]);
    drop(buffer);
    let again = f.open().await;
    assert_eq!(again.len().await.unwrap(), 2);
    assert_eq!(again.last_explored("explorer").await.unwrap().unwrap().step, 2);
    let batch = again.get_batch_for_step(2, Duration::from_secs(5), 2).await.unwrap();
    assert_eq!(batch[0], exp(2, 0, 0), "payloads round-trip exactly");
}

/// `case: backend, ...;` → `mod case { #[tokio::test] async fn backend() }` running `case` on that backend.
macro_rules! suite {
    ($($case:ident: $($backend:ident),+;)+) => {
        $(
            mod $case {
                $(
                    #[tokio::test]
                    async fn $backend() {
                        let name = concat!(stringify!($case), "_", stringify!($backend));
                        super::$case(super::Fixture::new(stringify!($backend), name)).await;
                    }
                )+
            }
        )+
    };
}

suite! {
    idempotent_put: memory, sqlite, postgres;
    two_producers_interleave: memory, sqlite, postgres;
    routed_experts_survive_the_store: memory, sqlite, postgres;
    a_short_take_takes_nothing: memory, sqlite, postgres;
    stale_rows_are_skipped: memory, sqlite, postgres;
    take_release_commit: sqlite, postgres;
    consumers_are_separate: sqlite, postgres;
    a_silent_consumers_claims_pass_to_another: sqlite, postgres;
    producers_report_their_state: memory, sqlite, postgres;
    a_full_buffer_holds_the_explorer: memory, sqlite, postgres;
    a_full_buffer_nobody_drains_fails_after_the_room_timeout: memory, sqlite, postgres;
    experiences_survive_reopening: sqlite, postgres;
}

#[tokio::test]
async fn unsupported_paths_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = |storage_type, path: Option<&str>| ExperienceBufferConfig {
        storage_type,
        path: path.map(str::to_owned),
        ..Default::default()
    };
    let err =
        ExperienceBuffer::open(&config(StorageType::Sql, Some("mysql://u:p@db/x")), dir.path()).await.unwrap_err();
    assert!(err.to_string().contains("mysql://u:p@db/x"), "{err}");
    assert!(ExperienceBuffer::open(&config(StorageType::Sql, None), dir.path()).await.is_err());
    assert!(ExperienceBuffer::open(&config(StorageType::File, None), dir.path()).await.is_err());
}

#[tokio::test]
async fn a_memory_queue_keeps_a_jsonl_copy() {
    let dir = tempfile::tempdir().unwrap();
    let config = ExperienceBufferConfig { path: Some("copy/exp.jsonl".into()), ..Default::default() };
    let buffer = ExperienceBuffer::open(&config, dir.path()).await.unwrap();
    assert!(!buffer.is_persistent());
    buffer.put_step("explorer", 1, step_rows(1, 2), "{}").await.unwrap();
    buffer.put_step("explorer", 1, step_rows(1, 2), "{}").await.unwrap();
    assert_eq!(buffer.get_batch_for_step(2, Duration::from_millis(50), 1).await.unwrap().len(), 2);
    assert_eq!(crate::jsonl_writer::read_experiences(&dir.path().join("copy/exp.jsonl")).unwrap().len(), 2);
}
