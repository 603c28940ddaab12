//! Handing a train step's rows from one rank to the others: a data-parallel step needs the same rows on every
//! rank ([`crate::data_parallel`]), and only one of them needs to read the buffer.
//!
//! The encoding is private to one run (all ranks run the same binary): little-endian fields in [`TrainRow`]'s
//! order, each optional field behind a presence byte.

use trinity_collective::ProcessGroup;

use crate::batch::TrainRow;
use crate::error::{Result, TrainerError};

/// Every rank gets `root`'s rows; the others pass `None` (their argument is ignored when given).
pub fn share_rows(group: &ProcessGroup, root: usize, rows: Option<&[TrainRow]>) -> Result<Vec<TrainRow>> {
    let bytes = if group.rank() == root {
        let rows =
            rows.ok_or_else(|| TrainerError::DataParallel(format!("rank {root} must pass the rows it shares")))?;
        encode(rows)
    } else {
        Vec::new()
    };
    decode(&group.broadcast_bytes(&bytes, root)?)
}

struct Writer(Vec<u8>);

impl Writer {
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f32s(&mut self, v: &[f32]) {
        self.u64(v.len() as u64);
        v.iter().for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
    }
    fn opt<T: ?Sized>(&mut self, v: Option<&T>, f: impl FnOnce(&mut Self, &T)) {
        self.0.push(u8::from(v.is_some()));
        if let Some(v) = v {
            f(self, v);
        }
    }
    fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }
}

/// Rows as bytes.
pub fn encode(rows: &[TrainRow]) -> Vec<u8> {
    let mut w = Writer(Vec::new());
    w.u64(rows.len() as u64);
    for r in rows {
        w.u64(r.tokens.len() as u64);
        r.tokens.iter().for_each(|t| w.0.extend_from_slice(&t.to_le_bytes()));
        w.u64(r.prompt_length as u64);
        w.u64(r.action_mask.len() as u64);
        w.0.extend(r.action_mask.iter().map(|&m| u8::from(m)));
        w.f32s(&r.logprobs);
        w.opt(r.reward.as_ref(), |w, v| w.0.extend_from_slice(&v.to_le_bytes()));
        w.opt(r.token_level_rewards.as_deref(), Writer::f32s);
        w.opt(r.advantages.as_deref(), Writer::f32s);
        w.opt(r.teacher_logprobs.as_deref(), Writer::f32s);
        w.0.push(u8::from(r.expert));
        w.opt(r.group_id.as_deref(), Writer::str);
        w.opt(r.run_id.as_deref(), Writer::str);
        w.opt(r.step.as_ref(), |w, v| w.0.extend_from_slice(&v.to_le_bytes()));
        w.opt(r.routed_experts.as_ref(), |w, v| {
            w.u64(v.layers as u64);
            w.u64(v.top_k as u64);
            w.u64(v.ids.len() as u64);
            v.ids.iter().for_each(|e| w.0.extend_from_slice(&e.to_le_bytes()));
        });
    }
    w.0
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        if self.0.len() < N {
            return Err(TrainerError::DataParallel("shared rows are truncated".into()));
        }
        let (head, tail) = self.0.split_at(N);
        self.0 = tail;
        head.try_into().map_err(|_| TrainerError::DataParallel("shared rows are truncated".into()))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn len(&mut self) -> Result<usize> {
        let n = self.u64()? as usize;
        // Every element takes at least one byte: a length beyond what is left is corruption, not an allocation.
        if n > self.0.len() {
            return Err(TrainerError::DataParallel("shared rows hold an impossible length".into()));
        }
        Ok(n)
    }
    fn flag(&mut self) -> Result<bool> {
        Ok(self.take::<1>()?[0] != 0)
    }
    fn f32s(&mut self) -> Result<Vec<f32>> {
        let n = self.len()?;
        (0..n).map(|_| Ok(f32::from_le_bytes(self.take()?))).collect()
    }
    fn string(&mut self) -> Result<String> {
        let n = self.len()?;
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        String::from_utf8(head.to_vec()).map_err(|_| TrainerError::DataParallel("a shared id is not UTF-8".into()))
    }
}

/// Rows from [`encode`]'s bytes.
pub fn decode(bytes: &[u8]) -> Result<Vec<TrainRow>> {
    let mut r = Reader(bytes);
    let n = r.len()?;
    let mut rows = Vec::with_capacity(n);
    for _ in 0..n {
        let len = r.len()?;
        let tokens = (0..len).map(|_| Ok(i64::from_le_bytes(r.take()?))).collect::<Result<Vec<_>>>()?;
        let prompt_length = r.u64()? as usize;
        let mask_len = r.len()?;
        let action_mask = (0..mask_len).map(|_| r.flag()).collect::<Result<Vec<_>>>()?;
        let logprobs = r.f32s()?;
        let reward = if r.flag()? { Some(f32::from_le_bytes(r.take()?)) } else { None };
        let token_level_rewards = if r.flag()? { Some(r.f32s()?) } else { None };
        let advantages = if r.flag()? { Some(r.f32s()?) } else { None };
        let teacher_logprobs = if r.flag()? { Some(r.f32s()?) } else { None };
        let expert = r.flag()?;
        let group_id = if r.flag()? { Some(r.string()?) } else { None };
        let run_id = if r.flag()? { Some(r.string()?) } else { None };
        let step = if r.flag()? { Some(i64::from_le_bytes(r.take()?)) } else { None };
        let routed_experts = if r.flag()? {
            let (layers, top_k) = (r.u64()? as usize, r.u64()? as usize);
            let n = r.len()?;
            let ids = (0..n).map(|_| Ok(u16::from_le_bytes(r.take()?))).collect::<Result<Vec<_>>>()?;
            Some(crate::router_replay::RoutedExperts { layers, top_k, ids })
        } else {
            None
        };
        rows.push(TrainRow {
            tokens,
            prompt_length,
            action_mask,
            logprobs,
            reward,
            token_level_rewards,
            advantages,
            teacher_logprobs,
            expert,
            group_id,
            run_id,
            step,
            routed_experts,
        });
    }
    if !r.0.is_empty() {
        return Err(TrainerError::DataParallel("shared rows have trailing bytes".into()));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip() {
        let mut a = TrainRow::sft(&[1, 2], &[3, 4, 5]);
        a.logprobs = vec![-0.5, -1.0, -1.5];
        a.reward = Some(0.25);
        a.advantages = Some(vec![1.0, 2.0, 3.0]);
        a.group_id = Some("0.7".into());
        a.step = Some(-3);
        a.action_mask[1] = false;
        let mut b = TrainRow::sft(&[9], &[8]);
        b.expert = true;
        b.token_level_rewards = Some(vec![0.5]);
        b.teacher_logprobs = Some(vec![-2.0]);
        b.run_id = Some("r".into());
        b.routed_experts = Some(crate::router_replay::RoutedExperts { layers: 1, top_k: 2, ids: vec![3, 300] });
        let rows = vec![a, b];
        assert_eq!(decode(&encode(&rows)).unwrap(), rows);
        assert_eq!(decode(&encode(&[])).unwrap(), vec![]);
        let bytes = encode(&rows);
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
    }
}
