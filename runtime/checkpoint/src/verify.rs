//! What makes a complete checkpoint one a run can resume from.
//!
//! Completeness (`meta.json` present) says the write finished; it says nothing of what happened to the files
//! since: a disk that filled during a copy, a file truncated or deleted by hand, bytes overwritten. Resuming from
//! such a checkpoint fails deep inside model loading, and every rerun fails the same way although an older
//! checkpoint is intact. So each save records every file's size in `manifest.json` (before `meta.json`), and a
//! resume checks, newest first: the manifest's files are there with their sizes, every `.json` file parses, and
//! every `.safetensors` file's header parses and accounts for the file's length exactly. That reads headers and
//! small files only. A checkpoint written before manifests existed is checked by the structural rules alone.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use crate::{Checkpoint, CheckpointError, io};

pub(crate) const MANIFEST: &str = "manifest.json";

/// Relative path (with `/`) → size in bytes, of every file of a checkpoint but the manifest and `meta.json`.
pub(crate) type Manifest = BTreeMap<String, u64>;

/// Lists the files under `dir` with their sizes.
pub(crate) fn manifest(dir: &Path) -> Result<Manifest, CheckpointError> {
    let mut files = Manifest::new();
    collect(dir, "", &mut files)?;
    Ok(files)
}

fn collect(dir: &Path, prefix: &str, files: &mut Manifest) -> Result<(), CheckpointError> {
    for entry in fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let relative = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        let path = entry.path();
        let metadata = entry.metadata().map_err(io(&path))?;
        if metadata.is_dir() {
            collect(&path, &relative, files)?;
        } else if relative != MANIFEST && relative != crate::META {
            files.insert(relative, metadata.len());
        }
    }
    Ok(())
}

impl Checkpoint {
    /// Checks that the checkpoint's files are as its save left them (see the module docs); the error says
    /// which file is wrong and how.
    pub fn verify(&self) -> Result<(), CheckpointError> {
        let corrupt = |reason: String| CheckpointError::Corrupt { path: self.path.clone(), reason };
        let manifest_path = self.path.join(MANIFEST);
        if manifest_path.is_file() {
            let text = fs::read_to_string(&manifest_path).map_err(io(&manifest_path))?;
            let recorded: Manifest =
                serde_json::from_str(&text).map_err(|e| corrupt(format!("{MANIFEST} is unreadable: {e}")))?;
            for (file, size) in &recorded {
                match fs::metadata(self.path.join(file)) {
                    Ok(found) if found.len() == *size => {}
                    Ok(found) => return Err(corrupt(format!("{file} has {} bytes, saved with {size}", found.len()))),
                    Err(_) => return Err(corrupt(format!("{file} is missing"))),
                }
            }
        }
        let mut files = manifest(&self.path)?;
        files.insert(crate::META.to_owned(), 0);
        for file in files.keys() {
            let path = self.path.join(file);
            if file.ends_with(".json") {
                let text = fs::read(&path).map_err(io(&path))?;
                serde_json::from_slice::<serde_json::Value>(&text)
                    .map_err(|e| corrupt(format!("{file} is not valid JSON: {e}")))?;
            } else if file.ends_with(".safetensors") {
                check_safetensors(&path).map_err(|reason| corrupt(format!("{file}: {reason}")))?;
            }
        }
        Ok(())
    }
}

/// A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor to its
/// `data_offsets` within the data that follows, and the data; a whole file ends exactly where the last
/// tensor's data does.
fn check_safetensors(path: &Path) -> Result<(), String> {
    use std::io::Read;
    let mut file = fs::File::open(path).map_err(|e| e.to_string())?;
    let length = file.metadata().map_err(|e| e.to_string())?.len();
    let mut prefix = [0u8; 8];
    file.read_exact(&mut prefix).map_err(|_| format!("{length} bytes, too short for a safetensors header"))?;
    let header_len = u64::from_le_bytes(prefix);
    if header_len > length.saturating_sub(8) {
        return Err(format!("header of {header_len} bytes in a file of {length}"));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(|e| e.to_string())?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| format!("unreadable header: {e}"))?;
    let mut data_end = 0u64;
    for (name, tensor) in &header {
        if name == "__metadata__" {
            continue;
        }
        let end = tensor["data_offsets"][1].as_u64().ok_or_else(|| format!("tensor `{name}` has no data_offsets"))?;
        data_end = data_end.max(end);
    }
    let expected = 8 + header_len + data_end;
    if expected != length {
        return Err(format!("{length} bytes where its header accounts for {expected} (truncated or overwritten)"));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A safetensors file of one f32 tensor of `n` values.
    pub(crate) fn safetensors(n: usize) -> Vec<u8> {
        let header = format!(r#"{{"w":{{"dtype":"F32","shape":[{n}],"data_offsets":[0,{}]}}}}"#, 4 * n);
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend(std::iter::repeat_n(0u8, 4 * n));
        bytes
    }

    #[test]
    fn safetensors_structure_is_checked_against_the_file_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        fs::write(&path, safetensors(4)).unwrap();
        check_safetensors(&path).unwrap();
        let mut bytes = safetensors(4);
        bytes.truncate(bytes.len() - 3);
        fs::write(&path, &bytes).unwrap();
        assert!(check_safetensors(&path).unwrap_err().contains("truncated"));
        fs::write(&path, [1, 2, 3]).unwrap();
        assert!(check_safetensors(&path).unwrap_err().contains("too short"));
        let mut bytes = safetensors(4);
        bytes[12] = b'#';
        fs::write(&path, &bytes).unwrap();
        assert!(check_safetensors(&path).unwrap_err().contains("unreadable header"));
    }
}
