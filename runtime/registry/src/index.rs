//! The index file: which releases of which plugins exist, where their artifacts are, and what they hash to.
//!
//! ```toml
//! [[plugin]]
//! name = "algo-example-a"
//! kind = "algorithm"            # algorithm | reward | workflow | operator
//! version = "0.1.0"
//! api = "^0.1"                  # host plugin API range: trinity-plugin-sdk (algorithm) or the WIT package
//! url = "artifacts/libalgo_example_a.so"   # relative to the index, absolute, file://, http(s)://
//! sha256 = "4f0c…"              # of the artifact, lowercase hex
//! size = 123456                 # optional: the artifact's length in bytes (the download's cap)
//! platform = "x86_64-linux"     # optional; native libraries only
//! description = "…"             # optional
//! signature = "9a1f…"           # ed25519 by the publisher over the entry (see `signature`), 128 hex digits
//! ```

use std::path::Path;

use semver::{Version, VersionReq};
use serde::{Deserialize, Serialize};

use crate::error::RegistryError;
use crate::fetch::Location;
use crate::http::FetchOptions;

/// One release of one plugin.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Release {
    pub name: String,
    /// `algorithm` for abi_stable libraries; `reward`, `workflow` or `operator` for WASM components.
    pub kind: String,
    pub version: Version,
    /// The host plugin API versions this release works with.
    pub api: VersionReq,
    /// Where the artifact is, resolved against the index's location when relative.
    pub url: String,
    pub sha256: String,
    /// The artifact's length in bytes: downloads stop past it, and a body of another length is refused.
    pub size: Option<u64>,
    /// `ARCH-OS` the artifact is built for (native libraries); absent for portable ones.
    pub platform: Option<String>,
    pub description: Option<String>,
    /// The publisher's ed25519 signature over [`crate::signature::signed_message`], hex; installs refuse a
    /// release without a valid one from a trusted key.
    pub signature: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct IndexFile {
    #[serde(default)]
    plugin: Vec<Release>,
}

/// A parsed index and where it came from.
#[derive(Debug, Clone)]
pub struct Index {
    pub location: Location,
    pub releases: Vec<Release>,
}

/// `NAME` or `NAME@VERSION`, as `trinity plugins install` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub name: String,
    pub version: Option<Version>,
}

impl Request {
    /// Parses `NAME[@VERSION]`.
    pub fn parse(text: &str) -> Result<Self, RegistryError> {
        let bad = |message: String| RegistryError::Request { request: text.to_owned(), message };
        let (name, version) = match text.split_once('@') {
            Some((name, version)) => {
                (name, Some(Version::parse(version).map_err(|e| bad(format!("version `{version}`: {e}")))?))
            }
            None => (text, None),
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(bad("a plugin name is letters, digits, `-` and `_`".to_owned()));
        }
        Ok(Request { name: name.to_owned(), version })
    }
}

impl Index {
    /// Reads an index from a path or URL (relative paths against `cwd`) with the default [`FetchOptions`] (https
    /// only).
    pub fn fetch(location: &str, cwd: &Path) -> Result<Self, RegistryError> {
        Index::fetch_with(location, cwd, &FetchOptions::default())
    }

    /// [`Index::fetch`] under `options`.
    pub fn fetch_with(location: &str, cwd: &Path, options: &FetchOptions) -> Result<Self, RegistryError> {
        // Artifact URLs are relative to where the index was found after redirects, as on the web.
        let (bytes, location) = Location::parse(location, cwd)?.fetch(options, options.max_index_bytes)?;
        let text = String::from_utf8(bytes)
            .map_err(|_| RegistryError::Index { location: location.to_string(), message: "not UTF-8 text".into() })?;
        Index::parse(&text, location)
    }

    /// Parses index text; every release is checked (name, sha256 form) so a bad index fails as a whole.
    pub fn parse(text: &str, location: Location) -> Result<Self, RegistryError> {
        let bad = |message: String| RegistryError::Index { location: location.to_string(), message };
        let file: IndexFile = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        for r in &file.plugin {
            Request::parse(&r.name).map_err(|e| bad(e.to_string()))?;
            if r.sha256.len() != 64 || !r.sha256.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()) {
                return Err(bad(format!("plugin `{}` {}: sha256 must be 64 lowercase hex digits", r.name, r.version)));
            }
        }
        Ok(Index { location, releases: file.plugin })
    }

    /// Signs every release of index `text` with `secret` (what a publisher runs before uploading an index) and
    /// returns the index with each entry's `signature` set. Comments and layout are not kept.
    pub fn sign(text: &str, secret: &ed25519_dalek::SigningKey) -> Result<String, RegistryError> {
        let location = Location::parse("index.toml", Path::new("."))?;
        let mut index = Index::parse(text, location)?;
        for release in &mut index.releases {
            release.signature = Some(crate::signature::sign_release(release, secret));
        }
        toml::to_string(&IndexFile { plugin: index.releases })
            .map_err(|e| RegistryError::Index { location: "index.toml".to_owned(), message: e.to_string() })
    }

    /// The release to install: the requested version, or else the newest one whose API range contains the host's
    /// API version for its kind (`host_api` gives it; `None` for a kind this trinity cannot load) and whose
    /// platform, if any, is this one.
    pub fn select(
        &self,
        request: &Request,
        host_api: &dyn Fn(&str) -> Option<Version>,
    ) -> Result<&Release, RegistryError> {
        let mut candidates: Vec<&Release> = self.releases.iter().filter(|r| r.name == request.name).collect();
        if candidates.is_empty() {
            let mut available: Vec<String> = self.releases.iter().map(|r| r.name.clone()).collect();
            available.sort();
            available.dedup();
            return Err(RegistryError::UnknownPlugin {
                location: self.location.to_string(),
                name: request.name.clone(),
                available,
            });
        }
        candidates.sort_by(|a, b| b.version.cmp(&a.version));
        if let Some(version) = &request.version {
            let available = candidates.iter().map(|r| r.version.to_string()).collect();
            candidates.retain(|r| &r.version == version);
            if candidates.is_empty() {
                return Err(RegistryError::UnknownVersion {
                    location: self.location.to_string(),
                    name: request.name.clone(),
                    version: version.to_string(),
                    available,
                });
            }
        }
        let platform = crate::host_platform();
        let mut reasons = Vec::new();
        for r in candidates {
            let why = match host_api(&r.kind) {
                None => Some(format!("kind `{}` is not one this trinity loads", r.kind)),
                Some(api) if !r.api.matches(&api) => {
                    Some(format!("needs plugin API {}, this trinity has {api}", r.api))
                }
                Some(_) => match &r.platform {
                    Some(p) if *p != platform => Some(format!("built for {p}, this is {platform}")),
                    _ => None,
                },
            };
            match why {
                None => return Ok(r),
                Some(why) => reasons.push(format!("{} {why}", r.version)),
            }
        }
        Err(RegistryError::Incompatible { name: request.name.clone(), reasons: reasons.join("; ") })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    fn index(body: &str) -> Result<Index, RegistryError> {
        Index::parse(body, Location::File("/r/index.toml".into()))
    }

    fn release(name: &str, version: &str, api: &str) -> String {
        format!(
            "[[plugin]]\nname = \"{name}\"\nkind = \"algorithm\"\nversion = \"{version}\"\napi = \"{api}\"\n\
             url = \"lib.so\"\nsha256 = \"{SHA}\"\n"
        )
    }

    fn api(kind: &str) -> Option<Version> {
        (kind == "algorithm").then(|| Version::new(0, 1, 0))
    }

    #[test]
    fn newest_compatible_release_wins() {
        let idx = index(
            &[release("a", "1.0.0", "^0.1"), release("a", "2.0.0", "^0.2"), release("a", "1.5.0", "^0.1")].concat(),
        )
        .unwrap();
        let pick = idx.select(&Request::parse("a").unwrap(), &api).unwrap();
        assert_eq!(pick.version, Version::new(1, 5, 0));
        let err = idx.select(&Request::parse("a@2.0.0").unwrap(), &api).unwrap_err().to_string();
        assert!(err.contains("needs plugin API ^0.2") && err.contains("0.1.0"), "{err}");
        let err = idx.select(&Request::parse("a@3.0.0").unwrap(), &api).unwrap_err().to_string();
        assert!(err.contains("2.0.0, 1.5.0, 1.0.0"), "{err}");
        let err = idx.select(&Request::parse("b").unwrap(), &api).unwrap_err().to_string();
        assert!(err.contains("no plugin `b`") && err.contains("it has: a"), "{err}");
    }

    #[test]
    fn malformed_indexes_and_requests_are_refused() {
        let err = index(&release("a", "1.0.0", "^0.1").replace(SHA, "abc")).unwrap_err().to_string();
        assert!(err.contains("sha256"), "{err}");
        let err = index(&format!("{}extra = 1\n", release("a", "1.0.0", "^0.1"))).unwrap_err().to_string();
        assert!(err.contains("extra"), "{err}");
        assert!(Request::parse("a@x").is_err());
        assert!(Request::parse("../a").is_err());
        assert_eq!(Request::parse("a-b@1.2.3").unwrap().version, Some(Version::new(1, 2, 3)));
    }
}
