//! A client that disconnects stops costing decode steps: its request leaves the engine's batch.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::*;

/// Sends a request on a raw connection and returns the connection once `min_tokens` have been generated.
async fn send_raw(addr: std::net::SocketAddr, body: serde_json::Value) -> tokio::net::TcpStream {
    let body = body.to_string();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    stream
}

async fn wait_for(what: &str, deadline: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnecting_cancels_streamed_and_whole_requests() {
    let rollout = tiny_rollout(2, 4096);
    let (server, _) = start(rollout.clone(), options("tiny")).await;
    let addr = server.local_addr();
    let engine = rollout.engine().clone();
    for stream in [true, false] {
        let before = engine.stats();
        let body = json!({
            "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4000, "ignore_eos": true, "stream": stream,
        });
        let mut connection = send_raw(addr, body).await;
        wait_for("generation to start", Duration::from_secs(30), || {
            engine.stats().generated_tokens >= before.generated_tokens + 20
        })
        .await;
        if stream {
            // Read the first bytes of the event stream: the response is really streaming.
            let mut buffer = [0u8; 256];
            let n = connection.read(&mut buffer).await.unwrap();
            assert!(String::from_utf8_lossy(&buffer[..n]).starts_with("HTTP/1.1 200"));
        }
        drop(connection);
        wait_for("the engine to drop the request", Duration::from_secs(30), || {
            let now = engine.stats();
            now.cancelled_requests == before.cancelled_requests + 1 && now.running_sequences == 0
        })
        .await;
        let stopped_at = engine.stats().generated_tokens;
        assert!(stopped_at < before.generated_tokens + 4000, "stream {stream}: ran to the end");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(engine.stats().generated_tokens, stopped_at, "stream {stream}: still generating");
    }
    let (_, metrics) = get(addr, "/metrics").await;
    assert_eq!(metric(&metrics, "trinity_serve_cancelled_requests_total"), 2.0);
    assert_eq!(metric(&metrics, "trinity_serve_requests_in_flight"), 0.0);
    assert_eq!(metric(&metrics, "trinity_serve_pending_experiences"), 0.0, "cancelled replies are not recorded");
    assert!(metrics.contains("status=\"499\"} 2"), "{metrics}");
    server.shutdown().await.unwrap();
}
