//! Generated tasks are scored correctly by the rewards they are meant for.

use serde_json::Map;
use trinity_reward::arithmetic_tasks::{arithmetic_problems, to_jsonl};
use trinity_reward::countdown::countdown_score;
use trinity_reward::countdown_tasks::countdown_puzzles;
use trinity_reward::{RewardInput, score, total};

#[test]
fn arithmetic_answers_earn_full_math_reward() {
    let args = Map::new();
    for p in arithmetic_problems(11, 100, 25) {
        let response = format!("<think>compute</think>\n<answer>{}</answer>", p.answer);
        let input = RewardInput { response: &response, truth: Some(&p.answer), prompt: Some(&p.question), args: &args };
        assert_eq!(total(&score("math_reward", &input).unwrap()), 1.1, "{p:?}");
    }
    let text = to_jsonl(&arithmetic_problems(11, 3, 25)).unwrap();
    assert_eq!(text.lines().count(), 3);
}

/// Every way to combine three numbers with one binary tree shape or the other.
fn solve3(numbers: &[i64], target: i64) -> Option<String> {
    let perms = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
    for p in perms {
        let (a, b, c) = (numbers[p[0]], numbers[p[1]], numbers[p[2]]);
        for x in ["+", "-", "*", "/"] {
            for y in ["+", "-", "*", "/"] {
                for eq in [format!("({a} {x} {b}) {y} {c}"), format!("{a} {x} ({b} {y} {c})")] {
                    if trinity_reward::expr::evaluate(&eq).is_ok_and(|v| (v - target as f64).abs() < 1e-5) {
                        return Some(eq);
                    }
                }
            }
        }
    }
    None
}

#[test]
fn countdown_puzzles_are_solvable_and_solutions_score_one() {
    for puzzle in countdown_puzzles(3, 60, 3, 30) {
        let equation = solve3(&puzzle.numbers, puzzle.target).unwrap_or_else(|| panic!("unsolvable {puzzle:?}"));
        let response = format!("<think>search</think>\n<answer>{equation}</answer>");
        let truth = trinity_reward::countdown::parse_truth(&puzzle.truth()).unwrap();
        assert_eq!(countdown_score(&response, &truth), 1.0, "{puzzle:?} {equation}");
    }
}
