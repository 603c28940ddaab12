//! The one error type of the model layer.
//!
//! Every variant names the thing that failed (file, metadata key, tensor, architecture) so that a user
//! reading the message knows what to fix without a backtrace.

use std::path::PathBuf;

/// Everything that can go wrong while loading, running or saving a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be opened, read, mapped or written.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A file a model directory must contain is not there.
    #[error("missing file {path}")]
    MissingFile {
        /// The file that was looked for.
        path: PathBuf,
    },
    /// A file exists but is not what its name promises.
    #[error("{path}: {reason}")]
    InvalidFile {
        /// The file.
        path: PathBuf,
        /// Why it was rejected.
        reason: String,
    },
    /// A GGUF file is malformed or uses a feature we do not read.
    #[error("gguf {path}: {reason}")]
    Gguf {
        /// The GGUF file.
        path: PathBuf,
        /// Why it was rejected.
        reason: String,
    },
    /// A metadata key the model needs is absent or has the wrong type.
    #[error("metadata key `{key}`: {reason}")]
    Metadata {
        /// The key, e.g. `llama.block_count` or `num_attention_heads`.
        key: String,
        /// Absent, or the type found.
        reason: String,
    },
    /// A tensor is stored in a quantization format we cannot dequantize.
    #[error("tensor `{tensor}`: unsupported quantization type {ggml_type}")]
    UnsupportedQuantization {
        /// The tensor's name in the file.
        tensor: String,
        /// The ggml type name (or number if the type is unknown to us).
        ggml_type: String,
    },
    /// A tensor the architecture needs is not in the checkpoint.
    #[error("missing tensor `{tensor}`")]
    MissingTensor {
        /// The tensor's Hugging Face name (and the file's own name where it differs).
        tensor: String,
    },
    /// A tensor has a different shape from the one the config implies.
    #[error("tensor `{tensor}`: expected shape {expected:?}, found {found:?}")]
    ShapeMismatch {
        /// The tensor's name.
        tensor: String,
        /// The shape the config implies.
        expected: Vec<i64>,
        /// The shape in the checkpoint.
        found: Vec<i64>,
    },
    /// A tensor is stored with a dtype we cannot load.
    #[error("tensor `{tensor}`: unsupported dtype {dtype}")]
    UnsupportedDtype {
        /// The tensor's name.
        tensor: String,
        /// The dtype as the file names it.
        dtype: String,
    },
    /// The config names a model family we do not implement.
    #[error("unknown architecture `{architecture}` (supported: {supported})")]
    UnknownArchitecture {
        /// What the config or GGUF metadata says.
        architecture: String,
        /// The families we know, comma separated.
        supported: &'static str,
    },
    /// A config value we do not support (e.g. a rope scaling type).
    #[error("unsupported config `{key}`: {reason}")]
    UnsupportedConfig {
        /// The config key.
        key: String,
        /// What we found and why we cannot use it.
        reason: String,
    },
    /// The tokenizer could not be built or failed to encode or decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A chat template failed to compile or render.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A KV-cache request does not fit the cache (slot out of range, sequence too long).
    #[error("kv cache: {0}")]
    KvCache(String),
    /// A request to a model function is malformed (e.g. an empty prompt for scoring).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// libtorch reported an error (shape mismatch inside an operation, out of memory, bad device).
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// A model file holds a value the error inside names (an architecture, a config key, a tensor) but not where
    /// it came from; this adds the file, so the user knows which file to fix.
    #[error("{path}: {source}")]
    InFile {
        /// The file the value came from.
        path: PathBuf,
        /// What was wrong with it.
        #[source]
        source: Box<ModelError>,
    },
    /// A JSON file could not be parsed.
    #[error("{path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What serde_json said.
        #[source]
        source: serde_json::Error,
    },
}

/// Shorthand used across the crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }

    /// Names `path` in `err` unless it already names a file.
    pub(crate) fn in_file(path: impl Into<PathBuf>, err: Self) -> Self {
        match err {
            Self::Io { .. }
            | Self::MissingFile { .. }
            | Self::InvalidFile { .. }
            | Self::Gguf { .. }
            | Self::Json { .. }
            | Self::InFile { .. } => err,
            other => Self::InFile { path: path.into(), source: Box::new(other) },
        }
    }

    /// The error without the file [`ModelError::InFile`] adds: what to match on.
    pub fn cause(&self) -> &Self {
        match self {
            Self::InFile { source, .. } => source.cause(),
            other => other,
        }
    }

    pub(crate) fn gguf(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::Gguf { path: path.into(), reason: reason.into() }
    }
}
