//! Where each key of a loaded config came from, so errors can point at a line or at a `--set` argument.

use std::path::PathBuf;

use crate::error::Origin;
use crate::yaml::Positions;

/// The file a config was read from, the positions of its keys, and the overrides applied on top.
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub path: PathBuf,
    pub positions: Positions,
    /// (key path, argument) of every `--set`, in order.
    pub overrides: Vec<(String, String)>,
}

impl Source {
    /// The origin of `key`: the last `--set` that wrote it or one of its parents, else the position of the key
    /// or of its nearest ancestor in the file.
    pub fn origin(&self, key: &str) -> Origin {
        if let Some((_, arg)) = self.overrides.iter().rev().find(|(set, _)| covers(set, key)) {
            return Origin::Override(arg.clone());
        }
        let mut probe = key;
        loop {
            if let Some(position) = self.positions.get(probe) {
                return Origin::File { path: self.path.clone(), position: Some(*position) };
            }
            match probe.rfind(['.', '[']) {
                Some(cut) => probe = &probe[..cut],
                None => {
                    return Origin::File { path: self.path.clone(), position: None };
                }
            }
        }
    }
}

impl Source {
    /// Whether the config sets `key` itself (in the file or by a `--set` of it or a section above it), as opposed
    /// to leaving it to its default.
    pub fn writes(&self, key: &str) -> bool {
        self.positions.contains_key(key) || self.overrides.iter().any(|(set, _)| covers(set, key))
    }
}

/// Whether setting `set` also set `key` (same key or one of its parents).
pub(crate) fn covers(set: &str, key: &str) -> bool {
    key == set || key.strip_prefix(set).is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::Position;

    #[test]
    fn falls_back_to_the_nearest_ancestor_then_to_overrides() {
        let mut source = Source { path: "c.yaml".into(), ..Source::default() };
        source.positions.insert("buffer".into(), Position { line: 4, column: 1 });
        source.positions.insert("buffer.tasksets[0]".into(), Position { line: 6, column: 5 });
        assert_eq!(source.origin("buffer.tasksets[0].path").to_string(), "c.yaml:6:5");
        assert_eq!(source.origin("buffer.batch_size").to_string(), "c.yaml:4:1");
        assert_eq!(source.origin("model.model_path").to_string(), "c.yaml");
        source.overrides.push(("buffer".into(), "buffer={}".into()));
        assert_eq!(source.origin("buffer.batch_size").to_string(), "--set buffer={}");
        assert_eq!(source.origin("buffers").to_string(), "c.yaml");
    }
}
