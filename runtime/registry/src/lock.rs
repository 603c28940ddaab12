//! The lock file (`trinity-plugins.lock`, TOML, in the project folder): every installed plugin with the exact
//! version, source and sha256 it was installed from and where its file is. Commit it; a run loads installed
//! plugins by name through it, re-checking each file's hash first.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::RegistryError;

/// The lock file's name in a project folder.
pub const LOCK_FILE: &str = "trinity-plugins.lock";

/// One pinned plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedPlugin {
    pub name: String,
    pub kind: String,
    pub version: String,
    /// The artifact location it was fetched from.
    pub source: String,
    pub sha256: String,
    /// The stored file, relative to the project folder.
    pub path: PathBuf,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LockFile {
    /// Publisher keys (ed25519, hex) whose signatures installs accept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    trusted_keys: Vec<String>,
    #[serde(default)]
    plugin: Vec<LockedPlugin>,
}

/// A project's lock file.
#[derive(Debug, Clone, Default)]
pub struct Lock {
    /// The project folder (where the lock file lives; stored paths are relative to it).
    pub project: PathBuf,
    /// Pinned plugins, sorted by name.
    pub plugins: Vec<LockedPlugin>,
    /// Publisher keys (ed25519, hex) this project trusts to sign releases (`trinity plugins trust KEY`).
    pub trusted_keys: Vec<String>,
}

impl Lock {
    /// The lock file of `project`; an absent file is an empty lock.
    pub fn read(project: &Path) -> Result<Self, RegistryError> {
        let path = project.join(LOCK_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => return Err(RegistryError::Io { path, source }),
        };
        let file: LockFile =
            toml::from_str(&text).map_err(|e| RegistryError::Lock { path: path.clone(), message: e.to_string() })?;
        Ok(Lock { project: project.to_owned(), plugins: file.plugin, trusted_keys: file.trusted_keys })
    }

    /// Writes the lock file (to a temporary file, then renamed, so a crash never leaves half a lock).
    pub fn write(&self) -> Result<(), RegistryError> {
        let path = self.project.join(LOCK_FILE);
        let mut plugins = self.plugins.clone();
        plugins.sort_by(|a, b| a.name.cmp(&b.name));
        let body = toml::to_string(&LockFile { trusted_keys: self.trusted_keys.clone(), plugin: plugins })
            .map_err(|e| RegistryError::Lock { path: path.clone(), message: e.to_string() })?;
        let text = format!("# Written by `trinity plugins install`; commit it with the project.\n\n{body}");
        let tmp = self.project.join(format!(".{LOCK_FILE}.tmp"));
        std::fs::write(&tmp, text).map_err(|source| RegistryError::Io { path: tmp.clone(), source })?;
        std::fs::rename(&tmp, &path).map_err(|source| RegistryError::Io { path, source })
    }

    /// Trusts publisher `key` (64 hex digits, checked to be an ed25519 public key) for later installs; returns
    /// whether it was new.
    pub fn trust(&mut self, key: &str) -> Result<bool, RegistryError> {
        let key = crate::signature::public_key_hex_of(&crate::signature::parse_public_key(key)?);
        if self.trusted_keys.contains(&key) {
            return Ok(false);
        }
        self.trusted_keys.push(key);
        Ok(true)
    }

    /// The lock file's path.
    pub fn path(&self) -> PathBuf {
        self.project.join(LOCK_FILE)
    }

    /// Pins `plugin`, replacing any earlier pin of the same name.
    pub fn pin(&mut self, plugin: LockedPlugin) {
        self.plugins.retain(|p| p.name != plugin.name);
        self.plugins.push(plugin);
        self.plugins.sort_by(|a, b| a.name.cmp(&b.name));
    }

    /// The pin of `name`.
    pub fn get(&self, name: &str) -> Option<&LockedPlugin> {
        self.plugins.iter().find(|p| p.name == name)
    }

    /// The stored file of an installed plugin, after checking that it still hashes to its pin; `None` when no
    /// plugin of that name is installed.
    pub fn resolve(&self, name: &str) -> Result<Option<PathBuf>, RegistryError> {
        let Some(pin) = self.get(name) else { return Ok(None) };
        let path = self.project.join(&pin.path);
        let bytes = std::fs::read(&path).map_err(|source| RegistryError::Io { path: path.clone(), source })?;
        let actual = crate::sha256_hex(&bytes);
        if actual != pin.sha256 {
            return Err(RegistryError::Tampered {
                name: pin.name.clone(),
                path,
                lock: self.project.join(LOCK_FILE),
                expected: pin.sha256.clone(),
                actual,
            });
        }
        Ok(Some(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin(name: &str, body: &[u8], dir: &Path) -> LockedPlugin {
        let path = PathBuf::from(format!("{name}.so"));
        std::fs::write(dir.join(&path), body).unwrap();
        LockedPlugin {
            name: name.to_owned(),
            kind: "algorithm".to_owned(),
            version: "0.1.0".to_owned(),
            source: "/r/x.so".to_owned(),
            sha256: crate::sha256_hex(body),
            path,
        }
    }

    #[test]
    fn pins_round_trip_and_replace() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Lock::read(dir.path()).unwrap().plugins.is_empty());
        let mut lock = Lock::read(dir.path()).unwrap();
        lock.pin(pin("b", b"1", dir.path()));
        lock.pin(pin("a", b"2", dir.path()));
        lock.pin(LockedPlugin { version: "0.2.0".into(), ..pin("b", b"3", dir.path()) });
        lock.write().unwrap();
        let back = Lock::read(dir.path()).unwrap();
        assert_eq!(
            back.plugins.iter().map(|p| (&*p.name, &*p.version)).collect::<Vec<_>>(),
            [("a", "0.1.0"), ("b", "0.2.0")]
        );
        assert_eq!(back.resolve("a").unwrap(), Some(dir.path().join("a.so")));
        assert_eq!(back.resolve("zzz").unwrap(), None);
    }

    #[test]
    fn trusted_keys_round_trip_once_each_and_bad_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = crate::public_key_hex(&ed25519_dalek::SigningKey::from_bytes(&[7; 32]));
        let mut lock = Lock::read(dir.path()).unwrap();
        assert!(lock.trust(&key.to_uppercase()).unwrap());
        assert!(!lock.trust(&key).unwrap(), "the same key, differently spelt, is trusted once");
        lock.pin(pin("a", b"1", dir.path()));
        lock.write().unwrap();
        let back = Lock::read(dir.path()).unwrap();
        assert_eq!(back.trusted_keys, [key]);
        assert_eq!(back.plugins.len(), 1);
        assert!(matches!(lock.trust("not a key"), Err(RegistryError::Key { .. })));
    }

    #[test]
    fn a_changed_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut lock = Lock::read(dir.path()).unwrap();
        lock.pin(pin("a", b"original", dir.path()));
        std::fs::write(dir.path().join("a.so"), b"evil").unwrap();
        let err = lock.resolve("a").unwrap_err().to_string();
        assert!(err.contains("`a`") && err.contains("refusing to load"), "{err}");
    }
}
