//! Why an algorithm library could not be registered; every variant names the file or the component.

use std::path::PathBuf;

use trinity_algorithm::{AlgorithmError, Kind};

/// What went wrong while loading an algorithm library and adding its components to the registry.
#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
    /// An algorithm library could not be loaded (not a library, incompatible SDK, ABI, tch or libtorch).
    #[error(transparent)]
    Load(#[from] trinity_plugin_sdk::algorithm::LoadError),

    /// An algorithm library file that cannot be read.
    #[error("algorithm library {}: {message}", path.display())]
    File { path: PathBuf, message: String },

    /// A library component whose name is already taken.
    #[error("{kind} `{name}` of algorithm library {} clashes with {other} of the same name", path.display())]
    NameClash { kind: Kind, name: String, path: PathBuf, other: String },

    /// A component the registry cannot take as declared (an argument table it cannot express); the error names
    /// the component and its library ([`AlgorithmError::Library`]).
    #[error(transparent)]
    Component(#[from] AlgorithmError),
}
