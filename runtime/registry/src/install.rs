//! `trinity plugins install NAME[@VERSION] --registry INDEX`: choose, fetch, verify, store, pin.

use std::path::{Path, PathBuf};

use semver::Version;

use crate::error::RegistryError;
use crate::index::{Index, Request};
use crate::lock::{Lock, LockedPlugin};

/// The plugin folder inside a project: artifacts live at `PLUGIN_DIR/NAME/VERSION/FILE`.
pub const PLUGIN_DIR: &str = ".trinity/plugins";

/// Installs `request` from the index at `registry` (path or URL, relative to `project`) into `project`: picks the
/// release ([`Index::select`]), fetches the artifact, refuses it unless its sha256 is the index's, stores it and
/// pins it in the lock file. Nothing is stored or pinned when any step fails.
pub fn install(
    request: &Request,
    registry: &str,
    project: &Path,
    host_api: &dyn Fn(&str) -> Option<Version>,
) -> Result<LockedPlugin, RegistryError> {
    let index = Index::fetch(registry, project)?;
    let release = index.select(request, host_api)?;
    let artifact = index.location.join(&release.url)?;
    let bytes = artifact.fetch()?;
    let actual = crate::sha256_hex(&bytes);
    if actual != release.sha256 {
        return Err(RegistryError::Checksum {
            name: release.name.clone(),
            version: release.version.to_string(),
            url: artifact.to_string(),
            expected: release.sha256.clone(),
            actual,
        });
    }
    let file = artifact.file_name().unwrap_or_else(|| format!("{}-{}", release.name, release.version));
    let relative: PathBuf = [PLUGIN_DIR, &release.name, &release.version.to_string(), &file].iter().collect();
    let path = project.join(&relative);
    let dir = path.parent().unwrap_or(project);
    std::fs::create_dir_all(dir).map_err(|source| RegistryError::Io { path: dir.to_owned(), source })?;
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, &bytes).map_err(|source| RegistryError::Io { path: tmp.clone(), source })?;
    std::fs::rename(&tmp, &path).map_err(|source| RegistryError::Io { path: path.clone(), source })?;
    let pinned = LockedPlugin {
        name: release.name.clone(),
        kind: release.kind.clone(),
        version: release.version.to_string(),
        source: artifact.to_string(),
        sha256: actual,
        path: relative,
    };
    let mut lock = Lock::read(project)?;
    lock.pin(pinned.clone());
    lock.write()?;
    Ok(pinned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(kind: &str) -> Option<Version> {
        (kind == "algorithm").then(|| Version::new(0, 1, 0))
    }

    fn registry(dir: &Path, artifact: &[u8], sha256: &str) {
        std::fs::create_dir_all(dir.join("files")).unwrap();
        std::fs::write(dir.join("files/libx.so"), artifact).unwrap();
        let index = format!(
            "[[plugin]]\nname = \"x\"\nkind = \"algorithm\"\nversion = \"0.3.0\"\napi = \">=0.1, <0.2\"\n\
             url = \"files/libx.so\"\nsha256 = \"{sha256}\"\n"
        );
        std::fs::write(dir.join("index.toml"), index).unwrap();
    }

    #[test]
    fn installs_verifies_stores_and_pins() {
        let reg = tempfile::tempdir().unwrap();
        let project = tempfile::tempdir().unwrap();
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
        let project = tempfile::tempdir().unwrap();
        registry(reg.path(), b"evil bytes", &crate::sha256_hex(b"library bytes"));
        let index = reg.path().join("index.toml");
        let err = install(&Request::parse("x@0.3.0").unwrap(), index.to_str().unwrap(), project.path(), &api)
            .unwrap_err()
            .to_string();
        assert!(err.contains("refusing it") && err.contains(&crate::sha256_hex(b"evil bytes")), "{err}");
        assert!(Lock::read(project.path()).unwrap().plugins.is_empty());
        assert!(!project.path().join(PLUGIN_DIR).exists());
    }
}
