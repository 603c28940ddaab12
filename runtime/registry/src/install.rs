//! `trinity plugins install NAME[@VERSION] --registry INDEX`: choose, fetch, verify, store, pin.

use std::io::Write;
use std::path::{Path, PathBuf};

use semver::Version;
use sha2::{Digest, Sha256};

use crate::error::RegistryError;
use crate::fetch::Location;
use crate::http::FetchOptions;
use crate::index::{Index, Release, Request};
use crate::lock::{Lock, LockedPlugin};

/// The plugin folder inside a project: artifacts live at `PLUGIN_DIR/NAME/VERSION/FILE`.
pub const PLUGIN_DIR: &str = ".trinity/plugins";

/// [`install_with`] under the default [`FetchOptions`]: https only, default caps and timeouts.
pub fn install(
    request: &Request,
    registry: &str,
    project: &Path,
    host_api: &dyn Fn(&str) -> Option<Version>,
) -> Result<LockedPlugin, RegistryError> {
    install_with(request, registry, project, host_api, &FetchOptions::default())
}

/// Installs `request` from the index at `registry` (path or URL, relative to `project`) into `project`: picks the
/// release ([`Index::select`]), streams the artifact into a temporary file while hashing it, refuses it unless
/// its sha256 (and its size, when the index gives one) are the index's, moves it into the plugin folder and pins
/// it in the lock file. Nothing is stored or pinned when any step fails.
pub fn install_with(
    request: &Request,
    registry: &str,
    project: &Path,
    host_api: &dyn Fn(&str) -> Option<Version>,
    options: &FetchOptions,
) -> Result<LockedPlugin, RegistryError> {
    let index = Index::fetch_with(registry, project, options)?;
    let release = index.select(request, host_api)?;
    // Before anything is downloaded or written: the release must be signed by a publisher this project trusts.
    let mut lock = Lock::read(project)?;
    crate::signature::verify_release(release, &lock.trusted_keys, &lock.path())?;
    let artifact = index.location.join(&release.url)?;
    if index.location.is_remote() && !artifact.is_remote() {
        return Err(RegistryError::LocalArtifact {
            plugin: format!("`{}` {}", release.name, release.version),
            index: index.location.to_string(),
            artifact: artifact.to_string(),
        });
    }
    std::fs::create_dir_all(project).map_err(|source| RegistryError::Io { path: project.to_owned(), source })?;
    // Staged inside the project (the same file system as the plugin folder, so the final move is a rename).
    let download = project.join(format!(".trinity-download-{}-{}.tmp", std::process::id(), release.name));
    let mut staged = Staged { path: download, keep: false };
    let actual = download_verified(release, &artifact, options, &staged.path)?;
    let file = artifact.file_name().unwrap_or_else(|| format!("{}-{}", release.name, release.version));
    let relative: PathBuf = [PLUGIN_DIR, &release.name, &release.version.to_string(), &file].iter().collect();
    let path = project.join(&relative);
    let dir = path.parent().unwrap_or(project);
    std::fs::create_dir_all(dir).map_err(|source| RegistryError::Io { path: dir.to_owned(), source })?;
    std::fs::rename(&staged.path, &path).map_err(|source| RegistryError::Io { path: path.clone(), source })?;
    staged.keep = true;
    let pinned = LockedPlugin {
        name: release.name.clone(),
        kind: release.kind.clone(),
        version: release.version.to_string(),
        source: artifact.to_string(),
        sha256: actual,
        path: relative,
    };
    lock.pin(pinned.clone());
    lock.write()?;
    Ok(pinned)
}

/// Streams `artifact` into `dest` through the release's cap, hashing as it goes, and checks size and sha256
/// against the index. Returns the sha256.
fn download_verified(
    release: &Release,
    artifact: &Location,
    options: &FetchOptions,
    dest: &Path,
) -> Result<String, RegistryError> {
    let io = |source| RegistryError::Io { path: dest.to_owned(), source };
    let file = std::fs::File::create(dest).map_err(io)?;
    let mut sink = Hashing { inner: std::io::BufWriter::new(file), hasher: Sha256::new() };
    let cap = release.size.unwrap_or(options.max_artifact_bytes);
    let (written, _) = artifact.stream(options, cap, &mut sink)?;
    sink.inner.flush().map_err(io)?;
    let wrong = |expected: String, actual: String| RegistryError::Checksum {
        name: release.name.clone(),
        version: release.version.to_string(),
        url: artifact.to_string(),
        expected,
        actual,
    };
    if let Some(expected) = release.size
        && written != expected
    {
        return Err(RegistryError::Size {
            plugin: format!("`{}` {}", release.name, release.version),
            url: artifact.to_string(),
            expected,
            actual: written,
        });
    }
    let actual: String = sink.hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if actual != release.sha256 {
        return Err(wrong(release.sha256.clone(), actual));
    }
    Ok(actual)
}

/// A writer that hashes what passes through it.
struct Hashing<W> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The downloaded file before it is verified and moved: removed unless kept, so a failed install leaves nothing.
struct Staged {
    path: PathBuf,
    keep: bool,
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(kind: &str) -> Option<Version> {
        (kind == "algorithm").then(|| Version::new(0, 1, 0))
    }

    /// A registry whose publisher signs with this seed, and a project that trusts it.
    const SEED: [u8; 32] = [7; 32];

    fn registry(dir: &Path, artifact: &[u8], sha256: &str) {
        std::fs::create_dir_all(dir.join("files")).unwrap();
        std::fs::write(dir.join("files/libx.so"), artifact).unwrap();
        let index = format!(
            "[[plugin]]\nname = \"x\"\nkind = \"algorithm\"\nversion = \"0.3.0\"\napi = \">=0.1, <0.2\"\n\
             url = \"files/libx.so\"\nsha256 = \"{sha256}\"\n"
        );
        let signed = Index::sign(&index, &ed25519_dalek::SigningKey::from_bytes(&SEED)).unwrap();
        std::fs::write(dir.join("index.toml"), signed).unwrap();
    }

    fn trusting_project() -> tempfile::TempDir {
        let project = tempfile::tempdir().unwrap();
        let mut lock = Lock::read(project.path()).unwrap();
        lock.trust(&crate::public_key_hex(&ed25519_dalek::SigningKey::from_bytes(&SEED))).unwrap();
        lock.write().unwrap();
        project
    }

    #[test]
    fn installs_verifies_stores_and_pins() {
        let reg = tempfile::tempdir().unwrap();
        let project = trusting_project();
        registry(reg.path(), b"library bytes", &crate::sha256_hex(b"library bytes"));
        let url = format!("file://{}", reg.path().join("index.toml").display());
        let pinned = install(&Request::parse("x").unwrap(), &url, project.path(), &api).unwrap();
        assert_eq!(pinned.path, Path::new(".trinity/plugins/x/0.3.0/libx.so"));
        assert_eq!(std::fs::read(project.path().join(&pinned.path)).unwrap(), b"library bytes");
        let lock = Lock::read(project.path()).unwrap();
        assert_eq!(lock.get("x"), Some(&pinned));
        assert_eq!(lock.resolve("x").unwrap(), Some(project.path().join(&pinned.path)));
    }

    #[test]
    fn a_tampered_artifact_is_refused_and_nothing_is_pinned() {
        let reg = tempfile::tempdir().unwrap();
        let project = trusting_project();
        registry(reg.path(), b"evil bytes", &crate::sha256_hex(b"library bytes"));
        let index = reg.path().join("index.toml");
        let err = install(&Request::parse("x@0.3.0").unwrap(), index.to_str().unwrap(), project.path(), &api)
            .unwrap_err()
            .to_string();
        assert!(err.contains("refusing it") && err.contains(&crate::sha256_hex(b"evil bytes")), "{err}");
        assert!(Lock::read(project.path()).unwrap().plugins.is_empty());
        assert!(!project.path().join(PLUGIN_DIR).exists());
        assert_eq!(
            std::fs::read_dir(project.path()).unwrap().count(),
            1,
            "only the lock file: the download was removed"
        );
    }
}
