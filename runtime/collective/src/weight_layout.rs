//! What a weight transfer sends and how it is cut into buckets.
//!
//! A [`Layout`] lists the tensors (name, dtype, shape) in order; it crosses once per group generation (through the
//! store), never per sync. The tensors' bytes form one stream, each tensor starting at a multiple of
//! [`ALIGN`] bytes so that a tensor lying inside one bucket can be viewed in place with its own dtype. The stream
//! is cut into buckets of `bucket_bytes`: a tensor may span buckets, so the largest embedding matrix needs no
//! bucket of its own size and two buckets bound the memory of a transfer.

use std::ops::Range;

use tch::{Kind, Tensor};

use crate::error::{CollectiveError, Result};

/// Start offsets of tensors in the byte stream are multiples of this.
pub const ALIGN: usize = 64;

/// One tensor of a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub kind: Kind,
    pub shape: Vec<i64>,
    /// Where its bytes start in the stream.
    pub offset: usize,
    pub bytes: usize,
}

/// The tensors of a transfer, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub entries: Vec<Entry>,
    /// Length of the byte stream (the last tensor's end).
    pub total: usize,
    pub bucket_bytes: usize,
}

const KINDS: [(Kind, &str); 10] = [
    (Kind::Float, "f32"),
    (Kind::BFloat16, "bf16"),
    (Kind::Half, "f16"),
    (Kind::Double, "f64"),
    (Kind::Int64, "i64"),
    (Kind::Int, "i32"),
    (Kind::Int16, "i16"),
    (Kind::Int8, "i8"),
    (Kind::Uint8, "u8"),
    (Kind::Bool, "bool"),
];

fn kind_name(kind: Kind) -> Result<&'static str> {
    KINDS
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, n)| *n)
        .ok_or_else(|| CollectiveError::WeightSync(format!("dtype {kind:?} cannot be transferred")))
}

/// The dtypes [`Layout::of`]'s `cast` applies to.
fn is_floating(kind: Kind) -> bool {
    matches!(kind, Kind::Float | Kind::Double | Kind::Half | Kind::BFloat16)
}

fn kind_of(name: &str) -> Result<Kind> {
    KINDS
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(k, _)| *k)
        .ok_or_else(|| CollectiveError::WeightSync(format!("unknown dtype {name:?} in the layout")))
}

impl Layout {
    /// The layout of `tensors`, cut into buckets of `bucket_bytes` (rounded up to [`ALIGN`]); with `cast`, every
    /// floating-point tensor is sent in that dtype ([`pack`] converts while copying).
    pub fn of(tensors: &[(String, Tensor)], bucket_bytes: usize, cast: Option<Kind>) -> Result<Layout> {
        let shapes = tensors.iter().map(|(name, t)| (name.as_str(), t.kind(), t.size()));
        Layout::of_shapes(shapes, bucket_bytes, cast)
    }

    /// [`Layout::of`] from the tensors' names, dtypes and shapes alone: the layout of a transfer whose tensors
    /// do not exist yet (a sharded model, gathered while it is sent).
    pub fn of_shapes<'a>(
        tensors: impl IntoIterator<Item = (&'a str, Kind, Vec<i64>)>,
        bucket_bytes: usize,
        cast: Option<Kind>,
    ) -> Result<Layout> {
        let mut entries = Vec::new();
        let mut offset = 0usize;
        for (name, kind, shape) in tensors {
            if name.contains(['\t', '\n']) {
                return Err(CollectiveError::WeightSync(format!("tensor name {name:?} holds a tab or newline")));
            }
            let kind = match cast {
                Some(to) if is_floating(kind) => to,
                _ => kind,
            };
            kind_name(kind)?;
            let numel = usize::try_from(shape.iter().product::<i64>())
                .map_err(|_| CollectiveError::WeightSync(format!("tensor {name:?} has shape {shape:?}")))?;
            let bytes = numel * kind.elt_size_in_bytes();
            entries.push(Entry { name: name.to_owned(), kind, shape, offset, bytes });
            offset = (offset + bytes).next_multiple_of(ALIGN);
        }
        let total = entries.last().map_or(0, |e| e.offset + e.bytes);
        Ok(Layout { entries, total, bucket_bytes: bucket_bytes.max(ALIGN).next_multiple_of(ALIGN) })
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.total.div_ceil(self.bucket_bytes)
    }

    /// The stream bytes of bucket `k`.
    pub fn bucket_range(&self, k: usize) -> Range<usize> {
        let start = k * self.bucket_bytes;
        start..(start + self.bucket_bytes).min(self.total)
    }

    /// Text form, one line per tensor (`name\tdtype\tdims`), after a header line with the bucket size.
    pub fn encode(&self) -> Result<String> {
        let mut out = format!("bucket_bytes\t{}\n", self.bucket_bytes);
        for e in &self.entries {
            let dims: Vec<String> = e.shape.iter().map(i64::to_string).collect();
            out.push_str(&format!("{}\t{}\t{}\n", e.name, kind_name(e.kind)?, dims.join(",")));
        }
        Ok(out)
    }

    /// Parses [`Layout::encode`]'s text.
    pub fn decode(text: &str) -> Result<Layout> {
        let bad = |what: &str| CollectiveError::WeightSync(format!("malformed layout: {what}"));
        let mut lines = text.lines();
        let header = lines.next().ok_or_else(|| bad("empty"))?;
        let bucket_bytes: usize =
            header.strip_prefix("bucket_bytes\t").and_then(|v| v.parse().ok()).ok_or_else(|| bad("no bucket size"))?;
        let mut offset = 0usize;
        let mut entries = Vec::new();
        for line in lines {
            let mut parts = line.split('\t');
            let (Some(name), Some(kind), Some(dims), None) = (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(bad(line));
            };
            let kind = kind_of(kind)?;
            let shape: Vec<i64> = if dims.is_empty() {
                Vec::new()
            } else {
                dims.split(',').map(|d| d.parse::<i64>().map_err(|_| bad(line))).collect::<Result<_>>()?
            };
            let numel: i64 = shape.iter().product();
            let bytes = usize::try_from(numel).map_err(|_| bad(line))? * kind.elt_size_in_bytes();
            entries.push(Entry { name: name.to_owned(), kind, shape, offset, bytes });
            offset = (offset + bytes).next_multiple_of(ALIGN);
        }
        let total = entries.last().map_or(0, |e| e.offset + e.bytes);
        Ok(Layout { entries, total, bucket_bytes })
    }

    /// Indices of the entries whose bytes overlap `range`.
    pub fn overlapping(&self, range: &Range<usize>) -> impl Iterator<Item = usize> + '_ {
        let (start, end) = (range.start, range.end);
        let first = self.entries.partition_point(|e| e.offset + e.bytes <= start);
        (first..self.entries.len()).take_while(move |&i| self.entries[i].offset < end)
    }
}

/// A tensor's bytes as a flat `u8` tensor sharing its storage (the tensor must be contiguous).
pub fn byte_view(t: &Tensor) -> Result<Tensor> {
    let flat = t.f_reshape([-1])?;
    Ok(if t.kind() == Kind::Uint8 { flat } else { flat.f_view_dtype(Kind::Uint8)? })
}

/// Copies the part of `tensors` (laid out by `layout`, one per entry) that falls in bucket `k` into `bucket` (a
/// `u8` tensor of at least the bucket's length), converting to the layout's dtype where it differs. Tensors on
/// another device are copied over; padding bytes are left as they are. Every tensor the bucket overlaps must be
/// there; the others may be `None` (a transfer that holds only the tensors of the buckets it is sending).
pub fn pack(layout: &Layout, k: usize, tensors: &[Option<Tensor>], bucket: &Tensor) -> Result<()> {
    let range = layout.bucket_range(k);
    let _guard = tch::no_grad_guard();
    for i in layout.overlapping(&range) {
        let e = &layout.entries[i];
        let start = e.offset.max(range.start);
        let end = (e.offset + e.bytes).min(range.end);
        let dst = bucket.f_narrow(0, (start - range.start) as i64, (end - start) as i64)?;
        let t = tensors.get(i).and_then(Option::as_ref).ok_or_else(|| {
            CollectiveError::WeightSync(format!("bucket {k} overlaps tensor `{}`, which was not given", e.name))
        })?;
        if t.kind() == e.kind {
            let src = byte_view(&t.f_contiguous()?)?.f_narrow(0, (start - e.offset) as i64, (end - start) as i64)?;
            dst.shallow_clone().f_copy_(&src)?;
        } else {
            // Bucket and tensor boundaries are multiples of ALIGN, so the part holds whole elements.
            let elt = e.kind.elt_size_in_bytes();
            let src =
                t.f_reshape([-1])?.f_narrow(0, ((start - e.offset) / elt) as i64, ((end - start) / elt) as i64)?;
            let mut typed = if e.kind == Kind::Uint8 { dst } else { dst.f_view_dtype(e.kind)? };
            typed.f_copy_(&src)?;
        }
    }
    Ok(())
}

/// Unpacks bucket `k` (a `u8` tensor holding its bytes, on the CPU or a CUDA device): every tensor that ends in this bucket is handed to
/// `done` (name and tensor; a view into `bucket` when the tensor lies wholly inside it, valid only for the call);
/// parts of tensors that continue into the next bucket are kept in `partial`.
pub fn unpack(
    layout: &Layout,
    k: usize,
    bucket: &Tensor,
    partial: &mut Option<(usize, Tensor)>,
    done: &mut dyn FnMut(&str, &Tensor) -> Result<()>,
) -> Result<()> {
    let range = layout.bucket_range(k);
    for i in layout.overlapping(&range) {
        let e = &layout.entries[i];
        let start = e.offset.max(range.start);
        let end = (e.offset + e.bytes).min(range.end);
        let part = bucket.f_narrow(0, (start - range.start) as i64, (end - start) as i64)?;
        let whole = start == e.offset && end == e.offset + e.bytes;
        if whole {
            let t = if e.kind == Kind::Uint8 { part } else { part.f_view_dtype(e.kind)? };
            done(&e.name, &t.f_view(e.shape.as_slice())?)?;
            continue;
        }
        if start == e.offset {
            *partial = Some((i, Tensor::f_empty(e.shape.as_slice(), (e.kind, bucket.device()))?));
        }
        let Some((index, staged)) = partial.as_ref() else {
            return Err(CollectiveError::WeightSync(format!("bucket {k} continues `{}` that never started", e.name)));
        };
        if *index != i {
            return Err(CollectiveError::WeightSync(format!("bucket {k}: `{}` interleaves another tensor", e.name)));
        }
        byte_view(staged)?.f_narrow(0, (start - e.offset) as i64, (end - start) as i64)?.f_copy_(&part)?;
        if end == e.offset + e.bytes
            && let Some((_, staged)) = partial.take()
        {
            done(&e.name, &staged)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use tch::Device;

    use super::*;

    fn tensors() -> Vec<(String, Tensor)> {
        vec![
            ("a".into(), Tensor::arange(10, (Kind::Float, Device::Cpu)).view([2, 5])),
            ("b".into(), Tensor::arange(7, (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16)),
            ("c".into(), Tensor::from(3i64)),
            ("d".into(), Tensor::arange(100, (Kind::Float, Device::Cpu))),
        ]
    }

    #[test]
    fn layouts_round_trip_as_text() {
        let layout = Layout::of(&tensors(), 100, None).unwrap();
        assert_eq!(layout.bucket_bytes, 128);
        assert_eq!(layout.entries.iter().map(|e| e.offset).collect::<Vec<_>>(), vec![0, 64, 128, 192]);
        assert_eq!(layout.total, 592);
        assert_eq!(Layout::decode(&layout.encode().unwrap()).unwrap(), layout);
    }

    #[test]
    fn packing_then_unpacking_gives_the_tensors_back_for_any_bucket_size() {
        let ts = tensors();
        let plain: Vec<Option<Tensor>> = ts.iter().map(|(_, t)| Some(t.shallow_clone())).collect();
        for bucket_bytes in [64, 128, 192, 256, 1024] {
            let layout = Layout::of(&ts, bucket_bytes, None).unwrap();
            let mut got = Vec::new();
            let mut partial = None;
            for k in 0..layout.buckets() {
                let bucket = Tensor::zeros([layout.bucket_bytes as i64], (Kind::Uint8, Device::Cpu));
                pack(&layout, k, &plain, &bucket).unwrap();
                unpack(&layout, k, &bucket, &mut partial, &mut |n, t| {
                    got.push((n.to_owned(), t.copy()));
                    Ok(())
                })
                .unwrap();
            }
            assert_eq!(got.len(), ts.len(), "bucket {bucket_bytes}");
            for ((n, a), (m, b)) in got.iter().zip(&ts) {
                assert_eq!(n, m);
                assert!(a.equal(b) && a.kind() == b.kind(), "{n} with buckets of {bucket_bytes}");
            }
        }
    }

    #[test]
    fn floating_tensors_are_cast_while_packing() {
        let ts = tensors();
        let plain: Vec<Option<Tensor>> = ts.iter().map(|(_, t)| Some(t.shallow_clone())).collect();
        let layout = Layout::of(&ts, 128, Some(Kind::BFloat16)).unwrap();
        let kinds: Vec<Kind> = layout.entries.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [Kind::BFloat16, Kind::BFloat16, Kind::Int64, Kind::BFloat16]);
        let mut got = Vec::new();
        let mut partial = None;
        for k in 0..layout.buckets() {
            let bucket = Tensor::zeros([layout.bucket_bytes as i64], (Kind::Uint8, Device::Cpu));
            pack(&layout, k, &plain, &bucket).unwrap();
            unpack(&layout, k, &bucket, &mut partial, &mut |_, t| {
                got.push(t.copy());
                Ok(())
            })
            .unwrap();
        }
        for (g, (name, want)) in got.iter().zip(&ts) {
            let want = if want.is_floating_point() { want.to_kind(Kind::BFloat16) } else { want.shallow_clone() };
            assert!(g.kind() == want.kind() && g.equal(&want), "{name}");
        }
    }
}
