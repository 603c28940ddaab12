//! A preallocated, bounded key/value cache with independent slots, for batched generation.
//!
//! Layout per layer: keys and values `[num_slots, kv_heads, capacity + 1, head_dim]` in the model's dtype on the
//! model's device, allocated once. A slot is one sequence (one request, or one of its n samples); its first
//! `len(slot)` positions are valid. Column `capacity` is a scratch column: right-padding tokens of a ragged
//! prefill are written there so they never overwrite real entries, and no query ever attends to it.
//!
//! Invariants: `len(slot) <= capacity`; entries past `len(slot)` are garbage and masked out by
//! [`crate::Decoder::forward_with_cache`]; nothing here reallocates after construction, so a decode step costs
//! no concatenation.

use tch::{Device, Kind, Tensor};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// Per-layer key/value storage for `num_slots` sequences of at most `capacity` tokens each.
#[derive(Debug)]
pub struct KvCache {
    pub(crate) keys: Vec<Tensor>,
    pub(crate) values: Vec<Tensor>,
    lens: Vec<usize>,
    capacity: usize,
}

impl KvCache {
    /// Allocates a cache for `config`'s layer shapes. `kind` and `device` must match the model's.
    ///
    /// Memory: `2 * layers * num_slots * kv_heads * (capacity + 1) * head_dim * sizeof(kind)`.
    pub fn new(config: &ModelConfig, num_slots: usize, capacity: usize, kind: Kind, device: Device) -> Result<Self> {
        if num_slots == 0 || capacity == 0 {
            return Err(ModelError::KvCache("num_slots and capacity must be positive".into()));
        }
        let shape = [num_slots as i64, config.num_key_value_heads, capacity as i64 + 1, config.head_dim];
        let mut keys = Vec::new();
        let mut values = Vec::new();
        for _ in 0..config.num_hidden_layers {
            keys.push(Tensor::f_zeros(shape, (kind, device))?);
            values.push(Tensor::f_zeros(shape, (kind, device))?);
        }
        Ok(Self { keys, values, lens: vec![0; num_slots], capacity })
    }

    /// How many sequences the cache holds at once.
    pub fn num_slots(&self) -> usize {
        self.lens.len()
    }

    /// The most tokens (prompt + generated) one slot can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Number of valid cached tokens in `slot` (also the position the next token of that slot gets).
    pub fn len(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }

    /// Whether every slot is empty.
    pub fn is_empty(&self) -> bool {
        self.lens.iter().all(|&l| l == 0)
    }

    /// Frees a slot for a new sequence (O(1): entries are overwritten later, never cleared).
    pub fn reset(&mut self, slot: usize) -> Result<()> {
        self.truncate(slot, 0)
    }

    /// Forgets all but the first `len` tokens of `slot` (e.g. to roll back a rejected draft).
    pub fn truncate(&mut self, slot: usize, len: usize) -> Result<()> {
        self.check_slot(slot)?;
        if len > self.lens[slot] {
            return Err(ModelError::KvCache(format!(
                "slot {slot} holds {} tokens, cannot grow to {len}",
                self.lens[slot]
            )));
        }
        self.lens[slot] = len;
        Ok(())
    }

    /// Copies the valid entries of `src` into `dst` (which then has the same length). Used to share one prompt
    /// prefill between n samples: prefill once, copy into n-1 more slots, then decode all n.
    pub fn copy_slot(&mut self, src: usize, dst: usize) -> Result<()> {
        self.check_slot(src)?;
        self.copy_prefix(src, dst, self.lens[src])
    }

    /// Copies the first `len` entries of `src` into `dst`, which then holds those `len` tokens: a prompt start
    /// another prompt shares.
    pub fn copy_prefix(&mut self, src: usize, dst: usize, len: usize) -> Result<()> {
        self.check_slot(src)?;
        self.check_slot(dst)?;
        if len > self.lens[src] {
            return Err(ModelError::KvCache(format!("slot {src} holds {} tokens, not {len}", self.lens[src])));
        }
        let n = len as i64;
        if src != dst && n > 0 {
            tch::no_grad(|| -> Result<()> {
                for t in self.keys.iter_mut().chain(self.values.iter_mut()) {
                    let from = t.f_select(0, src as i64)?.f_narrow(1, 0, n)?;
                    t.f_select(0, dst as i64)?.f_narrow(1, 0, n)?.f_copy_(&from)?;
                }
                Ok(())
            })?;
        }
        self.lens[dst] = len;
        Ok(())
    }

    pub(crate) fn check_slot(&self, slot: usize) -> Result<()> {
        if slot >= self.lens.len() {
            return Err(ModelError::KvCache(format!("slot {slot} out of range (cache has {})", self.lens.len())));
        }
        Ok(())
    }

    pub(crate) fn set_len(&mut self, slot: usize, len: usize) {
        self.lens[slot] = len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;

    #[test]
    fn copy_prefix_copies_the_first_entries_and_refuses_more_than_the_source_holds() {
        let config = ModelConfig::tiny(Family::Llama);
        let mut cache = KvCache::new(&config, 3, 8, Kind::Float, Device::Cpu).unwrap();
        for t in cache.keys.iter_mut().chain(cache.values.iter_mut()) {
            let _ =
                t.f_select(0, 0).unwrap().f_copy_(&Tensor::rand(t.size()[1..].to_vec(), (Kind::Float, Device::Cpu)));
        }
        cache.set_len(0, 5);
        cache.copy_prefix(0, 2, 3).unwrap();
        assert_eq!(cache.len(2), 3);
        for t in &cache.keys {
            let (src, dst) = (t.select(0, 0).narrow(1, 0, 3), t.select(0, 2).narrow(1, 0, 3));
            assert!(src.equal(&dst));
        }
        assert!(matches!(cache.copy_prefix(0, 1, 6), Err(ModelError::KvCache(_))));
        assert_eq!(cache.len(1), 0);
    }
}
