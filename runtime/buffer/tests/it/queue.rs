//! The in-memory queue under concurrency: back-pressure, timeouts, no loss.

use std::time::Duration;

use trinity_buffer::{BufferError, ExperienceQueue};

use crate::support::experience;

#[tokio::test(start_paused = true)]
async fn a_full_queue_holds_the_explorer_until_the_trainer_reads() {
    let queue = ExperienceQueue::new("buffer", 8);
    queue.put_batch((0..8).map(|r| experience(1, 0, r, 0)).collect()).await.unwrap();
    let producer = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.put_batch((0..4).map(|r| experience(2, 0, r, 0)).collect()).await })
    };
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!producer.is_finished(), "the put must wait while the queue is full");
    assert_eq!(queue.len(), 8);
    let first = queue.get_batch(4, Duration::from_secs(1), None).await.unwrap();
    assert!(first.iter().all(|e| e.eid.batch == 1));
    producer.await.unwrap().unwrap();
    assert_eq!(queue.len(), 8);
    let rest = queue.get_batch(8, Duration::from_secs(1), None).await.unwrap();
    let batches: Vec<u64> = rest.iter().map(|e| e.eid.batch).collect();
    assert_eq!(batches, [1, 1, 1, 1, 2, 2, 2, 2], "FIFO across puts");
}

#[tokio::test(start_paused = true)]
async fn a_reader_waits_for_a_full_batch_and_keeps_partial_ones_on_timeout() {
    let queue = ExperienceQueue::new("buffer", 100);
    let reader = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.get_batch(6, Duration::from_secs(30), None).await })
    };
    for batch in 0..2 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        queue.put_batch((0..3).map(|r| experience(batch, 0, r, 0)).collect()).await.unwrap();
    }
    assert_eq!(reader.await.unwrap().unwrap().len(), 6);

    queue.put_batch((0..3).map(|r| experience(9, 0, r, 0)).collect()).await.unwrap();
    let err = queue.get_batch(6, Duration::from_secs(10), None).await.unwrap_err();
    assert!(matches!(err, BufferError::Timeout { available: 3, .. }), "{err}");
    assert_eq!(queue.len(), 3, "nothing collected before the timeout is lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_writers_and_one_reader_lose_nothing() {
    let queue = ExperienceQueue::new("buffer", 16);
    let mut writers = Vec::new();
    for w in 0..4u64 {
        let queue = queue.clone();
        writers.push(tokio::spawn(async move {
            for step in 0..25u64 {
                queue.put_batch((0..4).map(|r| experience(step, w, r, step)).collect()).await.unwrap();
            }
        }));
    }
    let mut seen = Vec::new();
    while seen.len() < 400 {
        seen.extend(queue.get_batch(8, Duration::from_secs(10), None).await.unwrap());
    }
    for w in writers {
        w.await.unwrap();
    }
    let mut uids: Vec<String> = seen.iter().map(|e| e.eid.uid()).collect();
    uids.sort();
    uids.dedup();
    assert_eq!(uids.len(), 400);
    assert!(queue.is_empty());
}

#[tokio::test]
async fn the_minimum_model_version_filters_stale_experiences() {
    let queue = ExperienceQueue::new("buffer", 100);
    queue.put_batch((0..4).map(|r| experience(1, 0, r, 1)).collect()).await.unwrap();
    queue.put_batch((0..4).map(|r| experience(2, 0, r, 2)).collect()).await.unwrap();
    let got = queue.get_batch(4, Duration::from_millis(50), Some(2)).await.unwrap();
    assert!(got.iter().all(|e| e.model_version == 2));
    assert_eq!(queue.stale_dropped(), 4);
}
