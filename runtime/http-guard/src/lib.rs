//! What the studio and serve mode check before any handler runs, in one place: both are HTTP surfaces on the
//! user's machine, reachable from any web page the user opens, and they close the same two attacks.
//!
//! - **DNS rebinding**: a name the attacker controls is made to resolve to 127.0.0.1, making the server
//!   same-origin with the attacker's page; the only trace is the `Host` header, which then names the attacker's
//!   domain. [`Authority::parse`] reads a `Host` (or an origin's authority) strictly, and [`Authority::is_loopback`]
//!   says whether it names `localhost` or a loopback IP, which no attacker can rebind. Ports are never compared
//!   against the one listened on: rebinding needs the name, whatever the port, while an SSH tunnel
//!   (`ssh -L 9000:127.0.0.1:8765`) or a local proxy legitimately sends its own.
//! - **Cross-site requests**: a page on another origin can make the browser send a "simple" POST (`text/plain`
//!   body, a form, `fetch(..., {mode: "no-cors"})`) without a CORS preflight; it cannot read the answer, but the
//!   side effect happens. [`cross_site_fetch`] reads fetch metadata, [`origin`] compares `Origin` with the
//!   request's own authority, and [`json_content_type`] requires the one media type no simple request can send.
//!
//! Each surface keeps its own policy on top (which names it listens as, whether a request without `Origin` needs a
//! token or an API key) and its own error type; these functions only read headers, so a refused body is never read.

use std::net::IpAddr;

use http::{HeaderMap, header};

/// A host name or IP and a port, as a `Host` header or an origin's authority writes them (names lowercase).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    pub host: HostName,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostName {
    Ip(IpAddr),
    Name(String),
}

impl Authority {
    /// `name:port`, `1.2.3.4:port` or `[::1]:port`; without a port it is 80, as browsers leave it out there.
    /// Anything else (userinfo, a path, an unbracketed IPv6 address, odd characters) is `None`.
    pub fn parse(text: &str) -> Option<Authority> {
        let text = text.to_ascii_lowercase();
        let (host, port) = match text.strip_prefix('[') {
            Some(rest) => {
                let (ip, after) = rest.split_once(']')?;
                let port = if after.is_empty() { None } else { Some(after.strip_prefix(':')?) };
                (HostName::Ip(IpAddr::V6(ip.parse().ok()?)), port)
            }
            None => {
                let (host, port) = match text.split_once(':') {
                    Some((host, port)) => (host, Some(port)),
                    None => (text.as_str(), None),
                };
                let valid = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
                if host.is_empty() || !host.chars().all(valid) {
                    return None;
                }
                match host.parse() {
                    Ok(ip) => (HostName::Ip(IpAddr::V4(ip)), port),
                    Err(_) => (HostName::Name(host.to_owned()), port),
                }
            }
        };
        let port = match port {
            None => 80,
            Some(port) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => port.parse().ok()?,
            Some(_) => return None,
        };
        Some(Authority { host, port })
    }

    /// The request's `Host` header, parsed; `None` when it is missing or malformed.
    pub fn of_request(headers: &HeaderMap) -> Option<Authority> {
        headers.get(header::HOST).and_then(|v| v.to_str().ok()).and_then(Authority::parse)
    }

    /// Whether it names `localhost` or a loopback IP: names only this machine can answer to.
    pub fn is_loopback(&self) -> bool {
        match &self.host {
            HostName::Name(name) => name == "localhost",
            HostName::Ip(ip) => ip.is_loopback(),
        }
    }
}

/// The request's `Host` header as text, for messages (empty when missing or not text).
pub fn host_text(headers: &HeaderMap) -> &str {
    headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// The `Sec-Fetch-Site` value when the browser says the request came from a page of another site
/// (`cross-site`, or `same-site`: another port or subdomain of the same site is another origin too).
pub fn cross_site_fetch(headers: &HeaderMap) -> Option<&str> {
    let site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())?;
    (site.eq_ignore_ascii_case("cross-site") || site.eq_ignore_ascii_case("same-site")).then_some(site)
}

/// What the request's `Origin` says about who sent it.
#[derive(Debug, PartialEq, Eq)]
pub enum Origin<'a> {
    /// No `Origin`: not a browser's POST (agents, `curl`), or a browser too old to send one.
    Absent,
    /// `http://` plus the request's own authority: a page the server itself served.
    Same,
    /// Anything else (another origin, `null`, `https://`), as sent.
    Foreign(&'a str),
}

/// Compares the request's `Origin` with `http://<own>`, parsed, so case and a default port do not matter.
pub fn origin<'a>(headers: &'a HeaderMap, own: &Authority) -> Origin<'a> {
    match headers.get(header::ORIGIN) {
        None => Origin::Absent,
        Some(value) => {
            let text = value.to_str().unwrap_or("");
            let same = text.strip_prefix("http://").and_then(Authority::parse).is_some_and(|o| &o == own);
            if same { Origin::Same } else { Origin::Foreign(text) }
        }
    }
}

/// `Ok` when the body is declared `application/json` (parameters allowed); else the `Content-Type` as sent.
pub fn json_content_type(headers: &HeaderMap) -> Result<(), &str> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let media_type = content_type.split(';').next().unwrap_or("").trim();
    if media_type.eq_ignore_ascii_case("application/json") { Ok(()) } else { Err(content_type) }
}

/// Whether the request has a body to parse: a nonzero `Content-Length`, or a chunked one.
pub fn has_body(headers: &HeaderMap) -> bool {
    let length = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).map(str::trim);
    length.is_some_and(|l| l != "0") || headers.contains_key(header::TRANSFER_ENCODING)
}

/// Compares a presented secret with the real one in time that does not depend on where they differ.
pub fn same_bytes(presented: &[u8], real: &[u8]) -> bool {
    presented.len() == real.len() && presented.iter().zip(real).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Header maps for the surfaces' tests (feature `testing`), so each suite does not rebuild its own.
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use http::{HeaderMap, HeaderValue};

    /// The headers `pairs` name. Panics on a value that is not a valid header value: tests pass literals.
    pub fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).expect("a valid header value"));
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::testing::headers;
    use super::*;

    #[test]
    fn authorities_parse_as_browsers_write_them() {
        let ip = |s: &str| HostName::Ip(s.parse().unwrap());
        assert_eq!(Authority::parse("127.0.0.1:8765"), Some(Authority { host: ip("127.0.0.1"), port: 8765 }));
        assert_eq!(Authority::parse("[::1]:8765"), Some(Authority { host: ip("::1"), port: 8765 }));
        assert_eq!(
            Authority::parse("LocalHost"),
            Some(Authority { host: HostName::Name("localhost".into()), port: 80 })
        );
        for bad in ["", ":8765", "::1:8765", "[::1", "[::1]8765", "a:b", "a:", "a@b:1", "a/b:1", "a:1:2", "a:+1"] {
            assert_eq!(Authority::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_localhost_and_loopback_ips_are_loopback_names() {
        for ok in ["localhost:1", "LOCALHOST", "127.0.0.2:9", "[::1]"] {
            assert!(Authority::parse(ok).unwrap().is_loopback(), "{ok}");
        }
        for bad in ["localhost.evil.example", "192.168.1.5", "evil.example:8010", "[fe80::1]"] {
            assert!(!Authority::parse(bad).unwrap().is_loopback(), "{bad}");
        }
    }

    #[test]
    fn origins_compare_as_authorities() {
        let own = Authority::parse("127.0.0.1:8010").unwrap();
        assert_eq!(origin(&headers(&[]), &own), Origin::Absent);
        assert_eq!(origin(&headers(&[("origin", "http://127.0.0.1:8010")]), &own), Origin::Same);
        for foreign in ["http://127.0.0.1:9999", "https://127.0.0.1:8010", "null", "http://localhost:8010"] {
            assert_eq!(origin(&headers(&[("origin", foreign)]), &own), Origin::Foreign(foreign), "{foreign}");
        }
        let default_port = Authority::parse("localhost").unwrap();
        assert_eq!(origin(&headers(&[("origin", "http://LOCALHOST:80")]), &default_port), Origin::Same);
    }

    #[test]
    fn fetch_metadata_json_and_bodies_are_read_from_headers() {
        assert_eq!(cross_site_fetch(&headers(&[("sec-fetch-site", "cross-site")])), Some("cross-site"));
        assert_eq!(cross_site_fetch(&headers(&[("sec-fetch-site", "Same-Site")])), Some("Same-Site"));
        assert_eq!(cross_site_fetch(&headers(&[("sec-fetch-site", "same-origin")])), None);
        assert_eq!(cross_site_fetch(&headers(&[])), None);
        assert_eq!(json_content_type(&headers(&[("content-type", "application/json; charset=utf-8")])), Ok(()));
        assert_eq!(json_content_type(&headers(&[("content-type", "text/plain")])), Err("text/plain"));
        assert_eq!(json_content_type(&headers(&[])), Err(""));
        assert!(has_body(&headers(&[("content-length", "12")])));
        assert!(has_body(&headers(&[("transfer-encoding", "chunked")])));
        assert!(!has_body(&headers(&[("content-length", "0")])) && !has_body(&headers(&[])));
        assert!(same_bytes(b"abc", b"abc"));
        assert!(!same_bytes(b"abc", b"abd") && !same_bytes(b"ab", b"abc") && !same_bytes(b"", b"abc"));
    }
}
