//! Generated arithmetic word problems, the quickstart's task: small, with an integer answer, deterministic
//! from a seed.
//!
//! Rows are `{"question": .., "answer": ..}` with the answer as a decimal string (what `math_reward`
//! compares against). Each problem takes one or two operations over small numbers (`max_operand`), so a
//! 135M-parameter model can learn them within a few minutes on two CPU cores; subtraction never goes below
//! zero and division is always exact.

use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// One arithmetic word problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArithmeticProblem {
    pub question: String,
    pub answer: String,
}

const NAMES: [&str; 10] = ["Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jade"];
const ITEMS: [&str; 10] =
    ["apples", "marbles", "stickers", "books", "pencils", "cookies", "stamps", "shells", "cards", "coins"];

/// `count` problems from `seed`; operands are at most `max_operand` (at least 2).
pub fn arithmetic_problems(seed: u64, count: usize, max_operand: i64) -> Vec<ArithmeticProblem> {
    let mut rng = Rng::new(seed);
    let max = max_operand.max(2);
    (0..count).map(|_| one_problem(&mut rng, max)).collect()
}

fn one_problem(rng: &mut Rng, max: i64) -> ArithmeticProblem {
    let name = *rng.pick(&NAMES);
    let item = *rng.pick(&ITEMS);
    let (question, answer) = match rng.range(0, 5) {
        0 => {
            let (a, b) = (rng.range(1, max), rng.range(1, max));
            (format!("{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?"), a + b)
        }
        1 => {
            let a = rng.range(2, max);
            let b = rng.range(1, a);
            (format!("{name} has {a} {item} and gives away {b}. How many {item} are left?"), a - b)
        }
        2 => {
            let (a, b) = (rng.range(2, max.min(12)), rng.range(2, max.min(12)));
            (format!("{name} buys {a} bags with {b} {item} in each bag. How many {item} is that in total?"), a * b)
        }
        3 => {
            let b = rng.range(2, max.min(10));
            let per = rng.range(1, max.min(10));
            let a = b * per;
            (format!("{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?"), per)
        }
        4 => {
            let (a, b) = (rng.range(1, max), rng.range(1, max));
            let c = rng.range(1, a + b);
            (
                format!("{name} has {a} {item}, finds {b} more, then loses {c}. How many {item} does {name} have now?"),
                a + b - c,
            )
        }
        _ => {
            let (a, b) = (rng.range(2, max.min(10)), rng.range(2, max.min(10)));
            let c = rng.range(1, max);
            (
                format!("{name} has {a} boxes of {b} {item} and {c} loose {item}. How many {item} are there in all?"),
                a * b + c,
            )
        }
    };
    ArithmeticProblem { question, answer: answer.to_string() }
}

/// `count` additions of two numbers in `lo..=hi` from `seed`, asked as `What is A + B? Answer with just the
/// number.` — the quickstart's task: small models start near zero on it with strict answer checking and learn it
/// within minutes of GRPO on two CPU cores.
pub fn addition_problems(seed: u64, count: usize, lo: i64, hi: i64) -> Vec<ArithmeticProblem> {
    let mut rng = Rng::new(seed);
    (0..count)
        .map(|_| {
            let (a, b) = (rng.range(lo, hi), rng.range(lo, hi));
            ArithmeticProblem {
                question: format!("What is {a} + {b}? Answer with just the number."),
                answer: (a + b).to_string(),
            }
        })
        .collect()
}

/// JSON Lines text of any rows (one object per line, trailing newline).
pub fn to_jsonl<T: Serialize>(rows: &[T]) -> Result<String, serde_json::Error> {
    let mut out = String::new();
    for row in rows {
        out.push_str(&serde_json::to_string(row)?);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::evaluate;

    #[test]
    fn deterministic_and_seed_dependent() {
        assert_eq!(arithmetic_problems(7, 20, 20), arithmetic_problems(7, 20, 20));
        assert_ne!(arithmetic_problems(7, 20, 20), arithmetic_problems(8, 20, 20));
        // A prefix of a longer run is the shorter run: `count` does not change earlier rows.
        assert_eq!(arithmetic_problems(7, 50, 20)[..20], arithmetic_problems(7, 20, 20)[..]);
    }

    #[test]
    fn answers_are_right_and_non_negative() {
        for p in arithmetic_problems(1, 500, 30) {
            let answer: i64 = p.answer.parse().unwrap();
            assert!(answer >= 0, "{p:?}");
            let numbers: Vec<f64> = p
                .question
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            let q = &p.question;
            let expected = if q.contains("more. How") {
                numbers[0] + numbers[1]
            } else if q.contains("gives away") {
                numbers[0] - numbers[1]
            } else if q.contains("bags") {
                numbers[0] * numbers[1]
            } else if q.contains("equally") {
                evaluate(&format!("{} / {}", numbers[0], numbers[1])).unwrap()
            } else if q.contains("loses") {
                numbers[0] + numbers[1] - numbers[2]
            } else {
                numbers[0] * numbers[1] + numbers[2]
            };
            assert_eq!(answer as f64, expected, "{p:?}");
        }
    }

    #[test]
    fn jsonl_rows() {
        let text = to_jsonl(&arithmetic_problems(3, 2, 10)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        let row: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert!(row["question"].is_string() && row["answer"].is_string());
    }
}
