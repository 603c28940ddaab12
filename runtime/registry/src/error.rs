//! The crate's one error type: every variant names the plugin, file or URL at fault.

use std::path::PathBuf;

/// What went wrong while reading an index, installing a plugin or resolving a locked one.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The index could not be read or parsed.
    #[error("plugin index {location}: {message}")]
    Index { location: String, message: String },

    /// No plugin of that name in the index.
    #[error("plugin index {location} has no plugin `{name}`; it has: {}", available.join(", "))]
    UnknownPlugin { location: String, name: String, available: Vec<String> },

    /// The requested version is not in the index.
    #[error("plugin `{name}` has no version {version} in {location}; it has: {}", available.join(", "))]
    UnknownVersion { location: String, name: String, version: String, available: Vec<String> },

    /// No release works with this trinity.
    #[error("no release of plugin `{name}` works with this trinity: {reasons}")]
    Incompatible { name: String, reasons: String },

    /// A malformed `NAME[@VERSION]`.
    #[error("invalid plugin request `{request}`: {message}")]
    Request { request: String, message: String },

    /// An artifact or index could not be fetched.
    #[error("cannot fetch {url}: {message}")]
    Fetch { url: String, message: String },

    /// A plain-http location without the explicit opt-in.
    #[error(
        "refusing plain http:// location {url}: anyone on the network path can rewrite what comes over http, and \
         the sha256 entries of an index fetched that way vouch for nothing; use https://, or pass \
         --allow-insecure-http if you trust every network between you and the registry"
    )]
    InsecureHttp { url: String },

    /// A redirect from https to anything else.
    #[error("{from} redirects to {to}: refusing to leave https (a downgrade would expose the rest of the transfer)")]
    Downgrade { from: String, to: String },

    /// A body larger than its cap.
    #[error("{url} is larger than the {limit} bytes allowed for it; refusing it")]
    TooLarge { url: String, limit: u64 },

    /// An artifact of a different length from the index's `size`.
    #[error("plugin {plugin}: artifact {url} has {actual} bytes, but the index says {expected}; refusing it")]
    Size { plugin: String, url: String, expected: u64, actual: u64 },

    /// A remote index that names a file on this machine.
    #[error(
        "plugin {plugin}: the remote index {index} names the local file {artifact}; a remote index may only name \
         remote artifacts"
    )]
    LocalArtifact { plugin: String, index: String, artifact: String },

    /// The fetched artifact is not the one the index vouches for.
    #[error(
        "plugin `{name}` {version}: artifact {url} has sha256 {actual}, but the index says {expected}; refusing it \
         (tampered or corrupted)"
    )]
    Checksum { name: String, version: String, url: String, expected: String, actual: String },

    /// An installed plugin's file changed since it was locked.
    #[error(
        "installed plugin `{name}` at {} has sha256 {actual}, but {} pins {expected}; refusing to load it \
         (reinstall it with `trinity plugins install {name}`)",
        path.display(),
        lock.display()
    )]
    Tampered { name: String, path: PathBuf, lock: PathBuf, expected: String, actual: String },

    /// A publisher key that is not one.
    #[error("publisher key `{key}`: {message}")]
    Key { key: String, message: String },

    /// No publisher is trusted yet, so no signature could be accepted.
    #[error(
        "plugin {plugin}: no publisher key is trusted in {}; run `trinity plugins trust KEY` with the ed25519 \
         public key of the registry's publisher first; refusing it",
        lock.display()
    )]
    NoTrustedKey { plugin: String, lock: PathBuf },

    /// An index entry without a signature.
    #[error(
        "plugin {plugin}: its index entry has no `signature`; only releases signed by a trusted publisher are \
         installed, refusing it"
    )]
    Unsigned { plugin: String },

    /// An index entry whose signature does not verify.
    #[error("plugin {plugin}: its signature does not verify ({message}); refusing it (tampered index?)")]
    BadSignature { plugin: String, message: String },

    /// The lock file could not be read, parsed or written.
    #[error("lock file {}: {message}", path.display())]
    Lock { path: PathBuf, message: String },

    /// A file of the plugin folder could not be read or written.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}
