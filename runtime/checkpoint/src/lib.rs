//! Checkpoint directories that a crash can never leave half-written.
//!
//! Layout (Trinity-RFT's): `<job_dir>/global_step_<N>/` holds whatever the caller writes (HF weights, optimizer
//! state, buffer and selector positions) plus `meta.json`. A checkpoint is written into a hidden temporary
//! directory beside it, synced, and renamed into place; the rename is atomic on POSIX file systems, so a
//! `global_step_<N>` directory either exists complete or not at all. `meta.json` is written last inside the
//! temporary directory, and only directories that have it count as complete — a second line of defence for
//! file systems where rename is not atomic.
//!
//! On resume, [`CheckpointDir::latest_intact`] returns the highest complete step whose files are as they were
//! saved (`verify.rs`), setting newer damaged ones aside; leftover temporary directories of killed runs are
//! removed by [`CheckpointDir::open`].

mod verify;

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

const META: &str = "meta.json";
const PREFIX: &str = "global_step_";
const TEMP_PREFIX: &str = ".tmp-global_step_";

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: invalid checkpoint metadata: {reason}")]
    Meta { path: PathBuf, reason: String },
    #[error("checkpoint global_step_{step} already exists in {dir}")]
    Exists { dir: PathBuf, step: u64 },
    #[error("writing checkpoint global_step_{step} failed: {reason}")]
    Write { step: u64, reason: String },
    #[error("{path}: damaged checkpoint: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

/// The checkpoint a run resumes from, and the newer ones it could not.
#[derive(Debug)]
pub struct ResumePoint {
    /// The newest checkpoint that verified, if any.
    pub checkpoint: Option<Checkpoint>,
    /// Newer checkpoints that failed [`Checkpoint::verify`], newest first: each with why, and where it was
    /// moved so that the resumed run can write its step again while the damaged files stay for inspection.
    pub skipped: Vec<Skipped>,
}

/// A damaged checkpoint, set aside.
#[derive(Debug)]
pub struct Skipped {
    pub step: u64,
    pub error: CheckpointError,
    pub moved_to: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io { path: path.to_owned(), source }
}

/// The checkpoint directory of one experiment (`<checkpoint_root_dir>/<project>/[<group>/]<name>`).
#[derive(Debug, Clone)]
pub struct CheckpointDir {
    dir: PathBuf,
}

/// One complete checkpoint found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub step: u64,
    pub path: PathBuf,
}

impl Checkpoint {
    /// Reads this checkpoint's `meta.json`.
    pub fn meta<M: DeserializeOwned>(&self) -> Result<M, CheckpointError> {
        let path = self.path.join(META);
        let text = fs::read_to_string(&path).map_err(io(&path))?;
        serde_json::from_str(&text).map_err(|e| CheckpointError::Meta { path, reason: e.to_string() })
    }
}

impl CheckpointDir {
    /// Opens (creating) the experiment directory and removes temporary directories left by killed runs.
    pub fn open(dir: &Path) -> Result<CheckpointDir, CheckpointError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        for entry in fs::read_dir(dir).map_err(io(dir))? {
            let entry = entry.map_err(io(dir))?;
            if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                fs::remove_dir_all(entry.path()).map_err(io(&entry.path()))?;
            }
        }
        Ok(CheckpointDir { dir: dir.to_owned() })
    }

    /// The experiment directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Every complete checkpoint, oldest first.
    pub fn list(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        let mut found = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let entry = entry.map_err(io(&self.dir))?;
            let name = entry.file_name();
            let Some(step) = name.to_string_lossy().strip_prefix(PREFIX).and_then(|s| s.parse::<u64>().ok()) else {
                continue;
            };
            let path = entry.path();
            if path.join(META).is_file() {
                found.push(Checkpoint { step, path });
            }
        }
        found.sort_by_key(|c| c.step);
        Ok(found)
    }

    /// The newest complete checkpoint, if any.
    pub fn latest(&self) -> Result<Option<Checkpoint>, CheckpointError> {
        Ok(self.list()?.pop())
    }

    /// The newest complete checkpoint that verifies, setting each newer damaged one aside as
    /// `global_step_<N>.damaged-<k>` (which [`CheckpointDir::list`] does not count).
    pub fn latest_intact(&self) -> Result<ResumePoint, CheckpointError> {
        let mut skipped = Vec::new();
        let mut all = self.list()?;
        while let Some(checkpoint) = all.pop() {
            match checkpoint.verify() {
                Ok(()) => return Ok(ResumePoint { checkpoint: Some(checkpoint), skipped }),
                Err(error) => {
                    let moved_to = (0u32..)
                        .map(|k| self.dir.join(format!("{PREFIX}{}.damaged-{k}", checkpoint.step)))
                        .find(|path| !path.exists())
                        .unwrap_or_else(|| self.dir.join(format!("{PREFIX}{}.damaged", checkpoint.step)));
                    fs::rename(&checkpoint.path, &moved_to).map_err(io(&moved_to))?;
                    skipped.push(Skipped { step: checkpoint.step, error, moved_to });
                }
            }
        }
        Ok(ResumePoint { checkpoint: None, skipped })
    }

    /// Writes checkpoint `step`: `fill` writes its files into a fresh directory, then `meta` is written, the
    /// directory synced and renamed into place. On any error the temporary directory is removed.
    pub fn save<M, F>(&self, step: u64, meta: &M, fill: F) -> Result<Checkpoint, CheckpointError>
    where
        M: Serialize,
        F: FnOnce(&Path) -> Result<(), String>,
    {
        let final_path = self.dir.join(format!("{PREFIX}{step}"));
        if final_path.join(META).exists() {
            return Err(CheckpointError::Exists { dir: self.dir.clone(), step });
        }
        if final_path.exists() {
            // An incomplete directory (no meta.json) is debris of a non-atomic file system; replace it.
            fs::remove_dir_all(&final_path).map_err(io(&final_path))?;
        }
        let temp = self.dir.join(format!("{TEMP_PREFIX}{step}-{}", std::process::id()));
        let result = (|| {
            fs::create_dir_all(&temp).map_err(io(&temp))?;
            fill(&temp).map_err(|reason| CheckpointError::Write { step, reason })?;
            let manifest_path = temp.join(verify::MANIFEST);
            let manifest = serde_json::to_string_pretty(&verify::manifest(&temp)?)
                .map_err(|e| CheckpointError::Meta { path: manifest_path.clone(), reason: e.to_string() })?;
            fs::write(&manifest_path, manifest).map_err(io(&manifest_path))?;
            let meta_path = temp.join(META);
            let text = serde_json::to_string_pretty(meta)
                .map_err(|e| CheckpointError::Meta { path: meta_path.clone(), reason: e.to_string() })?;
            fs::write(&meta_path, text).map_err(io(&meta_path))?;
            sync_tree(&temp)?;
            fs::rename(&temp, &final_path).map_err(io(&final_path))?;
            sync_dir(&self.dir)
        })();
        if let Err(error) = result {
            // Best effort: the temporary directory is garbage either way, and `open` removes it next time.
            let _ = fs::remove_dir_all(&temp);
            return Err(error);
        }
        Ok(Checkpoint { step, path: final_path })
    }

    /// Deletes the oldest complete checkpoints so that at most `keep` remain.
    pub fn prune(&self, keep: usize) -> Result<Vec<u64>, CheckpointError> {
        let all = self.list()?;
        let excess = all.len().saturating_sub(keep);
        let mut removed = Vec::new();
        for checkpoint in &all[..excess] {
            fs::remove_dir_all(&checkpoint.path).map_err(io(&checkpoint.path))?;
            removed.push(checkpoint.step);
        }
        Ok(removed)
    }
}

/// fsyncs every file under `dir`, then `dir` itself, so the rename publishes data that is on disk.
fn sync_tree(dir: &Path) -> Result<(), CheckpointError> {
    for entry in fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            fs::File::open(&path).and_then(|f| f.sync_all()).map_err(io(&path))?;
        }
    }
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    fs::File::open(dir).and_then(|f| f.sync_all()).map_err(io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::tests as verify_tests;
    use serde::Deserialize;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Meta {
        explorer_step: u64,
    }

    #[test]
    fn saves_atomically_and_finds_the_latest() {
        let root = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::open(root.path()).unwrap();
        assert_eq!(dir.latest().unwrap(), None);
        for step in [2, 10, 4] {
            dir.save(step, &Meta { explorer_step: step }, |path| {
                fs::write(path.join("weights.bin"), [step as u8]).map_err(|e| e.to_string())
            })
            .unwrap();
        }
        let latest = dir.latest().unwrap().unwrap();
        assert_eq!(latest.step, 10, "numeric, not lexical, order");
        assert_eq!(latest.meta::<Meta>().unwrap(), Meta { explorer_step: 10 });
        assert_eq!(fs::read(latest.path.join("weights.bin")).unwrap(), [10]);
        let error = dir.save(10, &Meta { explorer_step: 10 }, |_| Ok(())).unwrap_err();
        assert!(matches!(error, CheckpointError::Exists { step: 10, .. }));
    }

    #[test]
    fn a_failed_or_killed_write_leaves_no_checkpoint() {
        let root = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::open(root.path()).unwrap();
        dir.save(1, &Meta { explorer_step: 1 }, |_| Ok(())).unwrap();
        let error = dir.save(2, &Meta { explorer_step: 2 }, |_| Err("disk full".to_owned())).unwrap_err();
        assert!(error.to_string().contains("disk full"), "{error}");
        // A run killed mid-write leaves a temporary directory and a directory without meta.json.
        fs::create_dir_all(root.path().join(".tmp-global_step_3-999")).unwrap();
        fs::create_dir_all(root.path().join("global_step_4")).unwrap();
        let dir = CheckpointDir::open(root.path()).unwrap();
        assert_eq!(dir.latest().unwrap().unwrap().step, 1);
        assert!(!root.path().join(".tmp-global_step_3-999").exists());
        assert_eq!(fs::read_dir(root.path()).unwrap().count(), 2, "global_step_1 and the incomplete global_step_4");
        dir.save(4, &Meta { explorer_step: 4 }, |_| Ok(())).unwrap();
        assert_eq!(dir.latest().unwrap().unwrap().step, 4, "the incomplete directory was replaced");
    }

    #[test]
    fn resumes_from_the_newest_intact_checkpoint_and_sets_damaged_ones_aside() {
        let root = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::open(root.path()).unwrap();
        for step in 1..=4 {
            dir.save(step, &Meta { explorer_step: step }, |path| {
                fs::create_dir_all(path.join("hf")).map_err(|e| e.to_string())?;
                fs::write(path.join("hf/model.safetensors"), verify_tests::safetensors(8))
                    .map_err(|e| e.to_string())?;
                fs::write(path.join("state.bin"), [step as u8; 16]).map_err(|e| e.to_string())
            })
            .unwrap();
        }
        let intact = dir.latest_intact().unwrap();
        assert_eq!((intact.checkpoint.unwrap().step, intact.skipped.len()), (4, 0));
        // Step 4's weights truncated, step 3's other file shortened, step 2's meta.json garbled.
        let weights = root.path().join("global_step_4/hf/model.safetensors");
        let bytes = fs::read(&weights).unwrap();
        fs::write(&weights, &bytes[..bytes.len() - 4]).unwrap();
        fs::write(root.path().join("global_step_3/state.bin"), [0u8; 3]).unwrap();
        fs::write(root.path().join("global_step_2/meta.json"), "{\"explorer_st").unwrap();
        let resume = dir.latest_intact().unwrap();
        assert_eq!(resume.checkpoint.as_ref().map(|c| c.step), Some(1));
        let skipped: Vec<(u64, String)> = resume.skipped.iter().map(|s| (s.step, s.error.to_string())).collect();
        assert_eq!(skipped.iter().map(|s| s.0).collect::<Vec<_>>(), [4, 3, 2]);
        assert!(skipped[0].1.contains("hf/model.safetensors has 91 bytes, saved with 95"), "{skipped:?}");
        assert!(skipped[1].1.contains("state.bin has 3 bytes, saved with 16"), "{skipped:?}");
        assert!(skipped[2].1.contains("meta.json is not valid JSON"), "{skipped:?}");
        assert!(resume.skipped[0].moved_to.ends_with("global_step_4.damaged-0"));
        assert!(resume.skipped[0].moved_to.join("hf/model.safetensors").is_file(), "the damaged files are kept");
        assert_eq!(dir.list().unwrap().iter().map(|c| c.step).collect::<Vec<_>>(), [1]);
        // The resumed run writes step 2 again.
        dir.save(2, &Meta { explorer_step: 2 }, |_| Ok(())).unwrap();
        assert_eq!(dir.latest_intact().unwrap().checkpoint.unwrap().step, 2);
    }

    #[test]
    fn a_deleted_file_fails_verification_and_an_old_checkpoint_without_manifest_is_checked_by_structure() {
        let root = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::open(root.path()).unwrap();
        let saved = dir
            .save(1, &Meta { explorer_step: 1 }, |path| fs::write(path.join("a.bin"), [1]).map_err(|e| e.to_string()))
            .unwrap();
        fs::remove_file(saved.path.join("a.bin")).unwrap();
        assert!(saved.verify().unwrap_err().to_string().contains("a.bin is missing"));
        fs::remove_file(saved.path.join("manifest.json")).unwrap();
        saved.verify().unwrap();
    }

    #[test]
    fn prunes_the_oldest() {
        let root = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::open(root.path()).unwrap();
        for step in 1..=4 {
            dir.save(step, &Meta { explorer_step: step }, |_| Ok(())).unwrap();
        }
        assert_eq!(dir.prune(2).unwrap(), vec![1, 2]);
        let steps: Vec<u64> = dir.list().unwrap().iter().map(|c| c.step).collect();
        assert_eq!(steps, vec![3, 4]);
    }
}
