//! Collectives over many tensors at once, in buckets: consecutive tensors of one dtype and device are flattened
//! into one buffer of at most `bucket_bytes` (a tensor larger than that gets a bucket of its own), so a model's
//! hundreds of parameters cost a handful of collectives instead of one each. Every bucket is started before the
//! first is waited on, so packing, transfer and unpacking overlap on Gloo's worker threads.
//!
//! The plan depends only on the tensors' order, dtypes, devices and sizes, so ranks holding same-shaped lists
//! agree on it without talking.

use std::ops::Range;

use tch::{Device, Kind, Tensor};

use crate::error::{CollectiveError, Result};
use crate::group::{ProcessGroup, ReduceOp, Work, average_in_place};

/// The default bucket size: PyTorch DDP's 25 MiB.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Index ranges of `tensors` that share a bucket.
pub fn plan(tensors: &[Tensor], bucket_bytes: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0usize;
    let mut key: Option<(Kind, Device)> = None;
    for (i, t) in tensors.iter().enumerate() {
        let size = t.numel() * t.kind().elt_size_in_bytes();
        let k = (t.kind(), t.device());
        if i > start && (key != Some(k) || bytes + size > bucket_bytes) {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        key = Some(k);
        bytes += size;
    }
    if start < tensors.len() {
        out.push(start..tensors.len());
    }
    out
}

fn flatten(tensors: &[Tensor]) -> Result<Tensor> {
    if let [only] = tensors {
        return Ok(only.f_reshape([-1])?.f_contiguous()?);
    }
    let flat: Vec<Tensor> = tensors.iter().map(|t| t.f_reshape([-1])).collect::<Result<_, _>>()?;
    Ok(Tensor::f_cat(&flat, 0)?)
}

fn unflatten(flat: &Tensor, tensors: &mut [Tensor]) -> Result<()> {
    let _guard = tch::no_grad_guard();
    let mut offset = 0i64;
    for t in tensors {
        let n = t.numel() as i64;
        let part = flat.f_narrow(0, offset, n)?.f_view(t.size().as_slice())?;
        // A single contiguous tensor was reduced in place: nothing to copy back.
        if part.data_ptr() != t.data_ptr() {
            t.f_copy_(&part)?;
        }
        offset += n;
    }
    Ok(())
}

/// What a bucketed collective does with each bucket.
#[derive(Debug, Clone, Copy)]
enum Collective {
    Allreduce(ReduceOp),
    Broadcast(usize),
}

fn run(group: &ProcessGroup, tensors: &mut [Tensor], what: Collective, bucket_bytes: usize) -> Result<()> {
    for t in tensors.iter() {
        if !t.defined() {
            return Err(CollectiveError::InvalidArgument("bucketed collective: undefined tensor".into()));
        }
    }
    let buckets = plan(tensors, bucket_bytes.max(1));
    let mut flats = Vec::with_capacity(buckets.len());
    let mut works: Vec<Work<'_>> = Vec::with_capacity(buckets.len());
    for range in &buckets {
        let flat = flatten(&tensors[range.clone()])?;
        works.push(match what {
            Collective::Allreduce(op) => group.allreduce_async(&flat, op)?,
            Collective::Broadcast(root) => group.broadcast_async(&flat, root)?,
        });
        flats.push(flat);
    }
    // Waiting for every work (even after a failure) keeps the later buffers alive until Gloo is done with them;
    // the first error is the one reported.
    let mut first_error = None;
    for work in works {
        if let Err(e) = work.wait() {
            first_error.get_or_insert(e);
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    for (range, mut flat) in buckets.into_iter().zip(flats) {
        if let Collective::Allreduce(ReduceOp::Avg) = what {
            average_in_place(&mut flat, group.world_size())?;
        }
        unflatten(&flat, &mut tensors[range])?;
    }
    Ok(())
}

impl ProcessGroup {
    /// All-reduces every tensor in place, in buckets of at most `bucket_bytes` (see the module docs).
    pub fn allreduce_buckets(&self, tensors: &mut [Tensor], op: ReduceOp, bucket_bytes: usize) -> Result<()> {
        run(self, tensors, Collective::Allreduce(op), bucket_bytes)
    }

    /// Broadcasts every tensor from `root` in place, in buckets of at most `bucket_bytes`.
    pub fn broadcast_buckets(&self, tensors: &mut [Tensor], root: usize, bucket_bytes: usize) -> Result<()> {
        run(self, tensors, Collective::Broadcast(root), bucket_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_split_on_size_and_dtype() {
        let f = |n: i64| Tensor::zeros([n], (Kind::Float, Device::Cpu));
        let b = |n: i64| Tensor::zeros([n], (Kind::BFloat16, Device::Cpu));
        // 4-byte floats, 40-byte buckets.
        let ts = [f(4), f(4), f(4), b(2), b(2), f(20), f(1)];
        assert_eq!(plan(&ts, 40), vec![0..2, 2..3, 3..5, 5..6, 6..7]);
        assert_eq!(plan(&[], 40), Vec::<Range<usize>>::new());
    }

    #[test]
    fn flatten_and_unflatten_round_trip() {
        let mut ts = vec![Tensor::from_slice(&[1f32, 2.]).view([1, 2]), Tensor::from_slice(&[3f32])];
        let flat = flatten(&ts).unwrap() * 2.0;
        unflatten(&flat, &mut ts).unwrap();
        assert_eq!(Vec::<f32>::try_from(ts[0].view([-1])).unwrap(), vec![2., 4.]);
        assert_eq!(Vec::<f32>::try_from(&ts[1]).unwrap(), vec![6.]);
    }
}
