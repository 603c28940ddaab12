//! What a web page or a stranger cannot do: post anything but JSON, post from another origin, reach a loopback
//! server under a foreign name, or call any endpoint without the API key when one is set.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use trinity_serve::ServeOptions;

use crate::helpers::*;

/// One request with exactly these headers (no `Host` unless given); the status and JSON body.
async fn send(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    let mut builder = hyper::Request::builder().method(method).uri(path);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let response = sender.send_request(builder.body(Full::new(Bytes::from(body.to_owned()))).unwrap()).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_page_cannot_post_and_a_foreign_host_is_not_answered() {
    let (server, sink) = start(tiny_rollout(2, 64), options("tiny")).await;
    let addr = server.local_addr();
    let host = addr.to_string();
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
    // What a page can send without a preflight: text/plain (or a form), from its own origin.
    let (s, b) =
        send(addr, "POST", "/v1/chat/completions", &[("host", &host), ("content-type", "text/plain")], &chat).await;
    assert_eq!((s, b["error"]["code"].clone()), (415, json!("unsupported_media_type")), "{b}");
    let page = [("host", host.as_str()), ("content-type", "application/json"), ("origin", "https://evil.example")];
    let (s, b) = send(addr, "POST", "/v1/chat/completions", &page, &chat).await;
    assert_eq!((s, b["error"]["code"].clone()), (403, json!("cross_site_request")), "{b}");
    let (s, _) = send(addr, "POST", "/commit", &[("host", &host), ("sec-fetch-site", "cross-site")], "").await;
    assert_eq!(s, 403);
    // DNS rebinding: the page's own name, resolved to 127.0.0.1.
    let rebound = format!("evil.example:{}", addr.port());
    let (s, b) = send(addr, "GET", "/v1/models", &[("host", &rebound)], "").await;
    assert_eq!((s, b["error"]["code"].clone()), (421, json!("misdirected_request")), "{b}");
    // An agent (no Origin, JSON) is answered; nothing above reached the recorder.
    let (s, b) =
        send(addr, "POST", "/v1/chat/completions", &[("host", &host), ("content-type", "application/json")], &chat)
            .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = send(addr, "POST", "/commit", &[("host", &host)], "").await;
    assert_eq!((s, b["committed"].clone()), (200, json!(0)), "{b}");
    server.shutdown().await.unwrap();
    assert!(sink.all().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_api_key_every_endpoint_needs_it() {
    let options = ServeOptions { api_keys: vec!["s3cret".into()], ..options("tiny") };
    let (server, _) = start(tiny_rollout(2, 64), options).await;
    let addr = server.local_addr();
    let host = addr.to_string();
    let json_body = ("content-type", "application/json");
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
    for (method, path, body) in [
        ("GET", "/v1/models", ""),
        ("GET", "/health", ""),
        ("GET", "/metrics", ""),
        ("POST", "/v1/chat/completions", chat.as_str()),
        ("POST", "/v1/completions", r#"{"prompt": "ab", "max_tokens": 2}"#),
        ("POST", "/feedback", r#"{"msg_ids": ["x"], "reward": 1}"#),
        ("POST", "/commit", "{}"),
    ] {
        for auth in [None, Some("Bearer wrong"), Some("s3cret")] {
            let mut headers = vec![("host", host.as_str()), json_body];
            headers.extend(auth.map(|a| ("authorization", a)));
            let (s, b) = send(addr, method, path, &headers, body).await;
            assert_eq!(
                (s, b["error"]["code"].clone()),
                (401, json!("invalid_api_key")),
                "{method} {path} {auth:?}: {b}"
            );
            assert_eq!(b["error"]["type"], "invalid_request_error");
        }
        let headers = [("host", host.as_str()), json_body, ("authorization", "Bearer s3cret")];
        let (s, b) = send(addr, method, path, &headers, body).await;
        // The unknown feedback id is the handler's own 404: the key let it through.
        let expected = if path == "/feedback" { 404 } else { 200 };
        assert_eq!(s, expected, "{method} {path}: {b}");
    }
    server.shutdown().await.unwrap();
}
