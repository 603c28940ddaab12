//! Fetching an index or an artifact by location: a local path, a `file://` URL, or an `http(s)://` URL.
//!
//! HTTP goes through [`crate::http`] (https only unless [`FetchOptions::allow_insecure_http`]); every read, local
//! or remote, is capped in size and streamed, so a hostile server or a huge file costs a bounded amount of memory
//! and disk.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::RegistryError;
use crate::http::{Capped, Client, FetchOptions, copy_capped};

/// Where a file lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local file (from a plain path or a `file://` URL).
    File(PathBuf),
    /// An `http://` or `https://` URL.
    Http(String),
}

impl Location {
    /// Parses `text`: an `http(s)://` or `file://` URL, or a path (relative ones against `base`).
    pub fn parse(text: &str, base: &Path) -> Result<Self, RegistryError> {
        let bad = |message: &str| RegistryError::Fetch { url: text.to_owned(), message: message.to_owned() };
        if text.starts_with("http://") || text.starts_with("https://") {
            return Ok(Location::Http(text.to_owned()));
        }
        if let Some(rest) = text.strip_prefix("file://") {
            // `file:///abs/path` or `file://localhost/abs/path`; other hosts are not local files.
            let path = rest.strip_prefix("localhost").unwrap_or(rest);
            if !path.starts_with('/') {
                return Err(bad("a file:// URL needs an absolute path (file:///dir/file)"));
            }
            return Ok(Location::File(PathBuf::from(percent_decode(path).ok_or_else(|| bad("bad %-escape"))?)));
        }
        if let Some((scheme, _)) = text.split_once("://") {
            return Err(bad(&format!("unsupported scheme `{scheme}`; use a path, file://, http:// or https://")));
        }
        Ok(Location::File(base.join(text)))
    }

    /// Resolves `reference` (an index's artifact URL) against this location: URLs and absolute paths stand alone,
    /// relative paths are relative to the index's folder (or URL directory).
    pub fn join(&self, reference: &str) -> Result<Self, RegistryError> {
        let is_url = reference.contains("://");
        match self {
            _ if is_url || reference.starts_with('/') => Location::parse(reference, Path::new("/")),
            Location::File(index) => Location::parse(reference, index.parent().unwrap_or(Path::new("."))),
            Location::Http(url) => {
                let dir = url.rsplit_once('/').map_or(url.as_str(), |(dir, _)| dir);
                Ok(Location::Http(format!("{dir}/{reference}")))
            }
        }
    }

    /// The last path segment, for naming the stored file.
    pub fn file_name(&self) -> Option<String> {
        let name = match self {
            Location::File(p) => p.file_name()?.to_str()?.to_owned(),
            Location::Http(u) => u.split(['?', '#']).next()?.rsplit('/').next()?.to_owned(),
        };
        (!name.is_empty() && name != "." && name != "..").then_some(name)
    }

    /// Whether this is a network location.
    pub fn is_remote(&self) -> bool {
        matches!(self, Location::Http(_))
    }

    /// Reads the whole file, refusing one over `max_bytes`; also returns where it came from after redirects.
    pub fn fetch(&self, options: &FetchOptions, max_bytes: u64) -> Result<(Vec<u8>, Location), RegistryError> {
        let mut bytes = Vec::new();
        let (_, from) = self.stream(options, max_bytes, &mut bytes)?;
        Ok((bytes, from))
    }

    /// Streams the file into `sink`, refusing one over `max_bytes`; returns the bytes written and the location
    /// that answered (an http(s) URL after its redirects).
    pub fn stream(
        &self,
        options: &FetchOptions,
        max_bytes: u64,
        sink: &mut dyn Write,
    ) -> Result<(u64, Location), RegistryError> {
        match self {
            Location::Http(url) => {
                let (written, from) = Client::new(options).get(url, max_bytes, sink)?;
                Ok((written, Location::Http(from)))
            }
            Location::File(path) => {
                let failed = |message: String| RegistryError::Fetch { url: path.display().to_string(), message };
                let mut file = std::fs::File::open(path).map_err(|e| failed(e.to_string()))?;
                let written = copy_capped(&mut file, sink, max_bytes).map_err(|e| match e {
                    Capped::Over => RegistryError::TooLarge { url: path.display().to_string(), limit: max_bytes },
                    Capped::Read(e) => failed(e.to_string()),
                    Capped::Write(e) => failed(format!("cannot store it: {e}")),
                })?;
                Ok((written, self.clone()))
            }
        }
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::File(p) => write!(f, "{}", p.display()),
            Location::Http(u) => f.write_str(u),
        }
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_and_join() {
        let base = Path::new("/work");
        assert_eq!(Location::parse("idx.toml", base).unwrap(), Location::File("/work/idx.toml".into()));
        assert_eq!(Location::parse("file:///a%20b/i.toml", base).unwrap(), Location::File("/a b/i.toml".into()));
        assert!(Location::parse("file://relative", base).is_err());
        assert!(Location::parse("ftp://x/y", base).unwrap_err().to_string().contains("ftp"));
        let index = Location::parse("/reg/index.toml", base).unwrap();
        assert_eq!(index.join("a/lib.so").unwrap(), Location::File("/reg/a/lib.so".into()));
        assert_eq!(index.join("/abs/lib.so").unwrap(), Location::File("/abs/lib.so".into()));
        let http = Location::parse("https://example.invalid/r/index.toml", base).unwrap();
        assert_eq!(http.join("lib.so").unwrap(), Location::Http("https://example.invalid/r/lib.so".into()));
        assert_eq!(http.join("lib.so").unwrap().file_name().as_deref(), Some("lib.so"));
    }

    #[test]
    fn a_missing_file_names_it() {
        let err = Location::File("/nonexistent/x.so".into()).fetch(&FetchOptions::default(), 10).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/x.so"), "{err}");
    }

    #[test]
    fn a_local_file_over_the_cap_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.so");
        std::fs::write(&path, [7u8; 100]).unwrap();
        let location = Location::File(path);
        assert_eq!(location.fetch(&FetchOptions::default(), 100).unwrap().0.len(), 100);
        let err = location.fetch(&FetchOptions::default(), 99).unwrap_err();
        assert!(matches!(err, RegistryError::TooLarge { limit: 99, .. }), "{err}");
    }
}
