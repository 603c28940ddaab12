//! The plugin registry: where `trinity plugins install NAME[@VERSION]` finds a plugin, how it checks it, and
//! where it pins it. No libtorch, no wasmtime: this crate only moves and hashes files.
//!
//! * An **index** ([`index`]) is a TOML file (a local path, `file://` or `http(s)://` URL) listing plugin
//!   releases: name, kind, version, artifact URL, sha256 and the range of host plugin APIs it works with. The
//!   format is documented in `docs/plugins-registry.md`.
//! * [`install`] picks a release, streams its artifact ([`fetch`], [`http`]) through a size cap while hashing it,
//!   refuses it unless its sha256 (and size, when given) match the index, stores it under the project's plugin
//!   folder (`.trinity/plugins/NAME/VERSION/FILE`) and pins it in the project's lock file.
//! * Over the network ([`http`]): https only unless [`FetchOptions::allow_insecure_http`], no redirect that
//!   leaves https, timeouts, and caps on every body.
//! * **Signatures** ([`signature`]): every index entry carries the publisher's ed25519 signature over its name,
//!   kind, version, API range and sha256; an install refuses a release unless a key the project trusts
//!   (`trinity plugins trust KEY`, kept in the lock file) made its signature, before anything is downloaded.
//! * The **lock file** ([`lock`], `trinity-plugins.lock`) is what a run trusts: [`lock::Lock::resolve`] finds an
//!   installed plugin by name and re-checks the stored file's sha256 before anyone loads it, so a file changed
//!   after install is refused too.

pub mod error;
pub mod fetch;
pub mod http;
pub mod index;
pub mod install;
pub mod lock;
pub mod signature;

pub use error::RegistryError;
pub use http::FetchOptions;
pub use index::{Index, Release, Request};
pub use install::{PLUGIN_DIR, install, install_with};
pub use lock::{LOCK_FILE, Lock, LockedPlugin};
/// Plugin API versions are semver versions; re-exported so callers need not depend on semver themselves.
pub use semver::Version;
pub use signature::{parse_public_key, parse_secret_key, public_key_hex, sign_release};

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The platform a native artifact must be built for, as index files spell it (`x86_64-linux`, `aarch64-macos`).
pub fn host_platform() -> String {
    format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_of_known_input() {
        assert_eq!(super::sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
