//! The Synchronizer: decides when weights move from trainer to explorer and carries them.
//!
//! *When* is Trinity-RFT's plan ([`crate::schedule`]): the trainer publishes after every `trainer_sync_interval`-th
//! train step, and the explorer syncs after every `explorer_sync_interval`-th explore step past `sync_offset`, so
//! it runs at most `sync_offset` steps ahead. `sync_style` decides who waits for whom when explorer and trainer run
//! apart:
//!
//! | style | trainer publishes | explorer at its sync points |
//! |---|---|---|
//! | `fixed` | every `sync_interval` steps | waits (up to `sync_timeout`) for the version its next step needs |
//! | `trainer_driven` | every `sync_interval` steps | takes the newest published version, never waits |
//! | `explorer_driven` | when an explorer asks | asks, and waits (up to `sync_timeout`) for the trainer's answer: new weights, or "nothing new" |
//! | `fully_async` | every `trainer_sync_interval` steps | has none: keeps `max_inflight_batches` batches running and loads each published version as soon as it appears |
//!
//! *How*: in one process the trainer's parameters are copied into the engine in place (`memory`); across
//! processes they go through a [`WeightStore`] in the run directory (`checkpoint`), which may be on a shared
//! file system. A version is the train step the weights come from; every experience is stamped with the version
//! that sampled it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use trinity_model::{SafetensorsWeights, SafetensorsWriter};

use crate::error::RftError;
use crate::json_file;
use crate::models::model_error;

/// How often a waiting process looks at the store again, and how often it says what it waits for.
pub(crate) const POLL: Duration = Duration::from_millis(200);
pub(crate) const REPORT_EVERY: Duration = Duration::from_secs(30);

/// Published weights on disk: `<job>/sync/weights_<version>.safetensors`, and `latest.json` naming the newest.
///
/// Writers write beside the final name and rename, so a reader never sees half a file; `latest.json` is replaced
/// the same way after the weights are in place. The previous version is kept when a new one is published, so an
/// explorer that read `latest.json` just before can still open its file; older ones are removed (an open file
/// stays readable after removal on POSIX file systems).
#[derive(Debug, Clone)]
pub(crate) struct WeightStore {
    dir: PathBuf,
}

#[derive(Debug, Serialize, Deserialize)]
struct Latest {
    version: u64,
    file: String,
}

/// An explorer's request for new weights (`explorer_driven`), and the trainer's answer to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SyncRequest {
    /// Increases with every request of that explorer.
    pub seq: u64,
    /// The version the explorer holds.
    pub have: u64,
}

/// The file of one [`WeightStore::publish_parts`] being written.
#[derive(Debug)]
pub(crate) struct PartFile {
    writer: SafetensorsWriter,
    path: PathBuf,
}

impl PartFile {
    /// Writes the next tensors of the file (in the order of its specs).
    pub(crate) fn push(&mut self, part: Vec<(String, tch::Tensor)>) -> Result<(), RftError> {
        for (name, t) in part {
            self.writer.write(&name, &t).map_err(|e| model_error(&self.path, e))?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SyncAnswer {
    /// The request answered.
    pub seq: u64,
    /// The version published for it (it may equal the explorer's when the trainer has nothing newer).
    pub version: u64,
}

impl WeightStore {
    pub(crate) fn open(job_dir: &Path) -> Result<WeightStore, RftError> {
        let dir = job_dir.join("sync");
        std::fs::create_dir_all(&dir).map_err(|source| RftError::Io { path: dir.clone(), source })?;
        Ok(WeightStore { dir })
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Publishes `weights` as `version`, replacing any newer version a trainer killed before its checkpoint left
    /// behind (a restarted trainer republishes its checkpoint's weights, so versions never run ahead of it).
    #[cfg(test)]
    pub(crate) fn publish(&self, version: u64, weights: &[(String, tch::Tensor)]) -> Result<(), RftError> {
        let specs = weights.iter().map(|(name, t)| trinity_model::TensorSpec::of(name, t)).collect();
        self.publish_parts(version, specs, |file| {
            file.push(weights.iter().map(|(name, t)| (name.clone(), t.shallow_clone())).collect())
        })
    }

    /// [`WeightStore::publish`] from weights that come part by part (`specs`: their names, dtypes and shapes, in
    /// order): `feed` gives each part to the [`PartFile`], which writes it and lets it go, so the file is written
    /// without the whole model in memory. Nothing is published unless `feed` succeeded and every tensor came.
    pub(crate) fn publish_parts(
        &self,
        version: u64,
        specs: Vec<trinity_model::TensorSpec>,
        feed: impl FnOnce(&mut PartFile) -> Result<(), RftError>,
    ) -> Result<(), RftError> {
        let file = format!("weights_{version}.safetensors");
        let partial = self.dir.join(format!(".{file}.partial"));
        let writer = SafetensorsWriter::create(&partial, specs).map_err(|e| model_error(&partial, e))?;
        let mut part_file = PartFile { writer, path: partial.clone() };
        let written =
            feed(&mut part_file).and_then(|()| part_file.writer.finish().map_err(|e| model_error(&partial, e)));
        if let Err(error) = written {
            let _ = std::fs::remove_file(&partial);
            return Err(error);
        }
        self.rename(&partial, &self.dir.join(&file))?;
        self.write_json("latest.json", &Latest { version, file })?;
        self.prune(version)?;
        Ok(())
    }

    /// The newest published version.
    pub(crate) fn latest(&self) -> Result<Option<u64>, RftError> {
        Ok(self.read_json::<Latest>("latest.json")?.map(|l| l.version))
    }

    /// The newest published weights and their version. Retries when the file named by `latest.json` was pruned
    /// between reading the name and opening the file (two publishes in between).
    pub(crate) fn latest_weights(&self) -> Result<Option<(u64, SafetensorsWeights)>, RftError> {
        for _ in 0..10 {
            let Some(latest) = self.read_json::<Latest>("latest.json")? else {
                return Ok(None);
            };
            let path = self.dir.join(&latest.file);
            match SafetensorsWeights::open_files(std::slice::from_ref(&path)) {
                Ok(weights) => return Ok(Some((latest.version, weights))),
                Err(trinity_model::ModelError::MissingFile { .. }) => continue,
                Err(e) => return Err(model_error(&path, e)),
            }
        }
        Err(RftError::Unsupported(format!(
            "{}: the published weights changed ten times while being opened; is a trainer publishing in a loop?",
            self.dir.display()
        )))
    }

    /// Records explorer `explorer`'s request for new weights.
    pub(crate) fn request(&self, explorer: &str, request: SyncRequest) -> Result<(), RftError> {
        self.write_json(&format!("request_{explorer}.json"), &request)
    }

    /// Requests not answered yet, by explorer name.
    pub(crate) fn pending_requests(&self) -> Result<Vec<(String, SyncRequest)>, RftError> {
        let mut pending = Vec::new();
        let entries = std::fs::read_dir(&self.dir).map_err(|source| RftError::Io { path: self.dir.clone(), source })?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(explorer) = name.strip_prefix("request_").and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            let Some(request) = self.read_json::<SyncRequest>(&name)? else { continue };
            let answered = self.answer(explorer)?.is_some_and(|a| a.seq >= request.seq);
            if !answered {
                pending.push((explorer.to_owned(), request));
            }
        }
        pending.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(pending)
    }

    pub(crate) fn write_answer(&self, explorer: &str, answer: SyncAnswer) -> Result<(), RftError> {
        self.write_json(&format!("answer_{explorer}.json"), &answer)
    }

    pub(crate) fn answer(&self, explorer: &str) -> Result<Option<SyncAnswer>, RftError> {
        self.read_json(&format!("answer_{explorer}.json"))
    }

    /// Marks the trainer finished after train step `step` (explorers waiting for weights then stop waiting), or
    /// clears the mark (`None`: a trainer is running again).
    pub(crate) fn set_trainer_finished(&self, step: Option<u64>) -> Result<(), RftError> {
        match step {
            Some(step) => self.write_json("trainer_finished.json", &step),
            None => match std::fs::remove_file(self.dir.join("trainer_finished.json")) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(RftError::Io { path: self.dir.join("trainer_finished.json"), source: e })
                }
                _ => Ok(()),
            },
        }
    }

    /// The step the trainer finished after, when it has finished.
    pub(crate) fn trainer_finished(&self) -> Result<Option<u64>, RftError> {
        self.read_json("trainer_finished.json")
    }

    /// Removes weight files other than `keep` and the one published just before it.
    fn prune(&self, keep: u64) -> Result<(), RftError> {
        let mut versions: Vec<u64> = std::fs::read_dir(&self.dir)
            .map_err(|source| RftError::Io { path: self.dir.clone(), source })?
            .flatten()
            .filter_map(|e| {
                e.file_name().to_str()?.strip_prefix("weights_")?.strip_suffix(".safetensors")?.parse().ok()
            })
            .collect();
        versions.sort_unstable();
        let previous = versions.iter().copied().filter(|&v| v < keep).max();
        for version in versions {
            if version != keep && Some(version) != previous {
                let path = self.dir.join(format!("weights_{version}.safetensors"));
                std::fs::remove_file(&path).map_err(|source| RftError::Io { path, source })?;
            }
        }
        Ok(())
    }

    fn write_json<T: Serialize>(&self, name: &str, value: &T) -> Result<(), RftError> {
        json_file::write(&self.dir.join(name), value)
    }

    fn read_json<T: for<'de> Deserialize<'de>>(&self, name: &str) -> Result<Option<T>, RftError> {
        json_file::read(&self.dir.join(name))
    }

    fn rename(&self, from: &Path, to: &Path) -> Result<(), RftError> {
        std::fs::rename(from, to).map_err(|source| RftError::Io { path: to.to_owned(), source })
    }
}

/// Reads every parameter named in `names` from published weights.
pub(crate) fn take_named(
    stored: &SafetensorsWeights,
    names: Vec<String>,
    dir: &Path,
) -> Result<Vec<(String, tch::Tensor)>, RftError> {
    names
        .into_iter()
        .map(|name| {
            let tensor = stored.get(&name).map_err(|e| model_error(dir, e))?;
            Ok((name, tensor))
        })
        .collect()
}

/// Waits until `ready` returns a value, polling every [`POLL`] and saying every [`REPORT_EVERY`] what it waits
/// for (`what`); after `timeout` it fails with `on_timeout`'s message.
pub(crate) async fn wait_until<T>(
    timeout: Duration,
    what: impl Fn() -> String,
    on_timeout: impl FnOnce() -> String,
    mut ready: impl FnMut() -> Result<Option<T>, RftError>,
) -> Result<T, RftError> {
    let started = Instant::now();
    let mut reported = Instant::now();
    loop {
        if let Some(value) = ready()? {
            return Ok(value);
        }
        if started.elapsed() >= timeout {
            return Err(RftError::SyncTimeout(on_timeout()));
        }
        if reported.elapsed() >= REPORT_EVERY {
            tracing::info!("{} ({:.0} s of {:.0} s)", what(), started.elapsed().as_secs_f64(), timeout.as_secs_f64());
            reported = Instant::now();
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(value: f32) -> Vec<(String, tch::Tensor)> {
        vec![("w".to_owned(), tch::Tensor::from_slice(&[value, value]))]
    }

    #[test]
    fn publishing_keeps_the_newest_two_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = WeightStore::open(dir.path()).unwrap();
        assert_eq!(store.latest().unwrap(), None);
        assert!(store.latest_weights().unwrap().is_none());
        for version in [2, 4, 6] {
            store.publish(version, &weights(version as f32)).unwrap();
        }
        assert_eq!(store.latest().unwrap(), Some(6));
        let (version, stored) = store.latest_weights().unwrap().unwrap();
        assert_eq!(version, 6);
        assert_eq!(stored.get("w").unwrap().double_value(&[1]), 6.0);
        let mut files: Vec<String> =
            std::fs::read_dir(store.dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        files.sort();
        assert_eq!(files, ["latest.json", "weights_4.safetensors", "weights_6.safetensors"]);
    }

    #[test]
    fn a_restarted_trainer_replaces_versions_it_never_checkpointed() {
        let dir = tempfile::tempdir().unwrap();
        let store = WeightStore::open(dir.path()).unwrap();
        store.publish(3, &weights(3.0)).unwrap();
        store.publish(4, &weights(4.0)).unwrap();
        // Killed after publishing 4; its checkpoint is 2.
        store.publish(2, &weights(2.0)).unwrap();
        assert_eq!(store.latest().unwrap(), Some(2));
        let (_, stored) = store.latest_weights().unwrap().unwrap();
        assert_eq!(stored.get("w").unwrap().double_value(&[0]), 2.0);
        assert!(!store.dir().join("weights_4.safetensors").exists());
    }

    #[test]
    fn requests_are_pending_until_answered() {
        let dir = tempfile::tempdir().unwrap();
        let store = WeightStore::open(dir.path()).unwrap();
        store.request("explorer_b", SyncRequest { seq: 1, have: 0 }).unwrap();
        store.request("explorer_a", SyncRequest { seq: 4, have: 2 }).unwrap();
        store.write_answer("explorer_a", SyncAnswer { seq: 3, version: 2 }).unwrap();
        let pending = store.pending_requests().unwrap();
        assert_eq!(
            pending.iter().map(|(n, r)| (n.as_str(), r.seq)).collect::<Vec<_>>(),
            [("explorer_a", 4), ("explorer_b", 1)]
        );
        store.write_answer("explorer_a", SyncAnswer { seq: 4, version: 5 }).unwrap();
        assert_eq!(store.pending_requests().unwrap().len(), 1);
        assert_eq!(store.answer("explorer_a").unwrap(), Some(SyncAnswer { seq: 4, version: 5 }));
    }

    #[test]
    fn the_finished_mark_comes_and_goes() {
        let dir = tempfile::tempdir().unwrap();
        let store = WeightStore::open(dir.path()).unwrap();
        assert_eq!(store.trainer_finished().unwrap(), None);
        store.set_trainer_finished(Some(9)).unwrap();
        assert_eq!(store.trainer_finished().unwrap(), Some(9));
        store.set_trainer_finished(None).unwrap();
        store.set_trainer_finished(None).unwrap();
        assert_eq!(store.trainer_finished().unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_ends_with_a_named_timeout() {
        let err =
            wait_until(Duration::from_secs(5), || "waiting".into(), || "no weights ≥ 3".into(), || Ok(None::<u64>))
                .await
                .unwrap_err();
        assert!(err.to_string().contains("no weights ≥ 3"), "{err}");
        let mut calls = 0;
        let value = wait_until(Duration::from_secs(5), String::new, String::new, || {
            calls += 1;
            Ok((calls == 3).then_some(7))
        })
        .await
        .unwrap();
        assert_eq!(value, 7);
    }
}
