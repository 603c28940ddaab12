//! Splitting a train step's rows into micro-batches for gradient accumulation.
//!
//! With a token budget (`trainer.use_dynamic_bsz`, budget `trainer.max_token_len_per_gpu`), rows are sorted by
//! length (longest first) and packed greedily while the micro-batch's *padded* size — rows × (longest prompt +
//! longest response) in it — stays within the budget, so the memory of one forward/backward is bounded and
//! similar lengths share a micro-batch (little padding). A row longer than the budget gets a micro-batch of its
//! own rather than an error. veRL instead balances effective (unpadded) token counts over
//! `⌈total / budget⌉` micro-batches because it removes padding; the count comes out about the same.
//!
//! With a fixed size (`use_dynamic_bsz: false`), consecutive rows form micro-batches of that many rows.
//!
//! Either way the loss of a micro-batch is scaled by `rows_in_micro / rows_in_step` (Trinity-RFT's
//! `micro_bsz / ppo_mini_batch_size`), so the accumulated gradient is the row-weighted mean of micro-batch
//! losses — see [`crate::trainer`].

use crate::batch::TrainRow;
use crate::error::{Result, TrainerError};

/// How micro-batches are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MicroBatching {
    /// At most this many padded tokens per micro-batch.
    TokenBudget(usize),
    /// This many rows per micro-batch.
    Rows(usize),
}

/// Splits `active` (indices into `rows`) into micro-batches; every index appears exactly once.
pub fn split(rows: &[TrainRow], active: &[usize], how: MicroBatching) -> Result<Vec<Vec<usize>>> {
    match how {
        MicroBatching::Rows(0) => Err(TrainerError::setting("micro_batch_rows", "must be at least 1")),
        MicroBatching::TokenBudget(0) => {
            Err(TrainerError::setting("trainer.max_token_len_per_gpu", "must be positive"))
        }
        MicroBatching::Rows(n) => Ok(active.chunks(n).map(<[usize]>::to_vec).collect()),
        MicroBatching::TokenBudget(budget) => {
            let mut order = active.to_vec();
            order.sort_by_key(|&i| std::cmp::Reverse(rows[i].tokens.len()));
            let mut out: Vec<Vec<usize>> = Vec::new();
            let (mut cur, mut max_p, mut max_r) = (Vec::new(), 0usize, 0usize);
            for i in order {
                let (p, r) = (rows[i].prompt_length.max(max_p), rows[i].response_length().max(max_r));
                if !cur.is_empty() && (cur.len() + 1) * (p + r) > budget {
                    out.push(std::mem::take(&mut cur));
                    (max_p, max_r) = (rows[i].prompt_length, rows[i].response_length());
                } else {
                    (max_p, max_r) = (p, r);
                }
                cur.push(i);
            }
            if !cur.is_empty() {
                out.push(cur);
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(lens: &[(usize, usize)]) -> Vec<TrainRow> {
        lens.iter().map(|&(p, r)| TrainRow::sft(&vec![1; p], &vec![2; r])).collect()
    }

    #[test]
    fn budget_bounds_padded_size() {
        let rows = rows(&[(2, 2), (4, 4), (2, 6), (3, 1), (1, 1)]);
        let all: Vec<usize> = (0..rows.len()).collect();
        let micro = split(&rows, &all, MicroBatching::TokenBudget(12)).unwrap();
        let mut seen: Vec<usize> = micro.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, all);
        for m in &micro {
            let p = m.iter().map(|&i| rows[i].prompt_length).max().unwrap();
            let r = m.iter().map(|&i| rows[i].response_length()).max().unwrap();
            assert!(m.len() * (p + r) <= 12, "{micro:?}");
        }
        // A row above the budget still trains, alone.
        let micro = split(&rows, &all, MicroBatching::TokenBudget(5)).unwrap();
        assert!(micro.iter().any(|m| m == &vec![1]));
    }

    #[test]
    fn fixed_rows_keep_order() {
        let rows = rows(&[(1, 1); 5]);
        let micro = split(&rows, &[4, 0, 1, 2, 3], MicroBatching::Rows(2)).unwrap();
        assert_eq!(micro, vec![vec![4, 0], vec![1, 2], vec![3]]);
        assert!(split(&rows, &[0], MicroBatching::Rows(0)).is_err());
    }
}
