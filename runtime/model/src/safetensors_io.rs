//! Reading (memory-mapped, single file or sharded) and writing (streamed) safetensors checkpoints.
//!
//! Reading: each file is mapped once and its header parsed once (validated by the `safetensors` crate, so
//! every tensor's byte range lies inside its file); a tensor is copied exactly once, from the map into the libtorch
//! tensor that becomes the parameter. Writing: the header is computed from shapes and dtypes first, then tensors
//! are written one by one, so saving never holds a second copy of the model in memory, and past the page cache
//! ([`crate::direct_file`]) where the file system allows.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata};
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

use crate::direct_file::DirectFile;
use crate::error::{ModelError, Result};
use crate::weights::{WeightSource, check_shape};

#[derive(Debug)]
struct Shard {
    path: PathBuf,
    mmap: Mmap,
    data_start: usize,
    metadata: Metadata,
}

/// Weights from `model.safetensors` or from the shards listed in `model.safetensors.index.json`.
#[derive(Debug)]
pub struct SafetensorsWeights {
    shards: Vec<Shard>,
    by_name: HashMap<String, usize>,
}

impl SafetensorsWeights {
    /// Maps the weights of an HF directory: the sharded index when present, else `model.safetensors`.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
            let v: Value =
                serde_json::from_str(&text).map_err(|source| ModelError::Json { path: index.clone(), source })?;
            let map = v.get("weight_map").and_then(Value::as_object).ok_or_else(|| ModelError::InvalidFile {
                path: index.clone(),
                reason: "no `weight_map` object".into(),
            })?;
            let mut files: Vec<&str> = map.values().filter_map(Value::as_str).collect();
            files.sort_unstable();
            files.dedup();
            let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
            return Self::open_files(&paths);
        }
        Self::open_files(&[dir.join("model.safetensors")])
    }

    /// Maps the given safetensors files; a tensor name must appear in only one of them.
    pub fn open_files(paths: &[PathBuf]) -> Result<Self> {
        let mut shards = Vec::new();
        let mut by_name = HashMap::new();
        for path in paths {
            let file = File::open(path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    ModelError::MissingFile { path: path.clone() }
                } else {
                    ModelError::io(path, e)
                }
            })?;
            // SAFETY: read-only private map; we assume the checkpoint is not truncated while open, as every
            // safetensors reader does (that would be a SIGBUS, not a data race in our code).
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
            let (header_len, metadata) = safetensors::SafeTensors::read_metadata(&mmap)
                .map_err(|e| ModelError::InvalidFile { path: path.clone(), reason: e.to_string() })?;
            for name in metadata.tensors().keys() {
                by_name.insert(name.clone(), shards.len());
            }
            shards.push(Shard { path: path.clone(), mmap, data_start: 8 + header_len, metadata });
        }
        Ok(Self { shards, by_name })
    }

    /// Names of all tensors, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.by_name.keys().cloned().collect();
        v.sort();
        v
    }

    /// Whether a tensor is present.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// A tensor as stored (its own dtype), on the CPU.
    pub fn get(&self, name: &str) -> Result<Tensor> {
        let missing = || ModelError::MissingTensor { tensor: name.to_owned() };
        let shard = &self.shards[*self.by_name.get(name).ok_or_else(missing)?];
        let info = shard.metadata.info(name).ok_or_else(missing)?;
        let kind = match info.dtype {
            Dtype::F32 => Kind::Float,
            Dtype::F16 => Kind::Half,
            Dtype::BF16 => Kind::BFloat16,
            Dtype::F64 => Kind::Double,
            Dtype::I64 => Kind::Int64,
            other => {
                return Err(ModelError::UnsupportedDtype {
                    tensor: format!("{name} in {}", shard.path.display()),
                    dtype: format!("{other:?}"),
                });
            }
        };
        let (start, end) = info.data_offsets;
        let bytes = &shard.mmap[shard.data_start + start..shard.data_start + end];
        let shape: Vec<i64> = info.shape.iter().map(|&d| d as i64).collect();
        Ok(Tensor::f_from_data_size(bytes, &shape, kind)?)
    }
}

impl WeightSource for SafetensorsWeights {
    fn load(&mut self, name: &str, shape: &[i64]) -> Result<Tensor> {
        let t = self.get(name)?;
        check_shape(name, shape, &t.size())?;
        Ok(t)
    }
}

fn dtype_name(kind: Kind) -> Result<&'static str> {
    Ok(match kind {
        Kind::Float => "F32",
        Kind::Half => "F16",
        Kind::BFloat16 => "BF16",
        Kind::Double => "F64",
        Kind::Int64 => "I64",
        other => return Err(ModelError::InvalidInput(format!("cannot save dtype {other:?} to safetensors"))),
    })
}

/// What a safetensors header says of one tensor: enough to lay a file out before any of its data exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub kind: Kind,
    pub shape: Vec<i64>,
}

impl TensorSpec {
    /// The spec of `t` under `name`.
    pub fn of(name: &str, t: &Tensor) -> TensorSpec {
        TensorSpec { name: name.to_owned(), kind: t.kind(), shape: t.size() }
    }

    fn bytes(&self) -> usize {
        self.shape.iter().product::<i64>().max(0) as usize * self.kind.elt_size_in_bytes()
    }
}

/// Writes `tensors` (any device, dtype and layout) as one safetensors file, in the given order.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let specs: Vec<TensorSpec> = tensors.iter().map(|(name, t)| TensorSpec::of(name, t)).collect();
    let mut writer = SafetensorsWriter::create(path, specs)?;
    for (name, t) in tensors {
        writer.write(name, t)?;
    }
    writer.finish()
}

/// A safetensors file written tensor by tensor, from a header laid out up front: the writer of a model that is
/// never whole in memory at once (ZeRO stage 3 gathers it layer by layer) holds one tensor at a time.
pub struct SafetensorsWriter {
    path: PathBuf,
    file: DirectFile,
    specs: Vec<TensorSpec>,
    /// Tensors written so far (they come in `specs`' order).
    written: usize,
}

impl std::fmt::Debug for SafetensorsWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsWriter").field("path", &self.path).field("written", &self.written).finish()
    }
}

impl SafetensorsWriter {
    /// Creates (or truncates) `path` and writes the header of `specs`, whose tensors then come in that order.
    pub fn create(path: &Path, specs: Vec<TensorSpec>) -> Result<SafetensorsWriter> {
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), json!({"format": "pt"}));
        let mut offset = 0usize;
        for spec in &specs {
            let n = spec.bytes();
            header.insert(
                spec.name.clone(),
                json!({"dtype": dtype_name(spec.kind)?, "shape": spec.shape, "data_offsets": [offset, offset + n]}),
            );
            offset += n;
        }
        if header.len() != specs.len() + 1 {
            return Err(ModelError::InvalidInput(format!("{}: two tensors have the same name", path.display())));
        }
        let mut header = serde_json::to_vec(&Value::Object(header))
            .map_err(|source| ModelError::Json { path: path.to_path_buf(), source })?;
        while header.len() % 8 != 0 {
            header.push(b' ');
        }
        let io = |e| ModelError::io(path, e);
        let mut file = DirectFile::create(path).map_err(io)?;
        file.write_all(&(header.len() as u64).to_le_bytes()).map_err(io)?;
        file.write_all(&header).map_err(io)?;
        Ok(SafetensorsWriter { path: path.to_path_buf(), file, specs, written: 0 })
    }

    /// Writes the next tensor: it must be the one the header names next, with that dtype and shape.
    pub fn write(&mut self, name: &str, t: &Tensor) -> Result<()> {
        let path = self.path.clone();
        let Some(spec) = self.specs.get(self.written) else {
            return Err(ModelError::InvalidInput(format!(
                "{}: tensor `{name}` is past the {} the header holds",
                path.display(),
                self.specs.len()
            )));
        };
        if spec.name != name || spec.kind != t.kind() || spec.shape != t.size() {
            return Err(ModelError::InvalidInput(format!(
                "{}: tensor {} of the header is `{}` ({:?} {:?}), not `{name}` ({:?} {:?})",
                path.display(),
                self.written,
                spec.name,
                spec.kind,
                spec.shape,
                t.kind(),
                t.size()
            )));
        }
        self.written += 1;
        let t = t.f_detach()?.f_to_device(Device::Cpu)?.f_contiguous()?;
        let n = t.numel() * t.kind().elt_size_in_bytes();
        if n == 0 {
            return Ok(());
        }
        if t.data_ptr().is_null() {
            return Err(ModelError::InvalidInput(format!("tensor `{name}` has no storage")));
        }
        // Written straight from the tensor's memory: a checkpoint holds gigabytes of optimizer state, and a
        // staging copy per tensor doubled the memory traffic of saving.
        // SAFETY: `t` is a contiguous CPU tensor of `n` bytes with non-null storage, kept alive (and not written
        // by anyone else: it is this function's own handle) until the write returns.
        let bytes = unsafe { std::slice::from_raw_parts(t.data_ptr() as *const u8, n) };
        self.file.write_all(bytes).map_err(|e| ModelError::io(&path, e))
    }

    /// Ends the file: every tensor of the header must have been written.
    pub fn finish(self) -> Result<()> {
        if self.written != self.specs.len() {
            return Err(ModelError::InvalidInput(format!(
                "{}: {} of the header's {} tensors were written (the next is `{}`)",
                self.path.display(),
                self.written,
                self.specs.len(),
                self.specs[self.written].name
            )));
        }
        self.file.finish().map_err(|e| ModelError::io(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_written_tensor_by_tensor_is_the_file_written_whole_and_misuse_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let a = Tensor::randn([3, 5], (Kind::Float, Device::Cpu));
        let b = a.to_kind(Kind::BFloat16).narrow(1, 1, 3);
        let tensors = vec![("a".to_owned(), a.shallow_clone()), ("b".to_owned(), b.shallow_clone())];
        let whole = dir.path().join("whole.safetensors");
        write_safetensors(&whole, &tensors).unwrap();
        let streamed = dir.path().join("streamed.safetensors");
        let specs: Vec<TensorSpec> = tensors.iter().map(|(n, t)| TensorSpec::of(n, t)).collect();
        let mut w = SafetensorsWriter::create(&streamed, specs.clone()).unwrap();
        w.write("a", &a).unwrap();
        w.write("b", &b).unwrap();
        w.finish().unwrap();
        assert_eq!(std::fs::read(&whole).unwrap(), std::fs::read(&streamed).unwrap());

        let path = dir.path().join("bad.safetensors");
        let mut w = SafetensorsWriter::create(&path, specs.clone()).unwrap();
        let err = w.write("b", &b).unwrap_err().to_string();
        assert!(err.contains("tensor 0 of the header is `a`"), "{err}");
        w.write("a", &a).unwrap();
        let err = w.finish().unwrap_err().to_string();
        assert!(err.contains("1 of the header's 2 tensors were written (the next is `b`)"), "{err}");
        let mut w = SafetensorsWriter::create(&path, specs.clone()).unwrap();
        let err = w.write("a", &b).unwrap_err().to_string();
        assert!(err.contains("not `a` (BFloat16"), "{err}");
        let twice = vec![specs[0].clone(), specs[0].clone()];
        assert!(SafetensorsWriter::create(&path, twice).is_err());
    }

    #[test]
    fn write_then_read_is_exact_for_every_dtype() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let a = Tensor::randn([3, 5], (Kind::Float, Device::Cpu));
        let b = a.to_kind(Kind::BFloat16);
        let c = a.to_kind(Kind::Half).narrow(1, 1, 2); // non-contiguous
        let step = Tensor::from_slice(&[7_i64]); // the optimizer's step counter
        let tensors = [("a", &a), ("b", &b), ("c", &c), ("step", &step)];
        write_safetensors(&path, &tensors.map(|(n, t)| (n.to_owned(), t.shallow_clone()))).unwrap();
        let mut w = SafetensorsWeights::open_dir(dir.path()).unwrap();
        assert_eq!(w.names(), ["a", "b", "c", "step"]);
        assert!(w.get("step").unwrap().equal(&step));
        assert!(w.get("a").unwrap().equal(&a));
        assert!(w.get("b").unwrap().equal(&b));
        assert_eq!(w.get("c").unwrap().kind(), Kind::Half);
        assert!(w.get("c").unwrap().equal(&c));
        let err = w.load("a", &[5, 3]).unwrap_err();
        assert!(matches!(err, ModelError::ShapeMismatch { ref tensor, .. } if tensor == "a"), "{err}");
        assert!(matches!(w.load("zzz", &[1]), Err(ModelError::MissingTensor { .. })));
    }

    #[test]
    fn sharded_index_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = Tensor::from_slice(&[1.0f32, 2.0]);
        let b = Tensor::from_slice(&[3.0f32]);
        write_safetensors(&dir.path().join("s1.safetensors"), &[("a".into(), a)]).unwrap();
        write_safetensors(&dir.path().join("s2.safetensors"), &[("b".into(), b)]).unwrap();
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            r#"{"metadata": {}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}"#,
        )
        .unwrap();
        let w = SafetensorsWeights::open_dir(dir.path()).unwrap();
        assert_eq!(Vec::<f32>::try_from(w.get("b").unwrap()).unwrap(), vec![3.0]);
        let empty = tempfile::tempdir().unwrap();
        let err = SafetensorsWeights::open_dir(empty.path()).unwrap_err();
        assert!(matches!(err, ModelError::MissingFile { ref path } if path.ends_with("model.safetensors")), "{err}");
    }
}
