//! Which requests the studio answers: only those addressed to it by the name it listens as, and, for anything that
//! changes state, only those sent by its own page.
//!
//! The studio writes config files, and a config can name a workflow that runs a command, so a request that saves
//! one is as good as running code as the user. Two attacks from a web page the user merely visits are closed here:
//!
//! - **Cross-site requests.** A page on another origin can make the browser send a "simple" POST (`text/plain`
//!   body, a form, `fetch(..., {mode: "no-cors"})`) to `127.0.0.1:8765` without a CORS preflight; it cannot read
//!   the answer, but the side effect happens. So every request other than GET/HEAD must carry
//!   `Content-Type: application/json` (which a simple request cannot) and an `Origin` that is this studio as
//!   the request's `Host` names it. A request without `Origin` (browsers send one on every POST; older ones, and
//!   non-browser clients such as `curl`, may not) must instead carry the per-session token in `x-studio-token`.
//! - **DNS rebinding.** A name the attacker controls can be made to resolve to 127.0.0.1 after the page loaded,
//!   making the studio same-origin with the attacker's page; the only trace is the `Host` header, which then
//!   names the attacker's domain. So every request (the page, its assets and every GET of the API too) must have a
//!   `Host` the studio listens as: the listen address itself; on loopback also `localhost` and any loopback IP;
//!   when listening on all interfaces (`0.0.0.0`/`[::]`, "share it") any IP literal and `localhost`, but never
//!   another DNS name, because a name is exactly what rebinding needs and an IP literal cannot be rebound. A name
//!   given to `--listen` itself is accepted too: the user chose it. The port is not checked: rebinding needs the
//!   name, whatever the port, while an SSH tunnel (`ssh -L 9000:127.0.0.1:8765`) legitimately sends its own.
//!
//! The token is 256 random bits drawn when the studio starts and written into the page it serves (a `<meta>`
//! element), from where its script sends it as a header. Only a page that can read the studio's own `index.html`
//! can learn it, which the same-origin policy limits to the studio's origin (and the `Host` check keeps rebinding
//! from widening that origin). A cookie, even `SameSite=Strict`, would be the wrong carrier: cookies are scoped by
//! host name and not by port, so a page served from any other port on 127.0.0.1 (another local dev server, a
//! notebook) is "same-site" with the studio, its requests carry the cookie and its scripts could read it. A custom
//! header also cannot be added to a cross-origin request without a preflight, which the studio never grants.
//!
//! Every check reads only the request line and headers, so a refused request's body is never read. Refusals are
//! JSON errors: 421 for a foreign `Host`, 403 for the rest. Every response also forbids being framed, so another
//! site cannot overlay the studio's own page and steer clicks on Save.

use std::io::Read;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use trinity_http_guard::{self as http_guard, Authority, HostName, Origin};

use crate::error::StudioError;

/// The header the page sends its token in.
pub(crate) const TOKEN_HEADER: &str = "x-studio-token";

/// What the studio accepts as its own name, and the token its page carries.
#[derive(Debug)]
pub(crate) struct RequestGuard {
    /// The address bound (with the port picked when 0 was asked for).
    listen: SocketAddr,
    /// The host name given to `--listen` when it was a name rather than an IP (lowercase).
    listen_name: Option<String>,
    token: String,
}

impl RequestGuard {
    /// A guard for a studio bound to `listen`, asked for as `requested` (`HOST:PORT`), with a fresh token.
    pub(crate) fn new(listen: SocketAddr, requested: &str) -> Result<RequestGuard, StudioError> {
        Ok(RequestGuard::with_token(listen, requested, random_token()?))
    }

    fn with_token(listen: SocketAddr, requested: &str, token: String) -> RequestGuard {
        let listen_name = Authority::parse(requested).and_then(|a| match a.host {
            HostName::Name(name) => Some(name),
            HostName::Ip(_) => None,
        });
        RequestGuard { listen, listen_name, token }
    }

    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// Whether `authority` (a `Host` header) names this studio.
    fn accepts_host(&self, authority: &Authority) -> bool {
        let ip = self.listen.ip();
        match &authority.host {
            HostName::Name(name) if self.listen_name.as_ref() == Some(name) => true,
            // `localhost` resolves to loopback only, which an attacker cannot rebind.
            HostName::Name(name) => name == "localhost" && (ip.is_loopback() || ip.is_unspecified()),
            // Listening everywhere: the machine's own addresses are many and change (DHCP, VPNs), and any IP
            // literal is as safe against rebinding as the machine's own, so every IP literal is accepted.
            HostName::Ip(_) if ip.is_unspecified() => true,
            HostName::Ip(asked) if ip.is_loopback() => asked.is_loopback(),
            HostName::Ip(asked) => *asked == ip,
        }
    }

    /// Checks `method` and `headers` of a request; `Err` is the refusal to answer with.
    fn check(&self, method: &Method, headers: &HeaderMap) -> Result<(), StudioError> {
        let host = http_guard::host_text(headers);
        let authority = Authority::of_request(headers)
            .filter(|a| self.accepts_host(a))
            .ok_or_else(|| StudioError::ForeignHost { host: host.to_owned(), listen: self.listen.to_string() })?;
        if method == Method::GET || method == Method::HEAD {
            return Ok(());
        }
        let refuse = |message: String| Err(StudioError::Refused(message));
        // Fetch metadata, where the browser sends it, says outright that the request came from another page.
        if let Some(site) = http_guard::cross_site_fetch(headers) {
            return refuse(format!("a {site} request cannot change anything in the studio"));
        }
        match http_guard::origin(headers, &authority) {
            Origin::Same => {}
            Origin::Foreign(origin) => {
                return refuse(format!(
                    "cross-origin request: Origin `{origin}` is not this studio (http://{host}); only the \
                     studio's own page can validate or save configs"
                ));
            }
            Origin::Absent => {
                let token = headers.get(TOKEN_HEADER).map(HeaderValue::as_bytes).unwrap_or_default();
                if !http_guard::same_bytes(token, self.token.as_bytes()) {
                    return refuse(format!(
                        "a request without an Origin header needs the studio's token in `{TOKEN_HEADER}` (its page \
                         carries it)"
                    ));
                }
            }
        }
        if let Err(content_type) = http_guard::json_content_type(headers) {
            return refuse(format!("send the body as Content-Type: application/json, not `{content_type}`"));
        }
        Ok(())
    }
}

/// The middleware: refuses what [`RequestGuard::check`] refuses before any handler (or body extractor) runs, and
/// marks every response as not to be framed or sniffed.
pub(crate) async fn guard(State(guard): State<Arc<RequestGuard>>, request: Request, next: Next) -> Response {
    let mut response = match guard.check(request.method(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    };
    let headers = response.headers_mut();
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("frame-ancestors 'none'"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

/// 32 bytes from the kernel's random source, in hex. Read from `/dev/urandom` directly rather than through a crate:
/// the studio runs where trinity does (Linux), and this is the one place it needs randomness.
fn random_token() -> Result<String, StudioError> {
    let path = std::path::Path::new("/dev/urandom");
    let mut bytes = [0u8; 32];
    std::fs::File::open(path).and_then(|mut file| file.read_exact(&mut bytes)).map_err(StudioError::io(path))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use trinity_http_guard::testing::headers;

    use super::*;

    fn guard(listen: &str) -> RequestGuard {
        RequestGuard::with_token(listen.parse().unwrap(), listen, "t0ken".into())
    }

    fn host_ok(guard: &RequestGuard, host: &str) -> bool {
        Authority::parse(host).is_some_and(|a| guard.accepts_host(&a))
    }

    #[test]
    fn loopback_accepts_loopback_names_on_any_port() {
        let g = guard("127.0.0.1:8765");
        // A tunnel's local port (`ssh -L 9000:127.0.0.1:8765`) is another port than the one listened on.
        let ok =
            ["127.0.0.1:8765", "localhost:8765", "LOCALHOST:8765", "[::1]:8765", "127.0.0.2:8765", "localhost:9000"];
        for ok in ok.into_iter().chain(["127.0.0.1"]) {
            assert!(host_ok(&g, ok), "{ok}");
        }
        for bad in ["evil.example:8765", "192.168.1.5:8765", "localhost.:8765", "localhost.evil.example:8765"] {
            assert!(!host_ok(&g, bad), "{bad}");
        }
    }

    #[test]
    fn all_interfaces_accept_ip_literals_but_no_other_name() {
        let g = guard("0.0.0.0:8080");
        for ok in ["192.168.1.5:8080", "10.0.0.2:8080", "[fe80::1]:8080", "localhost:8080", "127.0.0.1:8080"] {
            assert!(host_ok(&g, ok), "{ok}");
        }
        for bad in ["mybox.lan:8080", "rebind.example:8080", "rebind.example:8765"] {
            assert!(!host_ok(&g, bad), "{bad}");
        }
        let g = guard("192.168.1.5:8080");
        assert!(host_ok(&g, "192.168.1.5:8080"));
        assert!(!host_ok(&g, "localhost:8080") && !host_ok(&g, "10.0.0.2:8080"));
        // A name given to --listen is the user's own choice.
        let g = RequestGuard::with_token("192.168.1.5:8080".parse().unwrap(), "MyBox.lan:8080", "t".into());
        assert!(host_ok(&g, "mybox.lan:8080") && !host_ok(&g, "other.lan:8080"));
    }

    #[test]
    fn changes_need_json_from_the_same_origin_or_the_token() {
        let g = guard("127.0.0.1:8765");
        let host = ("host", "127.0.0.1:8765");
        let json = ("content-type", "application/json; charset=utf-8");
        let refused = |pairs: &[(&'static str, &str)]| match g.check(&Method::POST, &headers(pairs)) {
            Err(StudioError::Refused(message)) => message,
            other => panic!("{pairs:?}: {other:?}"),
        };
        assert!(g.check(&Method::POST, &headers(&[host, json, ("origin", "http://127.0.0.1:8765")])).is_ok());
        assert!(g.check(&Method::POST, &headers(&[host, json, (TOKEN_HEADER, "t0ken")])).is_ok());
        assert!(refused(&[host, json, ("origin", "http://127.0.0.1:9999")]).contains("cross-origin"));
        assert!(refused(&[host, json, ("origin", "http://localhost:8765")]).contains("cross-origin"));
        assert!(refused(&[host, json, ("origin", "null")]).contains("cross-origin"));
        assert!(refused(&[host, json, ("origin", "https://127.0.0.1:8765")]).contains("cross-origin"));
        assert!(refused(&[host, json]).contains(TOKEN_HEADER));
        assert!(refused(&[host, json, (TOKEN_HEADER, "t0kem")]).contains(TOKEN_HEADER));
        let same = ("origin", "http://127.0.0.1:8765");
        assert!(refused(&[host, same, ("content-type", "text/plain")]).contains("application/json"));
        assert!(refused(&[host, same]).contains("application/json"));
        assert!(refused(&[host, same, json, ("sec-fetch-site", "same-site")]).contains("same-site"));
        assert!(g.check(&Method::POST, &headers(&[host, same, json, ("sec-fetch-site", "same-origin")])).is_ok());
        // A foreign Host is refused before anything else, GET included.
        let foreign = ("host", "evil.example:8765");
        for method in [Method::GET, Method::POST] {
            let result = g.check(&method, &headers(&[foreign, json, ("origin", "http://evil.example:8765")]));
            assert!(matches!(result, Err(StudioError::ForeignHost { .. })), "{method}: {result:?}");
        }
        assert!(matches!(g.check(&Method::GET, &HeaderMap::new()), Err(StudioError::ForeignHost { .. })));
        assert!(g.check(&Method::GET, &headers(&[host])).is_ok());
    }

    #[test]
    fn tokens_are_fresh() {
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
