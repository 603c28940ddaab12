//! The config page's API: validate (through the binary's `--dry-run` path), the JSON Schema for completion, the
//! example configs to start from, and saving.
//!
//! Saving writes only below the studio's working directory (a relative path without `..`) and only YAML files,
//! through a temporary file and a rename, so a failed save never leaves half a config behind.

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
        let parent = target.parent().unwrap_or(&state.workdir);
        let partial = parent.join(format!(
            ".{}.partial",
            target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
        ));
        let fail = |e: std::io::Error| StudioError::Save { path: wanted.clone(), message: e.to_string() };
        std::fs::write(&partial, &request.text).map_err(fail)?;
        std::fs::rename(&partial, &target).map_err(fail)?;
        Ok(axum::Json(json!({ "saved": target.display().to_string() })))
    })
    .await
}

/// Where a save of `wanted` goes: below `workdir`, a `.yaml`/`.yml` file in an existing folder.
fn save_target(workdir: &Path, wanted: &str) -> Result<PathBuf, StudioError> {
    let refuse = |message: &str| StudioError::Save { path: wanted.to_owned(), message: message.to_owned() };
    let relative = Path::new(wanted);
    if wanted.is_empty() || !relative.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(refuse("give a relative path below the studio's working directory, without `..`"));
    }
    if !relative.extension().is_some_and(|e| e == "yaml" || e == "yml") {
        return Err(refuse("a config is saved as a .yaml or .yml file"));
    }
    let target = workdir.join(relative);
    if !target.parent().is_some_and(Path::is_dir) {
        return Err(refuse("its folder does not exist"));
    }
    Ok(target)
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

fn collect_yaml(root: &Path, dir: &Path, depth: usize, found: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() && depth + 1 < EXAMPLE_DEPTH {
            collect_yaml(root, &path, depth + 1, found);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            found.push(path.strip_prefix(root).unwrap_or(&path).display().to_string());
        }
    }
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
        let relative = Path::new(&wanted);
        if !relative.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(StudioError::query("path", "give a path as /api/examples lists it"));
        }
        let path = dir.join(relative);
        let text = std::fs::read_to_string(&path).map_err(StudioError::io(&path))?;
        // The path the config is validated and saved under: the example's path from the working directory.
        let shown = path.strip_prefix(&state.workdir).unwrap_or(&path).display().to_string();
        Ok(axum::Json(json!({ "path": shown, "text": text })))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_only_yaml_below_the_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("configs")).unwrap();
        assert_eq!(save_target(dir.path(), "configs/a.yaml").unwrap(), dir.path().join("configs/a.yaml"));
        for bad in ["", "/etc/a.yaml", "../a.yaml", "configs/../../a.yaml", "a.txt", "missing/a.yaml"] {
            assert!(matches!(save_target(dir.path(), bad), Err(StudioError::Save { .. })), "{bad}");
        }
    }
}
