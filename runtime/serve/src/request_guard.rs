//! Which requests the server answers: addressed to it by a name it listens as, carrying the API key when one is
//! set, and, for a POST, JSON sent by something other than a web page of another site.
//!
//! Every HTTP surface on the user's machine is reachable from any web page the user opens, so three attacks are
//! closed here before a handler (or the body reader) runs:
//!
//! - **Cross-site requests.** A page can make the browser send a "simple" POST (`text/plain` body, a form,
//!   `fetch(..., {mode: "no-cors"})`) to `127.0.0.1:8010` without a CORS preflight; it cannot read the answer,
//!   but it could reward and commit experiences or make the engine generate. So a POST with a body must carry
//!   `Content-Type: application/json` (which a simple request cannot), and a POST from a browser (it sends
//!   `Origin`, and `Sec-Fetch-Site` where it has fetch metadata) must come from this server's own origin, which
//!   serves no pages: in effect, browsers are refused and agents (the `openai` clients, `curl`), which send no
//!   `Origin`, are not. CORS is never granted.
//! - **DNS rebinding.** A name the attacker controls can be made to resolve to 127.0.0.1, making the server
//!   same-origin with the attacker's page; the only trace is the `Host` header, which then names the attacker's
//!   domain. So on loopback every request needs a `Host` whose name is `localhost` or a loopback IP (421
//!   otherwise). Its port is not checked: a rebinding attacker cannot choose the name, whatever the port, while
//!   an SSH tunnel (`-L 9000:127.0.0.1:8010`) or a local proxy in front of the server legitimately sends its
//!   own. Listening on another address the server is meant to be reached by any name the network gives it (a
//!   container name, a host name), and the API key is what protects it.
//! - **Anyone on the network.** With an API key (`TRINITY_SERVE_API_KEY` in mode `serve`) every request, on
//!   every endpoint, must carry `Authorization: Bearer <key>`, as OpenAI's API does (401 otherwise).
//!
//! Refusals are OpenAI-style JSON errors: 421 for a foreign `Host`, 401 without the key, 403 for a cross-site
//! request, 415 for a body that is not JSON.

use std::net::SocketAddr;

use axum::http::{HeaderMap, Method, StatusCode, header};
use trinity_http_guard::{self as http_guard, Authority, Origin};

use crate::error::ApiError;

/// What the server accepts.
#[derive(Debug, Clone)]
pub(crate) struct RequestGuard {
    /// The address bound (with the port picked when 0 was asked for).
    listen: SocketAddr,
    /// The bearer keys accepted; none means no key is needed.
    api_keys: Vec<String>,
}

impl RequestGuard {
    pub(crate) fn new(listen: SocketAddr, api_keys: Vec<String>) -> RequestGuard {
        RequestGuard { listen, api_keys }
    }

    /// Checks a request's method and headers; `Err` is the refusal to answer with.
    pub(crate) fn check(&self, method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
        let host = http_guard::host_text(headers);
        let authority = Authority::of_request(headers);
        if self.listen.ip().is_loopback() && !authority.as_ref().is_some_and(Authority::is_loopback) {
            return Err(refusal(
                StatusCode::MISDIRECTED_REQUEST,
                "misdirected_request",
                format!(
                    "this server listens on {} and answers only requests addressed to it as localhost or a loopback IP (Host `{host}`)",
                    self.listen
                ),
            ));
        }
        self.check_key(headers)?;
        if method == Method::GET || method == Method::HEAD {
            return Ok(());
        }
        let forbidden = |message: String| Err(refusal(StatusCode::FORBIDDEN, "cross_site_request", message));
        if let Some(site) = http_guard::cross_site_fetch(headers) {
            return forbidden(format!("a {site} request from a web page is not answered"));
        }
        // Listening elsewhere the Host may be any name the network gives, and an unparsable one has no origin
        // to match: a browser's POST then carries an Origin that cannot be this server's.
        let origin = match &authority {
            Some(own) => http_guard::origin(headers, own),
            None => headers.get(header::ORIGIN).map_or(Origin::Absent, |o| Origin::Foreign(o.to_str().unwrap_or(""))),
        };
        if let Origin::Foreign(origin) = origin {
            return forbidden(format!(
                "cross-origin request: Origin `{origin}` is not this server (http://{host}), which serves no web pages"
            ));
        }
        if http_guard::has_body(headers)
            && let Err(content_type) = http_guard::json_content_type(headers)
        {
            return Err(refusal(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("send the body as Content-Type: application/json, not `{content_type}`"),
            ));
        }
        Ok(())
    }

    /// With API keys set, the request must present one of them as a bearer token.
    fn check_key(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.api_keys.is_empty() {
            return Ok(());
        }
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim);
        let known = presented
            .is_some_and(|key| self.api_keys.iter().any(|k| http_guard::same_bytes(key.as_bytes(), k.as_bytes())));
        if known {
            return Ok(());
        }
        let message = match presented {
            None => "missing API key: send it as `Authorization: Bearer <key>` (the server's TRINITY_SERVE_API_KEY)",
            Some(_) => "incorrect API key provided (the server's TRINITY_SERVE_API_KEY)",
        };
        Err(ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        })
    }
}

fn refusal(status: StatusCode, code: &'static str, message: String) -> ApiError {
    ApiError { status, message, kind: "invalid_request_error", param: None, code: Some(code) }
}

#[cfg(test)]
mod tests {
    use trinity_http_guard::testing::headers;

    use super::*;

    fn status(guard: &RequestGuard, method: Method, pairs: &[(&'static str, &str)]) -> u16 {
        guard.check(&method, &headers(pairs)).map_or_else(|e| e.status.as_u16(), |()| 200)
    }

    #[test]
    fn loopback_answers_loopback_names_only() {
        let g = RequestGuard::new("127.0.0.1:8010".parse().unwrap(), Vec::new());
        // A tunnel or a local proxy in front of the server sends its own port.
        let ok =
            ["127.0.0.1:8010", "localhost:8010", "LOCALHOST:8010", "[::1]:8010", "127.0.0.2:8010", "127.0.0.1:9000"];
        for ok in ok.into_iter().chain(["localhost", "[::1]"]) {
            assert_eq!(status(&g, Method::GET, &[("host", ok)]), 200, "{ok}");
        }
        let bad = ["evil.example:8010", "evil.example", "localhost.evil.example:8010", "127.0.0.1:x", "[::1]x"];
        for bad in bad.into_iter().chain(["192.168.1.5:8010", ""]) {
            assert_eq!(status(&g, Method::GET, &[("host", bad)]), 421, "{bad}");
        }
        // Another address is reached by whatever name the network gives it.
        let g = RequestGuard::new("0.0.0.0:8010".parse().unwrap(), Vec::new());
        assert_eq!(status(&g, Method::GET, &[("host", "trainer-box:8010")]), 200);
    }

    #[test]
    fn a_key_is_needed_on_every_request_when_one_is_set() {
        let g = RequestGuard::new("127.0.0.1:8010".parse().unwrap(), vec!["s3cret".into()]);
        let host = ("host", "127.0.0.1:8010");
        assert_eq!(status(&g, Method::GET, &[host]), 401);
        assert_eq!(status(&g, Method::GET, &[host, ("authorization", "Bearer s3cres")]), 401);
        assert_eq!(status(&g, Method::GET, &[host, ("authorization", "Basic s3cret")]), 401);
        assert_eq!(status(&g, Method::GET, &[host, ("authorization", "Bearer s3cret")]), 200);
        let refused = g.check(&Method::GET, &headers(&[host])).unwrap_err();
        assert_eq!(refused.body()["error"]["code"], "invalid_api_key");
        // Without a key, none is asked for.
        let open = RequestGuard::new("127.0.0.1:8010".parse().unwrap(), Vec::new());
        assert_eq!(status(&open, Method::GET, &[host, ("authorization", "Bearer anything")]), 200);
    }

    #[test]
    fn posts_need_json_and_no_foreign_origin() {
        let g = RequestGuard::new("127.0.0.1:8010".parse().unwrap(), Vec::new());
        let host = ("host", "127.0.0.1:8010");
        let json = ("content-type", "application/json; charset=utf-8");
        let body = ("content-length", "12");
        assert_eq!(status(&g, Method::POST, &[host, json, body]), 200);
        assert_eq!(status(&g, Method::POST, &[host, ("content-type", "text/plain"), body]), 415);
        assert_eq!(status(&g, Method::POST, &[host, body]), 415);
        assert_eq!(status(&g, Method::POST, &[host, ("transfer-encoding", "chunked")]), 415);
        // An empty POST (`/commit`) has nothing to parse.
        assert_eq!(status(&g, Method::POST, &[host, ("content-length", "0")]), 200);
        assert_eq!(status(&g, Method::POST, &[host, json, body, ("origin", "https://evil.example")]), 403);
        assert_eq!(status(&g, Method::POST, &[host, json, body, ("origin", "null")]), 403);
        assert_eq!(status(&g, Method::POST, &[host, json, body, ("sec-fetch-site", "cross-site")]), 403);
        assert_eq!(status(&g, Method::POST, &[host, json, body, ("origin", "http://127.0.0.1:8010")]), 200);
    }
}
