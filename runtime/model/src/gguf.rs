//! GGUF v2/v3 reader: metadata, tensor infos and a memory map of the tensor data.
//!
//! Layout (all little endian): magic `GGUF`, version `u32`, tensor count `u64`, metadata count `u64`, then the
//! metadata key/value pairs, then one info per tensor (name, dims with the *fastest* dimension first, ggml type,
//! offset relative to the data section), then padding up to `general.alignment` (default 32) and the data.
//!
//! Invariants kept by [`GgufFile::open`]: every tensor's byte range lies inside the file, so [`GgufFile::tensor_data`]
//! never reads out of bounds; tensor dims are stored here in PyTorch order (slowest first), i.e. reversed from
//! the file, so they can be compared to Hugging Face shapes directly.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::dequant::GgmlType;
use crate::error::{ModelError, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// llama.cpp aligns to 32 bytes; anything past a megabyte is a corrupt header.
const MAX_ALIGNMENT: u64 = 1 << 20;
/// The fewest bytes one metadata entry takes: a key length (8), a type (4) and a one-byte value.
const MIN_KV_BYTES: u64 = 13;
/// The fewest bytes one tensor info takes: a name length (8), a dim count (4), a type (4) and an offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 24;

/// Checks one tensor's dims and byte range with checked arithmetic: the element count must fit in memory's
/// address space and PyTorch's `i64` dims, and the encoded bytes must lie inside the file. A tensor of a type we
/// cannot decode is still listed (its range is checked when it is read, where the error names it), recorded
/// with no bytes.
fn tensor_info(
    path: &Path,
    name: String,
    dims: &[u64],
    ty: u32,
    start: Option<u64>,
    file_len: usize,
) -> Result<GgufTensorInfo> {
    let bad = |reason: String| ModelError::gguf(path, format!("tensor `{name}`: {reason}"));
    let numel = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| i64::try_from(n).is_ok() && usize::try_from(n).is_ok())
        .ok_or_else(|| bad(format!("dims {dims:?} hold more elements than can be addressed")))?;
    let ggml_type = GgmlType::from_u32(ty);
    let n_bytes = match ggml_type.n_bytes(numel) {
        Some(n) => n,
        None if ggml_type.is_decodable() => {
            return Err(bad(format!("{numel} values are not whole {} blocks, or too many to store", ggml_type.name())));
        }
        None => 0,
    };
    let start = start.ok_or_else(|| bad("its offset overflows".to_owned()))?;
    let end = start.checked_add(n_bytes as u64);
    if end.is_none_or(|end| end > file_len as u64) {
        return Err(bad(format!(
            "its {n_bytes} bytes at offset {start} lie past the end of the file ({file_len} bytes)"
        )));
    }
    // Each dim fits in i64: the product of all of them does, and none is zero unless the product is.
    let shape = dims.iter().rev().map(|&d| i64::try_from(d).unwrap_or(i64::MAX)).collect();
    Ok(GgufTensorInfo { name, shape, ggml_type, offset: start as usize, n_bytes })
}

/// One metadata value, as typed in the file.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// `uint8`
    U8(u8),
    /// `int8`
    I8(i8),
    /// `uint16`
    U16(u16),
    /// `int16`
    I16(i16),
    /// `uint32`
    U32(u32),
    /// `int32`
    I32(i32),
    /// `float32`
    F32(f32),
    /// `bool`
    Bool(bool),
    /// `string` (UTF-8; invalid bytes are replaced)
    String(String),
    /// `array` of any element type (arrays of arrays included)
    Array(Vec<GgufValue>),
    /// `uint64`
    U64(u64),
    /// `int64`
    I64(i64),
    /// `float64`
    F64(f64),
}

impl GgufValue {
    /// The value as an unsigned integer, when it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, when it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::U64(v) => i64::try_from(v).ok(),
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float, when it is any number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array slice.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            Self::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// Where one tensor lives in the file and how it is encoded.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    /// The tensor's name in the file (llama.cpp naming, e.g. `blk.0.attn_q.weight`).
    pub name: String,
    /// Shape in PyTorch order (slowest dimension first): the file's dims reversed.
    pub shape: Vec<i64>,
    /// The encoding.
    pub ggml_type: GgmlType,
    /// Byte offset of the data from the start of the file.
    pub offset: usize,
    /// Number of bytes of encoded data.
    pub n_bytes: usize,
}

impl GgufTensorInfo {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }
}

/// An open GGUF file: parsed header and a read-only memory map of the whole file.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    by_name: BTreeMap<String, usize>,
    mmap: Mmap,
}

impl GgufFile {
    /// Opens and parses a GGUF file. Tensor data is not read until asked for.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                ModelError::MissingFile { path: path.clone() }
            } else {
                ModelError::io(&path, e)
            }
        })?;
        // SAFETY: the map is read-only and private to this struct; like every reader of model files we assume
        // nobody truncates the file while it is open (that would be a SIGBUS, not memory unsafety in our code).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(&path, e))?;
        let mut cursor = Cursor { bytes: &mmap, pos: 0, path: &path };
        let magic = cursor.take(4)?;
        if magic != MAGIC {
            return Err(ModelError::gguf(&path, "not a GGUF file (bad magic)"));
        }
        let version = cursor.u32()?;
        if !(2..=3).contains(&version) {
            return Err(ModelError::gguf(&path, format!("unsupported GGUF version {version} (2 and 3 are read)")));
        }
        let n_tensors = cursor.u64()?;
        let n_kv = cursor.u64()?;
        // Counts are checked against what the rest of the file could hold before anything is sized from them.
        cursor.check_count("metadata entries", n_kv, MIN_KV_BYTES)?;
        cursor.check_count("tensors", n_tensors, MIN_TENSOR_INFO_BYTES)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = cursor.string()?;
            let ty = cursor.u32()?;
            let value = cursor.value(ty, 0)?;
            metadata.insert(key, value);
        }
        let mut raw_infos = Vec::new();
        for _ in 0..n_tensors {
            let name = cursor.string()?;
            let n_dims = cursor.u32()?;
            if n_dims > 8 {
                return Err(ModelError::gguf(&path, format!("tensor `{name}` has {n_dims} dims")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(cursor.u64()?);
            }
            let ty = cursor.u32()?;
            let offset = cursor.u64()?;
            raw_infos.push((name, dims, ty, offset));
        }
        let alignment = match metadata.get("general.alignment") {
            Some(v) => v
                .as_u64()
                .filter(|a| (1..=MAX_ALIGNMENT).contains(a))
                .ok_or_else(|| ModelError::gguf(&path, "general.alignment is not an integer between 1 and 2^20"))?,
            None => DEFAULT_ALIGNMENT,
        };
        // Cannot overflow: the position is at most the file's length and the alignment at most 2^20.
        let data_start = (cursor.pos as u64).div_ceil(alignment) * alignment;
        let mut tensors = Vec::with_capacity(raw_infos.len());
        let mut by_name = BTreeMap::new();
        for (name, dims, ty, offset) in raw_infos {
            let info = tensor_info(&path, name, &dims, ty, data_start.checked_add(offset), mmap.len())?;
            by_name.insert(info.name.clone(), tensors.len());
            tensors.push(info);
        }
        Ok(Self { path, version, metadata, tensors, by_name, mmap })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All metadata, sorted by key.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// A required metadata value, or an error naming the key.
    pub fn require(&self, key: &str) -> Result<&GgufValue> {
        self.metadata.get(key).ok_or_else(|| ModelError::Metadata { key: key.to_owned(), reason: "absent".into() })
    }

    /// A required unsigned integer.
    pub fn require_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_u64().ok_or_else(|| ModelError::Metadata {
            key: key.to_owned(),
            reason: format!("expected an unsigned integer, found {v:?}"),
        })
    }

    /// A required string.
    pub fn require_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| ModelError::Metadata {
            key: key.to_owned(),
            reason: format!("expected a string, found {}", type_name(v)),
        })
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// One tensor's info by its file name.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The encoded bytes of a tensor (a view into the memory map, no copy).
    pub fn tensor_data(&self, info: &GgufTensorInfo) -> &[u8] {
        // In range: checked against the map's length in `open`.
        &self.mmap[info.offset..info.offset + info.n_bytes]
    }

    /// Dequantizes a tensor into f32 values, in PyTorch (row-major, slowest dimension first) order.
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.tensor_info(name).ok_or_else(|| ModelError::MissingTensor { tensor: name.to_owned() })?;
        if !info.ggml_type.is_decodable() {
            return Err(ModelError::UnsupportedQuantization {
                tensor: name.to_owned(),
                ggml_type: info.ggml_type.name(),
            });
        }
        let mut out = vec![0f32; info.numel()];
        crate::dequant::dequantize_into(info.ggml_type, self.tensor_data(info), &mut out)
            .map_err(|ggml_type| ModelError::UnsupportedQuantization { tensor: name.to_owned(), ggml_type })?;
        Ok(out)
    }
}

fn type_name(v: &GgufValue) -> &'static str {
    match v {
        GgufValue::U8(_) => "uint8",
        GgufValue::I8(_) => "int8",
        GgufValue::U16(_) => "uint16",
        GgufValue::I16(_) => "int16",
        GgufValue::U32(_) => "uint32",
        GgufValue::I32(_) => "int32",
        GgufValue::F32(_) => "float32",
        GgufValue::Bool(_) => "bool",
        GgufValue::String(_) => "string",
        GgufValue::Array(_) => "array",
        GgufValue::U64(_) => "uint64",
        GgufValue::I64(_) => "int64",
        GgufValue::F64(_) => "float64",
    }
}

/// A bounds-checked little-endian reader over the mapped header.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(ModelError::gguf(self.path, format!("truncated header at byte {}", self.pos)));
        };
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn len(&mut self) -> Result<usize> {
        let n = self.u64()?;
        // Any length beyond the file is corrupt; refusing it early avoids huge allocations.
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.bytes.len())
            .ok_or_else(|| ModelError::gguf(self.path, format!("implausible length {n} at byte {}", self.pos)))
    }

    /// Refuses a count of items of at least `min_bytes` each that the rest of the file cannot hold.
    fn check_count(&self, what: &str, n: u64, min_bytes: u64) -> Result<()> {
        let remaining = (self.bytes.len() - self.pos) as u64;
        if n.checked_mul(min_bytes).is_none_or(|need| need > remaining) {
            return Err(ModelError::gguf(
                self.path,
                format!("header claims {n} {what}, more than the remaining {remaining} bytes can hold"),
            ));
        }
        Ok(())
    }

    fn string(&mut self) -> Result<String> {
        let n = self.len()?;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>()?[0]),
            1 => GgufValue::I8(i8::from_le_bytes(self.array()?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            7 => GgufValue::Bool(self.array::<1>()?[0] != 0),
            8 => GgufValue::String(self.string()?),
            9 => {
                if depth > 4 {
                    return Err(ModelError::gguf(self.path, "arrays nested too deeply"));
                }
                let elem = self.u32()?;
                let n = self.len()?;
                // Every element takes at least one byte, so the capacity is bounded by what is left of the file.
                self.check_count("array elements", n as u64, 1)?;
                let mut items = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            other => {
                return Err(ModelError::gguf(
                    self.path,
                    format!("unknown metadata value type {other} at byte {}", self.pos),
                ));
            }
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes a GGUF v3 file by hand, for tests: metadata as (key, type, encoded value) and tensors as
    /// (name, file-order dims, ggml type, bytes).
    pub(crate) fn write_gguf(
        path: &Path,
        metadata: &[(&str, u32, Vec<u8>)],
        tensors: &[(&str, Vec<u64>, u32, Vec<u8>)],
    ) {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (k, ty, v) in metadata {
            out.extend_from_slice(&encode_str(k));
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(v);
        }
        let mut offset = 0u64;
        for (name, dims, ty, data) in tensors {
            out.extend_from_slice(&encode_str(name));
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        while out.len() % 32 != 0 {
            out.push(0);
        }
        for (_, _, _, data) in tensors {
            out.extend_from_slice(data);
            while out.len() % 32 != 0 {
                out.push(0);
            }
        }
        std::fs::write(path, out).unwrap();
    }

    pub(crate) fn encode_str(s: &str) -> Vec<u8> {
        let mut v = (s.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(s.as_bytes());
        v
    }

    #[test]
    fn reads_every_metadata_type_and_tensor_infos() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        let mut arr = 5u32.to_le_bytes().to_vec(); // array of int32
        arr.extend_from_slice(&2u64.to_le_bytes());
        arr.extend_from_slice(&(-1i32).to_le_bytes());
        arr.extend_from_slice(&7i32.to_le_bytes());
        let mut str_arr = 8u32.to_le_bytes().to_vec();
        str_arr.extend_from_slice(&1u64.to_le_bytes());
        str_arr.extend_from_slice(&encode_str("héllo"));
        let f32_data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        write_gguf(
            &path,
            &[
                ("a.u8", 0, vec![200]),
                ("a.i8", 1, vec![0xff]),
                ("a.u16", 2, 513u16.to_le_bytes().to_vec()),
                ("a.i16", 3, (-2i16).to_le_bytes().to_vec()),
                ("a.u32", 4, 70000u32.to_le_bytes().to_vec()),
                ("a.i32", 5, (-70000i32).to_le_bytes().to_vec()),
                ("a.f32", 6, 1.5f32.to_le_bytes().to_vec()),
                ("a.bool", 7, vec![1]),
                ("a.str", 8, encode_str("smollm")),
                ("a.arr", 9, arr),
                ("a.strs", 9, str_arr),
                ("a.u64", 10, u64::MAX.to_le_bytes().to_vec()),
                ("a.i64", 11, (-5i64).to_le_bytes().to_vec()),
                ("a.f64", 12, 0.25f64.to_le_bytes().to_vec()),
            ],
            &[("w", vec![3, 2], 0, f32_data)],
        );
        let g = GgufFile::open(&path).unwrap();
        assert_eq!(g.version(), 3);
        assert_eq!(g.get("a.u8"), Some(&GgufValue::U8(200)));
        assert_eq!(g.get("a.i8"), Some(&GgufValue::I8(-1)));
        assert_eq!(g.get("a.u16"), Some(&GgufValue::U16(513)));
        assert_eq!(g.get("a.i16"), Some(&GgufValue::I16(-2)));
        assert_eq!(g.require_u64("a.u32").unwrap(), 70000);
        assert_eq!(g.get("a.i32").and_then(GgufValue::as_i64), Some(-70000));
        assert_eq!(g.get("a.f32").and_then(GgufValue::as_f64), Some(1.5));
        assert_eq!(g.get("a.bool").and_then(GgufValue::as_bool), Some(true));
        assert_eq!(g.require_str("a.str").unwrap(), "smollm");
        assert_eq!(g.get("a.arr"), Some(&GgufValue::Array(vec![GgufValue::I32(-1), GgufValue::I32(7)])));
        assert_eq!(g.get("a.strs"), Some(&GgufValue::Array(vec![GgufValue::String("héllo".into())])));
        assert_eq!(g.get("a.u64"), Some(&GgufValue::U64(u64::MAX)));
        assert_eq!(g.get("a.i64"), Some(&GgufValue::I64(-5)));
        assert_eq!(g.get("a.f64"), Some(&GgufValue::F64(0.25)));
        let info = g.tensor_info("w").unwrap();
        assert_eq!(info.shape, vec![2, 3]);
        assert_eq!(g.dequantize("w").unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let err = g.require_str("a.u8").unwrap_err();
        assert!(matches!(err, ModelError::Metadata { ref key, .. } if key == "a.u8"), "{err}");
        let err = g.require("nope").unwrap_err();
        assert!(err.to_string().contains("`nope`"), "{err}");
        assert!(matches!(g.dequantize("nope"), Err(ModelError::MissingTensor { .. })));
    }

    #[test]
    fn rejects_bad_magic_truncation_and_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.gguf");
        std::fs::write(&path, b"GGML\x03\0\0\0").unwrap();
        assert!(GgufFile::open(&path).unwrap_err().to_string().contains("bad magic"));
        std::fs::write(&path, b"GGUF\x03\0\0\0\x01").unwrap();
        assert!(GgufFile::open(&path).unwrap_err().to_string().contains("truncated"));
        let err = GgufFile::open(dir.path().join("absent.gguf")).unwrap_err();
        assert!(matches!(err, ModelError::MissingFile { .. }), "{err}");
    }

    #[test]
    fn overflowing_dims_offsets_and_counts_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crafted.gguf");
        // Dims whose product overflows u64.
        write_gguf(&path, &[], &[("blk.0.huge", vec![u64::MAX, 3], 0, vec![0; 32])]);
        let err = GgufFile::open(&path).unwrap_err().to_string();
        assert!(err.contains("crafted.gguf") && err.contains("`blk.0.huge`") && err.contains("addressed"), "{err}");
        // A product that fits u64 but whose f32 byte count does not.
        write_gguf(&path, &[], &[("big", vec![1 << 62], 0, vec![0; 32])]);
        let err = GgufFile::open(&path).unwrap_err().to_string();
        assert!(err.contains("`big`"), "{err}");
        // An undecodable type with absurd dims is listed, and refused by name before anything is allocated.
        write_gguf(&path, &[], &[("odd", vec![1 << 40, 1 << 20], 16, vec![0; 32])]);
        let g = GgufFile::open(&path).unwrap();
        assert!(matches!(g.dequantize("odd"), Err(ModelError::UnsupportedQuantization { .. })));
        // An offset that overflows once the data section's start is added.
        write_gguf(&path, &[], &[("w", vec![4], 0, vec![0; 16])]);
        let mut bytes = std::fs::read(&path).unwrap();
        // magic, version, tensor count, metadata count; then name length, "w", dim count, one dim, type.
        let offset_at = 4 + 4 + 8 + 8 + 8 + 1 + 4 + 8 + 4;
        bytes[offset_at..offset_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let err = GgufFile::open(&path).unwrap_err().to_string();
        assert!(err.contains("`w`") && err.contains("offset overflows"), "{err}");
        // Counts the file cannot hold are refused before anything is read or allocated.
        bytes[8..16].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let err = GgufFile::open(&path).unwrap_err().to_string();
        assert!(err.contains("claims") && err.contains("tensors"), "{err}");
    }

    #[test]
    fn unsupported_quantization_is_named_when_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.gguf");
        // Type 16 (IQ2_XXS) is not implemented: listing works, reading names the tensor and type.
        write_gguf(&path, &[], &[("blk.0.attn_q.weight", vec![256, 1], 16, vec![0; 66])]);
        let g = GgufFile::open(&path).unwrap();
        let err = g.dequantize("blk.0.attn_q.weight").unwrap_err();
        assert!(
            matches!(err, ModelError::UnsupportedQuantization { ref tensor, ref ggml_type }
                if tensor == "blk.0.attn_q.weight" && ggml_type == "IQ2_XXS"),
            "{err}"
        );
    }
}
