//! HTTP(S) GETs for the registry: ureq over rustls (Mozilla's roots, or the roots the caller trusts instead),
//! redirects followed by hand so that every hop passes the same scheme rules, bodies streamed through a size cap.
//!
//! Why by hand: an index's sha256 entries vouch for an artifact only as far as the index itself is authentic,
//! so the index and every artifact must come over TLS. A redirect is a new request: it may not leave https for
//! http (a downgrade hands the rest of the transfer to anyone on the path), nor go anywhere but http(s).

use std::io::{Read, Write};
use std::time::Duration;

use ureq::Agent;
use ureq::tls::{Certificate, RootCerts, TlsConfig};

use crate::error::RegistryError;

/// Redirects followed before giving up.
const MAX_REDIRECTS: usize = 5;

/// How the registry fetches over the network.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Accept plain `http://` indexes, artifacts and redirects. Off by default: over http anyone on the path can
    /// rewrite an index, and the sha256 entries of a rewritten index vouch for nothing.
    pub allow_insecure_http: bool,
    /// Root certificates (DER) to trust *instead of* Mozilla's, for a registry behind a private CA (and tests).
    pub trusted_roots: Option<Vec<Vec<u8>>>,
    /// Longest a TCP and TLS connection may take to open.
    pub connect_timeout: Duration,
    /// Longest one whole request (headers and body) may take.
    pub timeout: Duration,
    /// Largest index accepted.
    pub max_index_bytes: u64,
    /// Largest artifact accepted when the index gives no `size`.
    pub max_artifact_bytes: u64,
}

impl Default for FetchOptions {
    /// https only; 30 s to connect and 10 minutes a request; indexes up to 16 MiB and artifacts up to 1 GiB
    /// (a native algorithm library is tens of MB; a WASM plugin a few).
    fn default() -> Self {
        FetchOptions {
            allow_insecure_http: false,
            trusted_roots: None,
            connect_timeout: Duration::from_secs(30),
            timeout: Duration::from_secs(600),
            max_index_bytes: 16 << 20,
            max_artifact_bytes: 1 << 30,
        }
    }
}

impl FetchOptions {
    /// Refuses a URL this policy does not fetch: anything but https, unless plain http is allowed.
    pub fn check_url(&self, url: &str) -> Result<(), RegistryError> {
        if url.starts_with("https://") || (self.allow_insecure_http && url.starts_with("http://")) {
            return Ok(());
        }
        if url.starts_with("http://") {
            return Err(RegistryError::InsecureHttp { url: url.to_owned() });
        }
        Err(RegistryError::Fetch { url: url.to_owned(), message: "only https:// (or http://) URLs are fetched".into() })
    }
}

/// An agent configured from [`FetchOptions`].
pub(crate) struct Client {
    agent: Agent,
    options: FetchOptions,
}

impl Client {
    pub(crate) fn new(options: &FetchOptions) -> Self {
        let roots = match &options.trusted_roots {
            None => RootCerts::WebPki,
            Some(ders) => ders.iter().map(|der| Certificate::from_der(der).to_owned()).collect::<Vec<_>>().into(),
        };
        let config = Agent::config_builder()
            .max_redirects(0)
            .http_status_as_error(false)
            .https_only(!options.allow_insecure_http)
            .timeout_connect(Some(options.connect_timeout))
            .timeout_global(Some(options.timeout))
            .user_agent(concat!("trinity-registry/", env!("CARGO_PKG_VERSION")))
            .tls_config(TlsConfig::builder().root_certs(roots).build())
            .build();
        Client { agent: config.into(), options: options.clone() }
    }

    /// GETs `url` into `sink`, following redirects under the scheme rules, and refusing a body over `max_bytes`
    /// (by its declared length before reading, else once that many bytes have come). Returns the bytes written
    /// and the URL that answered (after redirects: what relative references resolve against).
    pub(crate) fn get(&self, url: &str, max_bytes: u64, sink: &mut dyn Write) -> Result<(u64, String), RegistryError> {
        let mut current = url.to_owned();
        for _ in 0..=MAX_REDIRECTS {
            self.options.check_url(&current)?;
            let failed = |message: String| RegistryError::Fetch { url: current.clone(), message };
            let mut response = self.agent.get(&current).call().map_err(|e| failed(e.to_string()))?;
            let status = response.status();
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get("location")
                    .and_then(|value| value.to_str().ok())
                    .ok_or_else(|| failed(format!("HTTP {status} without a Location header")))?;
                let next = redirect_target(&current, location).ok_or_else(|| {
                    failed(format!("HTTP {status} to `{location}`, which is not an http(s) location"))
                })?;
                if current.starts_with("https://") && !next.starts_with("https://") {
                    return Err(RegistryError::Downgrade { from: current, to: next });
                }
                current = next;
                continue;
            }
            if !status.is_success() {
                return Err(failed(format!("HTTP {status}")));
            }
            if let Some(declared) = response.body().content_length()
                && declared > max_bytes
            {
                return Err(RegistryError::TooLarge { url: current, limit: max_bytes });
            }
            let mut reader = response.body_mut().as_reader();
            let written = copy_capped(&mut reader, sink, max_bytes).map_err(|e| match e {
                Capped::Over => RegistryError::TooLarge { url: current.clone(), limit: max_bytes },
                Capped::Read(e) => failed(format!("the body broke off: {e}")),
                Capped::Write(e) => failed(format!("cannot store the body: {e}")),
            })?;
            return Ok((written, current));
        }
        Err(RegistryError::Fetch { url: url.to_owned(), message: format!("more than {MAX_REDIRECTS} redirects") })
    }
}

/// Why a capped copy stopped.
pub(crate) enum Capped {
    Over,
    Read(std::io::Error),
    Write(std::io::Error),
}

/// Copies `reader` into `sink` until the end, failing once more than `max_bytes` have come.
pub(crate) fn copy_capped(reader: &mut dyn Read, sink: &mut dyn Write, max_bytes: u64) -> Result<u64, Capped> {
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Capped::Read(e)),
        };
        total += n as u64;
        if total > max_bytes {
            return Err(Capped::Over);
        }
        sink.write_all(&buf[..n]).map_err(Capped::Write)?;
    }
}

/// The absolute URL a `Location` header names, resolved against the URL that answered; `None` for a scheme
/// other than http(s).
fn redirect_target(base: &str, location: &str) -> Option<String> {
    if let Some((scheme, _)) = location.split_once("://")
        && !scheme.contains('/')
    {
        // Schemes are case-insensitive; the rules compare lowercase ones.
        let scheme = scheme.to_ascii_lowercase();
        let rest = &location[scheme.len() + 3..];
        return matches!(scheme.as_str(), "http" | "https").then(|| format!("{scheme}://{rest}"));
    }
    let (scheme, rest) = base.split_once("://")?;
    if let Some(host_path) = location.strip_prefix("//") {
        return Some(format!("{scheme}://{host_path}"));
    }
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let origin = &base[..scheme.len() + 3 + authority_end];
    if location.starts_with('/') {
        return Some(format!("{origin}{location}"));
    }
    let path = rest[authority_end..].split(['?', '#']).next().unwrap_or("");
    let dir = path.rsplit_once('/').map_or("", |(dir, _)| dir);
    Some(format!("{origin}{dir}/{location}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_targets_resolve_like_a_browser() {
        let base = "https://reg.example/a/b/index.toml?x=1";
        assert_eq!(redirect_target(base, "https://cdn.example/i").as_deref(), Some("https://cdn.example/i"));
        assert_eq!(redirect_target(base, "HTTP://cdn.example/i").as_deref(), Some("http://cdn.example/i"));
        assert_eq!(redirect_target(base, "//cdn.example/i").as_deref(), Some("https://cdn.example/i"));
        assert_eq!(redirect_target(base, "/root.toml").as_deref(), Some("https://reg.example/root.toml"));
        assert_eq!(redirect_target(base, "c.toml").as_deref(), Some("https://reg.example/a/b/c.toml"));
        assert_eq!(redirect_target("https://reg.example", "c").as_deref(), Some("https://reg.example/c"));
        assert_eq!(redirect_target(base, "file:///etc/passwd"), None);
        assert_eq!(redirect_target(base, "ftp://x/y"), None);
    }

    #[test]
    fn plain_http_needs_the_opt_in_and_says_why() {
        let strict = FetchOptions::default();
        assert!(strict.check_url("https://reg.example/i.toml").is_ok());
        let err = strict.check_url("http://reg.example/i.toml").unwrap_err().to_string();
        assert!(err.contains("http://reg.example/i.toml") && err.contains("vouch for nothing"), "{err}");
        assert!(err.contains("--allow-insecure-http"), "{err}");
        let lax = FetchOptions { allow_insecure_http: true, ..FetchOptions::default() };
        assert!(lax.check_url("http://reg.example/i.toml").is_ok());
        assert!(lax.check_url("ftp://reg.example/i.toml").is_err());
    }
}
