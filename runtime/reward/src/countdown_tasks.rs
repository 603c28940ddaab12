//! Generated countdown puzzles: reach `target` with `numbers`, each used once, with `+ - * /`.
//!
//! Every puzzle is solvable by construction: the target is the value of a random expression over the
//! numbers (kept a positive integer, divisions exact). Rows are `{"numbers": [..], "target": ..}`, which is
//! also a valid `countdown_reward` reference; [`countdown_prompt`] renders TinyZero's prompt for a row.

use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// One countdown puzzle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountdownPuzzle {
    pub numbers: Vec<i64>,
    pub target: i64,
}

impl CountdownPuzzle {
    /// The reference answer as `countdown_reward` reads it.
    pub fn truth(&self) -> String {
        serde_json::json!({"target": self.target, "numbers": self.numbers}).to_string()
    }
}

/// `count` puzzles of `n_numbers` numbers (2..=6) in `1..=max_number`, from `seed`.
pub fn countdown_puzzles(seed: u64, count: usize, n_numbers: usize, max_number: i64) -> Vec<CountdownPuzzle> {
    let mut rng = Rng::new(seed);
    let n = n_numbers.clamp(2, 6);
    let max = max_number.max(2);
    (0..count).map(|_| one_puzzle(&mut rng, n, max)).collect()
}

fn one_puzzle(rng: &mut Rng, n: usize, max: i64) -> CountdownPuzzle {
    loop {
        let numbers: Vec<i64> = (0..n).map(|_| rng.range(1, max)).collect();
        // Fold the numbers in a shuffled order with random operators; retry when a step is not allowed.
        let mut order = numbers.clone();
        for i in (1..order.len()).rev() {
            let j = rng.range(0, i as i64) as usize;
            order.swap(i, j);
        }
        let mut value = order[0];
        let mut ok = true;
        for &x in &order[1..] {
            value = match rng.range(0, 3) {
                0 => value + x,
                1 if value > x => value - x,
                1 => x - value,
                2 => value * x,
                _ if value % x == 0 => value / x,
                _ if x % value == 0 => x / value,
                _ => value + x,
            };
            if value <= 0 || value > 1000 {
                ok = false;
                break;
            }
        }
        if ok {
            return CountdownPuzzle { numbers, target: value };
        }
    }
}

/// TinyZero's countdown prompt for a puzzle.
pub fn countdown_prompt(puzzle: &CountdownPuzzle) -> String {
    format!(
        "Using the numbers {:?}, create an equation that equals {}. You can use basic arithmetic operations \
         (+, -, *, /) and each number can only be used once. Show your work in <think> </think> tags. And return \
         the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.",
        puzzle.numbers, puzzle.target
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_valid_puzzles() {
        let a = countdown_puzzles(5, 100, 4, 20);
        assert_eq!(a, countdown_puzzles(5, 100, 4, 20));
        assert_ne!(a, countdown_puzzles(6, 100, 4, 20));
        for p in &a {
            assert_eq!(p.numbers.len(), 4);
            assert!(p.numbers.iter().all(|&x| (1..=20).contains(&x)));
            assert!(p.target > 0 && p.target <= 1000);
            assert!(crate::countdown::parse_truth(&p.truth()).is_ok());
        }
        let row = serde_json::to_value(&a[0]).unwrap();
        assert!(row["numbers"].is_array() && row["target"].is_i64());
        assert!(countdown_prompt(&a[0]).contains(&format!("equals {}", a[0].target)));
    }

    #[test]
    fn clamps_sizes() {
        assert_eq!(countdown_puzzles(1, 3, 1, 1)[0].numbers.len(), 2);
        assert_eq!(countdown_puzzles(1, 3, 9, 5)[0].numbers.len(), 6);
    }
}
