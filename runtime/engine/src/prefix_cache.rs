//! The prefix cache: recent prompts and conversations whose keys and values stay in KV-cache slots no sequence
//! uses, so that a later prompt starting the same way prefills only the rest.
//!
//! Eval tasks and agent turns arrive one request at a time. Every task of a taskset starts with the same system
//! prompt and chat-template header, and an agent's next turn starts with its whole conversation so far: the
//! previous prompt and the model's answer. With several agents at once, each one's conversation must survive
//! the others' turns. vLLM (Trinity-RFT's engine) calls this automatic prefix caching and keeps it on by
//! default.
//!
//! The scheduler stores every admitted prompt after its prefill, and every finished single-sample request's
//! prompt plus answer (a turn that may continue; the samples of a GRPO group are not continued one by one).
//! The batch always comes first: entries live only in free slots, and an admission that needs an entry's slot
//! moves the entry to another free slot or, when none is left, evicts the least recently used entries. Entries
//! hold keys and values computed with the weights of their time, so the scheduler clears the cache whenever
//! the model may change. Storing costs one slot-to-slot copy of the entry's positions per layer, far less than
//! the prefill it saves.

use std::cmp::Reverse;

use trinity_model::KvCache;

use crate::error::Result;

/// The shortest start worth copying instead of computing (shorter shared starts are computed per prompt).
pub(crate) const MIN_REUSE: usize = 8;

/// How many tokens `a` and `b` share at their start.
pub(crate) fn common_start(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Tokens (a prompt, or a prompt and its answer) whose keys and values `slot` holds.
struct Entry {
    slot: usize,
    tokens: Vec<u32>,
    /// When it was last stored or matched (the cache's clock), for least-recently-used eviction.
    used: u64,
}

/// Where a prompt's start can be copied from: the first `len` positions of `slot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Match {
    pub(crate) slot: usize,
    pub(crate) len: usize,
}

/// The cached prompts and conversations (see the module docs).
#[derive(Default)]
pub(crate) struct PrefixCache {
    entries: Vec<Entry>,
    /// Stores and admissions so far.
    clock: u64,
}

impl PrefixCache {
    /// The entry sharing the longest start with `head` (a prompt without its last token, which the prefill
    /// must run to predict the first sampled token), when that start is worth copying.
    pub(crate) fn lookup(&self, head: &[u32]) -> Option<Match> {
        self.entries
            .iter()
            .map(|e| Match { slot: e.slot, len: common_start(&e.tokens, head) })
            .filter(|m| m.len >= MIN_REUSE)
            .max_by_key(|m| m.len)
    }

    /// Whether `slot` holds an entry.
    pub(crate) fn holds(&self, slot: usize) -> bool {
        self.entries.iter().any(|e| e.slot == slot)
    }

    /// Readies the cache for an admission that will use slots `..first_free`: the entries the admitted prompts'
    /// `heads` can reuse count as just used, the least recently used entries beyond the slots left free are
    /// evicted, and the entries below `first_free` move above it.
    pub(crate) fn make_room(&mut self, cache: &mut KvCache, first_free: usize, heads: &[&[u32]]) -> Result<()> {
        self.clock += 1;
        for head in heads {
            if let Some(m) = self.lookup(head)
                && let Some(e) = self.entries.iter_mut().find(|e| e.slot == m.slot)
            {
                e.used = self.clock;
            }
        }
        let room = cache.num_slots().saturating_sub(first_free);
        self.entries.sort_by_key(|e| Reverse(e.used));
        for evicted in self.entries.split_off(room.min(self.entries.len())) {
            cache.reset(evicted.slot)?;
        }
        // Popped from the top: entries keep to the highest slots, out of the way of the next admissions.
        let mut vacant: Vec<usize> = (first_free..cache.num_slots()).filter(|&s| !self.holds(s)).collect();
        for e in self.entries.iter_mut().filter(|e| e.slot < first_free) {
            // At most `room` entries are left, so a vacant slot is there for each one below `first_free`.
            let Some(to) = vacant.pop() else { break };
            cache.copy_slot(e.slot, to)?;
            cache.reset(e.slot)?;
            e.slot = to;
        }
        Ok(())
    }

    /// Keeps `tokens`, whose keys and values slot `src` holds, in a free slot from `first_free` on. An entry
    /// that already starts with all of `tokens` is only marked used; an entry that `tokens` extends (an agent's
    /// previous turn, or the prompt of a finished answer) is replaced, since the new one serves every prompt it
    /// served. When no slot is free, the least recently used entry makes way.
    pub(crate) fn insert(&mut self, cache: &mut KvCache, first_free: usize, src: usize, tokens: &[u32]) -> Result<()> {
        if tokens.len() < MIN_REUSE {
            return Ok(());
        }
        self.clock += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.tokens.starts_with(tokens)) {
            e.used = self.clock;
            return Ok(());
        }
        let extended = self.entries.iter().position(|e| tokens.starts_with(&e.tokens));
        let vacant = (first_free..cache.num_slots()).rev().find(|&s| !self.holds(s));
        let index = match (extended, vacant) {
            (Some(i), _) => i,
            (None, Some(slot)) => {
                self.entries.push(Entry { slot, tokens: Vec::new(), used: 0 });
                self.entries.len() - 1
            }
            (None, None) => match self.entries.iter().enumerate().min_by_key(|(_, e)| e.used) {
                Some((i, _)) => i,
                None => return Ok(()),
            },
        };
        let slot = self.entries[index].slot;
        if let Err(error) = cache.copy_prefix(src, slot, tokens.len()) {
            // A copy that failed half-way leaves the slot's contents unknown: drop the entry and free the slot.
            self.entries.swap_remove(index);
            cache.reset(slot)?;
            return Err(error.into());
        }
        let entry = &mut self.entries[index];
        entry.tokens.clear();
        entry.tokens.extend_from_slice(tokens);
        entry.used = self.clock;
        Ok(())
    }

    /// Forgets every entry and frees its slot.
    pub(crate) fn clear(&mut self, cache: &mut KvCache) {
        for e in self.entries.drain(..) {
            // The slot index is in range, so resetting it cannot fail.
            let _ = cache.reset(e.slot);
        }
    }

    /// Whether every entry sits in its own slot from `first_free` on and that slot holds exactly its tokens.
    pub(crate) fn consistent(&self, cache: &KvCache, first_free: usize) -> bool {
        self.entries.iter().enumerate().all(|(i, e)| {
            e.slot >= first_free
                && e.slot < cache.num_slots()
                && cache.len(e.slot) == e.tokens.len()
                && self.entries[..i].iter().all(|o| o.slot != e.slot)
        })
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};
    use trinity_model::{Decoder, ModelConfig, RandomWeights};

    use super::*;

    const SLOTS: usize = 4;

    /// A one-layer decoder and a cache of four slots; slot 0 is filled with `tokens` by a forward pass.
    fn setup(tokens: &[u32]) -> (Decoder, KvCache) {
        let config = ModelConfig::from_json(&serde_json::json!({
            "model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": true,
        }))
        .unwrap();
        let decoder = Decoder::load(config.clone(), &mut RandomWeights, Kind::Float, Device::Cpu).unwrap();
        let mut cache = KvCache::new(&config, SLOTS, 32, Kind::Float, Device::Cpu).unwrap();
        fill(&decoder, &mut cache, tokens);
        (decoder, cache)
    }

    /// Runs `tokens` into slot 0 (emptied first).
    fn fill(decoder: &Decoder, cache: &mut KvCache, tokens: &[u32]) {
        cache.reset(0).unwrap();
        let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
        let ids = Tensor::from_slice(&ids).view([1, ids.len() as i64]);
        let _ = tch::no_grad(|| decoder.forward_with_cache(&ids, cache, &[0], &[tokens.len()]).unwrap());
    }

    fn tokens(start: u32, len: u32) -> Vec<u32> {
        (start..start + len).collect()
    }

    #[test]
    fn entries_extend_replace_and_evict_the_least_recently_used() {
        let a = tokens(2, 12);
        let (decoder, mut cache) = setup(&a);
        let mut prefixes = PrefixCache::default();
        prefixes.insert(&mut cache, 1, 0, &a).unwrap();
        assert_eq!(prefixes.lookup(&[a.clone(), vec![40]].concat()), Some(Match { slot: 3, len: 12 }));
        // A start of an entry adds nothing; a prompt that extends an entry replaces it in its slot.
        prefixes.insert(&mut cache, 1, 0, &a[..10]).unwrap();
        let longer = [a.clone(), tokens(30, 4)].concat();
        fill(&decoder, &mut cache, &longer);
        prefixes.insert(&mut cache, 1, 0, &longer).unwrap();
        assert_eq!(prefixes.entries.len(), 1);
        assert_eq!(prefixes.lookup(&[longer.clone(), vec![9]].concat()), Some(Match { slot: 3, len: 16 }));
        // Shorter shared starts than MIN_REUSE are not worth a copy.
        assert_eq!(prefixes.lookup(&[a[..MIN_REUSE - 1].to_vec(), vec![50, 51]].concat()), None);
        // Two more prompts: the third takes the last vacant slot (1), the fourth evicts the oldest (`longer`).
        for (i, start) in [20u32, 40].into_iter().enumerate() {
            fill(&decoder, &mut cache, &tokens(start, 9));
            prefixes.insert(&mut cache, 1, 0, &tokens(start, 9)).unwrap();
            assert_eq!(prefixes.entries.len(), 2 + i);
        }
        fill(&decoder, &mut cache, &tokens(10, 9));
        prefixes.insert(&mut cache, 1, 0, &tokens(10, 9)).unwrap();
        assert_eq!(prefixes.lookup(&longer), None);
        assert!(prefixes.consistent(&cache, 1));
    }

    #[test]
    fn making_room_keeps_what_the_admission_reuses_and_moves_it_out_of_the_way() {
        let (decoder, mut cache) = setup(&tokens(2, 9));
        let mut prefixes = PrefixCache::default();
        for start in [2u32, 20, 40] {
            fill(&decoder, &mut cache, &tokens(start, 9));
            prefixes.insert(&mut cache, 1, 0, &tokens(start, 9)).unwrap();
        }
        // Entries fill slots 3, 2, 1 in that order. An admission of three slots leaves room for one: the one it
        // reuses (slot 2: neither the newest nor above the admission's slots), moved to the top.
        let head = [tokens(20, 9), vec![60]].concat();
        cache.reset(0).unwrap();
        prefixes.make_room(&mut cache, 3, &[&head]).unwrap();
        assert_eq!(prefixes.lookup(&head), Some(Match { slot: 3, len: 9 }));
        assert_eq!((cache.len(1), cache.len(2), cache.len(3)), (0, 0, 9));
        assert!(prefixes.consistent(&cache, 3));
        // An admission of every slot evicts it.
        prefixes.make_room(&mut cache, 4, &[]).unwrap();
        assert_eq!(prefixes.lookup(&head), None);
        assert_eq!(cache.len(3), 0);
        assert!(prefixes.consistent(&cache, 4));
    }
}
