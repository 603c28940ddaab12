//! How many large requests are read and handled at once.
//!
//! The body limit bounds what one request may cost (its body, the JSON parsed from it, the prompt rendered from
//! that), but not how many such requests run together: thirty clients each sending a body just under the limit
//! would cost thirty times as much. So a request whose body is large (declared over [`LARGE_REQUEST_BYTES`], or
//! of undeclared length) waits for one of [`LARGE_REQUESTS_AT_ONCE`] permits before its body is read, and holds
//! it until its response is ready; a waiting request holds only its connection. Ordinary requests, whose bodies
//! are kilobytes, never wait.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::Response;
use tokio::sync::Semaphore;

/// A body above this is large. Chat requests with long histories stay far below it.
pub(crate) const LARGE_REQUEST_BYTES: usize = 1 << 20;

/// Large requests handled at once: enough to keep both sides of a slow client busy, few enough that their
/// memory is a small multiple of the body limit.
pub(crate) const LARGE_REQUESTS_AT_ONCE: usize = 2;

/// The permits large requests share.
pub(crate) fn permits() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(LARGE_REQUESTS_AT_ONCE))
}

fn is_large(headers: &HeaderMap) -> bool {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<usize>().ok());
    match declared {
        Some(length) => length > LARGE_REQUEST_BYTES,
        None => headers.contains_key(header::TRANSFER_ENCODING),
    }
}

/// Middleware: a large request runs once it holds a permit.
pub(crate) async fn bound(State(permits): State<Arc<Semaphore>>, request: Request, next: Next) -> Response {
    if !is_large(request.headers()) {
        return next.run(request).await;
    }
    // The semaphore is never closed, so `acquire` cannot fail; were it closed, the request would run unbounded
    // rather than be refused.
    let _permit = permits.acquire().await.ok();
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use axum::Router;
    use axum::body::Body;
    use axum::routing::post;
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn large_requests_wait_for_a_permit_and_small_ones_do_not() {
        #[derive(Default)]
        struct Seen {
            now: AtomicUsize,
            most: AtomicUsize,
        }
        let seen = Arc::new(Seen::default());
        let handler = {
            let seen = Arc::clone(&seen);
            move || {
                let seen = Arc::clone(&seen);
                async move {
                    let now = seen.now.fetch_add(1, Ordering::SeqCst) + 1;
                    seen.most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    seen.now.fetch_sub(1, Ordering::SeqCst);
                }
            }
        };
        let app = Router::new().route("/", post(handler)).layer(axum::middleware::from_fn_with_state(permits(), bound));
        let send = |length: usize| {
            let app = app.clone();
            async move {
                let request = Request::post("/")
                    .header(header::CONTENT_LENGTH, length.to_string())
                    .body(Body::from(vec![b' '; length]))
                    .unwrap();
                app.oneshot(request).await.unwrap().status()
            }
        };
        let large: Vec<_> = (0..6).map(|_| tokio::spawn(send(LARGE_REQUEST_BYTES + 1))).collect();
        for task in large {
            assert!(task.await.unwrap().is_success());
        }
        assert_eq!(seen.most.load(Ordering::SeqCst), LARGE_REQUESTS_AT_ONCE);
        seen.most.store(0, Ordering::SeqCst);
        let small: Vec<_> = (0..6).map(|_| tokio::spawn(send(1024))).collect();
        for task in small {
            assert!(task.await.unwrap().is_success());
        }
        assert_eq!(seen.most.load(Ordering::SeqCst), 6, "small requests run together");
    }
}
