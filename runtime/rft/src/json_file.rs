//! Small JSON state files of a run (`bench_meta.json`, `stage_meta.json`, the weight store's records), written
//! beside their final name and renamed into place, so a process killed mid-write never leaves half a file and a
//! reader in another process sees the old or the new content.

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::RftError;

/// The file's content, or `None` when it does not exist.
pub(crate) fn read<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, RftError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| RftError::Unsupported(format!("{}: unreadable: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(RftError::Io { path: path.to_owned(), source }),
    }
}

/// Replaces the file with `value`, atomically.
pub(crate) fn write<T: Serialize>(path: &Path, value: &T) -> Result<(), RftError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| RftError::Io { path: parent.to_owned(), source })?;
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let partial = path.with_file_name(format!(".{name}.partial"));
    let text = serde_json::to_vec(value).map_err(|e| RftError::Unsupported(format!("{}: {e}", path.display())))?;
    std::fs::write(&partial, text).map_err(|source| RftError::Io { path: partial.clone(), source })?;
    std::fs::rename(&partial, path).map_err(|source| RftError::Io { path: path.to_owned(), source })
}
