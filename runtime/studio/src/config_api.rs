//! The config page's API: validate (through the binary's `--dry-run` path), the JSON Schema for completion, the
//! example configs to start from, and saving.
//!
//! Saving writes only below the studio's working directory (a relative path without `..`, in a folder whose
//! canonical path is below it, to a file that is not a symlink) and only YAML files, through a temporary file and a
//! rename, so a failed save never leaves half a config behind. Examples are read the same way: only YAML files
//! whose canonical path is below the examples folder. Who may save at all is `request_guard`'s concern.

use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::StudioError;
use crate::query::Query;
use crate::server::{AppState, blocking};

/// Example configs are found this deep below the examples folder (`examples/<name>/<config>.yaml`).
const EXAMPLE_DEPTH: usize = 3;

pub(crate) async fn schema() -> axum::Json<Value> {
    axum::Json(trinity_config::schema::json_schema())
}

#[derive(Deserialize)]
struct ConfigText {
    text: String,
    #[serde(default)]
    path: Option<String>,
}

fn parse_body(body: &[u8]) -> Result<ConfigText, StudioError> {
    serde_json::from_slice(body).map_err(|e| StudioError::BadBody(format!("expected {{\"text\", \"path\"}}: {e}")))
}

pub(crate) async fn validate(
    State(state): State<Arc<AppState>>,
    body: axum::body::Bytes,
) -> Result<axum::Json<Value>, StudioError> {
    let request = parse_body(&body)?;
    blocking(move || {
        let path = PathBuf::from(request.path.as_deref().unwrap_or("config.yaml"));
        let validation = state.host.validate(&request.text, &path);
        Ok(axum::Json(json!({
            "ok": validation.problems.is_empty(),
            "problems": validation.problems,
            "notes": validation.notes,
            "resolved": validation.resolved,
        })))
    })
    .await
}

pub(crate) async fn save(
    State(state): State<Arc<AppState>>,
    body: axum::body::Bytes,
) -> Result<axum::Json<Value>, StudioError> {
    let request = parse_body(&body)?;
    blocking(move || {
        let wanted = request.path.unwrap_or_default();
        let target = save_target(&state.workdir, &wanted)?;
        write_through_partial(&target, &request.text)
            .map_err(|e| StudioError::Save { path: wanted.clone(), message: e.to_string() })?;
        Ok(axum::Json(json!({ "saved": target.display().to_string() })))
    })
    .await
}

/// Writes `text` to a hidden file beside `target`, then renames it over `target`, so a failed save never leaves half
/// a config behind. The partial file is created anew (a stale one, or a symlink planted under its name, is removed
/// first, never written through).
fn write_through_partial(target: &Path, text: &str) -> std::io::Result<()> {
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let partial = target.with_file_name(format!(".{name}.partial"));
    if let Err(e) = std::fs::remove_file(&partial)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(e);
    }
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&partial)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .and_then(|()| std::fs::rename(&partial, target));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

/// Where a save of `wanted` goes: a `.yaml`/`.yml` file in an existing folder that is, once every symlink is
/// resolved, below `workdir`. The path names are checked first (relative, no `..`), then the folder's canonical
/// path, since a symlinked folder below `workdir` can point anywhere; the file itself must not be a symlink
/// (whatever it points to, a save replaces what the user sees under that name, not where it points).
fn save_target(workdir: &Path, wanted: &str) -> Result<PathBuf, StudioError> {
    let refuse = |message: &str| StudioError::Save { path: wanted.to_owned(), message: message.to_owned() };
    let relative = Path::new(wanted);
    if wanted.is_empty() || !relative.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(refuse("give a relative path below the studio's working directory, without `..`"));
    }
    if !is_yaml(relative) {
        return Err(refuse("a config is saved as a .yaml or .yml file"));
    }
    let (Some(parent), Some(name)) = (workdir.join(relative).parent().map(Path::to_owned), relative.file_name()) else {
        return Err(refuse("give a file name"));
    };
    let workdir = std::fs::canonicalize(workdir).map_err(|_| refuse("the studio's working directory is gone"))?;
    let folder = match std::fs::canonicalize(&parent) {
        Ok(folder) if folder.is_dir() => folder,
        _ => return Err(refuse("its folder does not exist")),
    };
    if !folder.starts_with(&workdir) {
        return Err(refuse("its folder is a symlink to outside the studio's working directory"));
    }
    let target = folder.join(name);
    match std::fs::symlink_metadata(&target) {
        Ok(meta) if meta.file_type().is_symlink() => Err(refuse("it is a symlink; save to the file it points to")),
        Ok(meta) if !meta.is_file() => Err(refuse("it exists and is not a file")),
        _ => Ok(target),
    }
}

fn is_yaml(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "yaml" || e == "yml")
}

pub(crate) async fn examples(State(state): State<Arc<AppState>>) -> Result<axum::Json<Value>, StudioError> {
    blocking(move || {
        let mut found = Vec::new();
        if let Some(dir) = &state.examples {
            collect_yaml(dir, dir, 0, &mut found);
        }
        found.sort();
        Ok(axum::Json(json!({ "examples": found })))
    })
    .await
}

/// The examples below `dir` that [`example_file`] serves. Symlinked folders are not entered.
fn collect_yaml(root: &Path, dir: &Path, depth: usize, found: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else { continue };
        let relative = path.strip_prefix(root).unwrap_or(&path).display().to_string();
        if kind.is_dir() && depth + 1 < EXAMPLE_DEPTH {
            collect_yaml(root, &path, depth + 1, found);
        } else if is_yaml(&path) && example_file(root, &relative).is_ok() {
            found.push(relative);
        }
    }
}

/// The file an example read of `wanted` (relative to the examples folder `dir`) serves: a `.yaml`/`.yml` file
/// whose canonical path is below `dir`'s and is itself YAML, so a symlink named `x.yaml` serves neither a file
/// outside the examples nor one of another type.
fn example_file(dir: &Path, wanted: &str) -> Result<PathBuf, StudioError> {
    let relative = Path::new(wanted);
    if wanted.is_empty() || !relative.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(StudioError::query("path", "give a path as /api/examples lists it"));
    }
    if !is_yaml(relative) {
        return Err(StudioError::query("path", "examples are .yaml or .yml files"));
    }
    let root = std::fs::canonicalize(dir).map_err(StudioError::io(dir))?;
    let joined = dir.join(relative);
    let path = std::fs::canonicalize(&joined).map_err(StudioError::io(&joined))?;
    if !path.starts_with(&root) || !is_yaml(&path) || !path.is_file() {
        return Err(StudioError::query("path", format!("`{wanted}` is a link to outside the examples' YAML files")));
    }
    Ok(path)
}

/// One example's text (`path` relative to the examples folder, as `/api/examples` lists it).
pub(crate) async fn example(
    State(state): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Result<axum::Json<Value>, StudioError> {
    blocking(move || {
        let query = Query::parse(raw.as_deref());
        let wanted = query.require("path")?.to_owned();
        let dir = state.examples.as_ref().ok_or_else(|| StudioError::query("path", "the studio has no examples"))?;
        let file = example_file(dir, &wanted)?;
        let text = std::fs::read_to_string(&file).map_err(StudioError::io(&file))?;
        // The path the config is validated and saved under: the example's path from the working directory.
        let path = dir.join(&wanted);
        let shown = path.strip_prefix(&state.workdir).unwrap_or(&path).display().to_string();
        Ok(axum::Json(json!({ "path": shown, "text": text })))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn saves_only_yaml_below_the_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("configs")).unwrap();
        let canonical = std::fs::canonicalize(dir.path()).unwrap();
        assert_eq!(save_target(dir.path(), "configs/a.yaml").unwrap(), canonical.join("configs/a.yaml"));
        for bad in ["", "/etc/a.yaml", "../a.yaml", "configs/../../a.yaml", "a.txt", "missing/a.yaml", "configs"] {
            assert!(matches!(save_target(dir.path(), bad), Err(StudioError::Save { .. })), "{bad}");
        }
    }

    #[test]
    fn a_save_through_a_symlink_is_refused_and_writes_nothing() {
        let work = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("victim.yaml"), "kept: 1\n").unwrap();
        // A symlinked folder that leads outside, and a symlinked file (to outside, and to a file inside).
        symlink(outside.path(), work.path().join("linked")).unwrap();
        symlink(outside.path().join("victim.yaml"), work.path().join("file.yaml")).unwrap();
        std::fs::write(work.path().join("real.yaml"), "inside: 1\n").unwrap();
        symlink(work.path().join("real.yaml"), work.path().join("alias.yaml")).unwrap();
        let refused = |wanted: &str| match save_target(work.path(), wanted) {
            Err(StudioError::Save { message, .. }) => message,
            other => panic!("{wanted}: {other:?}"),
        };
        assert!(refused("linked/victim.yaml").contains("outside"));
        assert!(refused("linked/new.yaml").contains("outside"));
        assert!(refused("file.yaml").contains("symlink"));
        assert!(refused("alias.yaml").contains("symlink"));
        assert_eq!(std::fs::read_to_string(outside.path().join("victim.yaml")).unwrap(), "kept: 1\n");
        assert!(!outside.path().join("new.yaml").exists());
        // A symlinked folder that stays inside the working directory is still inside it.
        std::fs::create_dir(work.path().join("configs")).unwrap();
        symlink(work.path().join("configs"), work.path().join("also")).unwrap();
        let canonical = std::fs::canonicalize(work.path()).unwrap();
        assert_eq!(save_target(work.path(), "also/a.yaml").unwrap(), canonical.join("configs/a.yaml"));
    }

    #[test]
    fn a_save_replaces_the_file_and_a_planted_partial_link_is_not_followed() {
        let work = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("victim"), "kept").unwrap();
        symlink(outside.path().join("victim"), work.path().join(".a.yaml.partial")).unwrap();
        let target = save_target(work.path(), "a.yaml").unwrap();
        write_through_partial(&target, "new: 1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new: 1\n");
        assert_eq!(std::fs::read_to_string(outside.path().join("victim")).unwrap(), "kept");
        assert!(!work.path().join(".a.yaml.partial").exists());
    }

    #[test]
    fn examples_serve_yaml_inside_their_folder_only() {
        let examples = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let dir = examples.path();
        std::fs::create_dir(dir.join("quick")).unwrap();
        std::fs::write(dir.join("quick/quick.yaml"), "project: q\n").unwrap();
        std::fs::write(dir.join("quick/notes.txt"), "not a config").unwrap();
        std::fs::write(outside.path().join("secret.yaml"), "token: x\n").unwrap();
        std::fs::write(outside.path().join("id_rsa"), "key").unwrap();
        symlink(outside.path().join("secret.yaml"), dir.join("quick/secret.yaml")).unwrap();
        symlink(outside.path().join("id_rsa"), dir.join("quick/key.yaml")).unwrap();
        symlink(dir.join("quick/notes.txt"), dir.join("quick/notes.yaml")).unwrap();
        symlink(dir.join("quick/quick.yaml"), dir.join("quick/alias.yml")).unwrap();
        symlink(outside.path(), dir.join("away")).unwrap();
        assert_eq!(
            example_file(dir, "quick/quick.yaml").unwrap(),
            std::fs::canonicalize(dir.join("quick/quick.yaml")).unwrap()
        );
        assert!(example_file(dir, "quick/alias.yml").is_ok());
        for bad in ["quick/notes.txt", "quick/secret.yaml", "quick/key.yaml", "quick/notes.yaml", "away/secret.yaml"] {
            assert!(matches!(example_file(dir, bad), Err(StudioError::BadQuery { .. })), "{bad}");
        }
        let mut listed = Vec::new();
        collect_yaml(dir, dir, 0, &mut listed);
        listed.sort();
        assert_eq!(listed, ["quick/alias.yml", "quick/quick.yaml"]);
    }
}
