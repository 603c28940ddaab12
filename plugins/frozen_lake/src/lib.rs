//! `frozen_lake`: the FrozenLake game as a multi-turn trinity workflow plugin.
//!
//! The model stands on `S` of a generated grid and must reach `G` without stepping into a hole `H`. Each turn it
//! sees the grid and answers with a move (`up`, `down`, `left` or `right`, the first one its reply names); the
//! environment replies with the new grid, until the goal, a hole, or `max_steps` turns. Reward 1 for reaching
//! the goal, else 0. Every rollout of a task walks the same grid; each is one experience over the whole
//! conversation, the model's tokens of every turn being its actions.
//!
//! The grid comes from the row (`size`, `seed`, `holes` fraction; `workflow_args` give defaults, as do
//! `max_steps` and `system_prompt`), generated so that a path from start to goal always exists.

use std::collections::VecDeque;

use trinity_plugin_sdk::wasm::serde_json::Value;
use trinity_plugin_sdk::wasm::workflow::{
    Experience, Message, RunContext, Task, Workflow, chat_once, message, metric, task_args, task_row,
};

struct FrozenLake;

const SYSTEM_PROMPT: &str = "You are walking on a frozen lake. The grid shows you as P, the goal as G, holes as H \
and safe ice as `.`. Reply with one move: up, down, left or right.";

impl Workflow for FrozenLake {
    const NAME: &'static str = "frozen_lake";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str = "multi-turn FrozenLake: walk a generated grid to the goal, reward at the end";

    fn run(task: &Task, context: &RunContext) -> Result<Vec<Experience>, String> {
        let settings = Settings::from_task(task)?;
        let lake = Lake::generate(settings.size, settings.seed, settings.holes);
        let mut experiences = Vec::with_capacity(context.repeat_times as usize);
        for _ in 0..context.repeat_times {
            experiences.push(episode(&lake, &settings)?);
        }
        Ok(experiences)
    }
}

trinity_plugin_sdk::export_workflow!(FrozenLake);

/// One walk: turns until the goal, a hole or the step limit.
fn episode(lake: &Lake, settings: &Settings) -> Result<Experience, String> {
    let max_steps = settings.max_steps;
    let mut messages: Vec<Message> =
        vec![message("system", settings.system_prompt.clone()), message("user", lake.render(lake.start))];
    let mut position = lake.start;
    let (mut last_turn, mut steps, mut invalid) = (None, 0u32, 0u32);
    let mut outcome = Outcome::Walking;
    while steps < max_steps && outcome == Outcome::Walking {
        let reply = chat_once(&messages)?;
        last_turn = Some(reply.turn);
        steps += 1;
        let feedback = match parse_move(&reply.text) {
            Some(step) => {
                position = lake.step(position, step);
                outcome = lake.outcome(position);
                match outcome {
                    Outcome::Goal => "You reached the goal.".to_owned(),
                    Outcome::Hole => "You fell into a hole.".to_owned(),
                    Outcome::Walking => lake.render(position),
                }
            }
            None => {
                invalid += 1;
                format!("That is not a move. Answer up, down, left or right.\n{}", lake.render(position))
            }
        };
        messages.push(message("assistant", reply.text));
        messages.push(message("user", feedback));
    }
    let turn = last_turn.ok_or("max_steps is 0: the model never played")?;
    let reward = if outcome == Outcome::Goal { 1.0 } else { 0.0 };
    Ok(Experience {
        turn,
        reward,
        metrics: vec![
            metric("success", reward),
            metric("steps", f64::from(steps)),
            metric("invalid_moves", f64::from(invalid)),
        ],
        info: String::new(),
    })
}

struct Settings {
    system_prompt: String,
    size: usize,
    seed: u64,
    holes: f64,
    max_steps: u32,
}

impl Settings {
    fn from_task(task: &Task) -> Result<Settings, String> {
        let row = task_row(task)?;
        let args = task_args(task)?;
        let number = |key: &str| -> Option<f64> { row.get(key).or_else(|| args.get(key)).and_then(Value::as_f64) };
        let size = number("size").unwrap_or(4.0);
        if !(2.0..=10.0).contains(&size) {
            return Err(format!("size {size} must be between 2 and 10"));
        }
        let holes = number("holes").unwrap_or(0.2);
        if !(0.0..0.9).contains(&holes) {
            return Err(format!("holes {holes} must be a fraction below 0.9"));
        }
        let text = |key: &str| row.get(key).or_else(|| args.get(key)).and_then(Value::as_str).map(str::to_owned);
        Ok(Settings {
            system_prompt: text("system_prompt").unwrap_or_else(|| SYSTEM_PROMPT.to_owned()),
            size: size as usize,
            seed: number("seed").map_or(task.index, |s| s as u64),
            holes,
            max_steps: number("max_steps").unwrap_or(8.0) as u32,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    Up,
    Down,
    Left,
    Right,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Walking,
    Goal,
    Hole,
}

/// The first move word in `reply`.
fn parse_move(reply: &str) -> Option<Move> {
    let lower = reply.to_ascii_lowercase();
    [("up", Move::Up), ("down", Move::Down), ("left", Move::Left), ("right", Move::Right)]
        .into_iter()
        .filter_map(|(word, step)| lower.find(word).map(|at| (at, step)))
        .min_by_key(|(at, _)| *at)
        .map(|(_, step)| step)
}

/// A square grid: `holes[row * size + col]`.
struct Lake {
    size: usize,
    holes: Vec<bool>,
    start: (usize, usize),
    goal: (usize, usize),
}

impl Lake {
    /// A grid with the start in the top-left corner, the goal elsewhere and holes at random, retried until a
    /// path exists (always eventually: the last attempts have no holes).
    fn generate(size: usize, seed: u64, holes: f64) -> Lake {
        let mut rng = SplitMix(seed);
        for attempt in 0..64 {
            let density = if attempt < 48 { holes } else { 0.0 };
            let goal = loop {
                let cell = ((rng.next() % size as u64) as usize, (rng.next() % size as u64) as usize);
                if cell != (0, 0) {
                    break cell;
                }
            };
            let holes: Vec<bool> = (0..size * size)
                .map(|i| {
                    let cell = (i / size, i % size);
                    cell != (0, 0) && cell != goal && rng.unit() < density
                })
                .collect();
            let lake = Lake { size, holes, start: (0, 0), goal };
            if lake.reachable() {
                return lake;
            }
        }
        Lake { size, holes: vec![false; size * size], start: (0, 0), goal: (size - 1, size - 1) }
    }

    fn is_hole(&self, (row, col): (usize, usize)) -> bool {
        self.holes[row * self.size + col]
    }

    fn step(&self, (row, col): (usize, usize), step: Move) -> (usize, usize) {
        let last = self.size - 1;
        match step {
            Move::Up => (row.saturating_sub(1), col),
            Move::Down => ((row + 1).min(last), col),
            Move::Left => (row, col.saturating_sub(1)),
            Move::Right => (row, (col + 1).min(last)),
        }
    }

    fn outcome(&self, position: (usize, usize)) -> Outcome {
        if position == self.goal {
            Outcome::Goal
        } else if self.is_hole(position) {
            Outcome::Hole
        } else {
            Outcome::Walking
        }
    }

    fn reachable(&self) -> bool {
        let mut seen = vec![false; self.size * self.size];
        let mut queue = VecDeque::from([self.start]);
        seen[0] = true;
        while let Some(cell) = queue.pop_front() {
            if cell == self.goal {
                return true;
            }
            for step in [Move::Up, Move::Down, Move::Left, Move::Right] {
                let next = self.step(cell, step);
                let index = next.0 * self.size + next.1;
                if !seen[index] && !self.is_hole(next) {
                    seen[index] = true;
                    queue.push_back(next);
                }
            }
        }
        false
    }

    fn render(&self, position: (usize, usize)) -> String {
        let mut text = String::new();
        for row in 0..self.size {
            for col in 0..self.size {
                let cell = (row, col);
                text.push(if cell == position {
                    'P'
                } else if cell == self.goal {
                    'G'
                } else if self.is_hole(cell) {
                    'H'
                } else {
                    '.'
                });
            }
            text.push('\n');
        }
        text
    }
}

/// SplitMix64: a tiny deterministic generator (the sandbox has no need for entropy).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_generated_lake_has_a_path() {
        for seed in 0..200 {
            let lake = Lake::generate(4, seed, 0.5);
            assert!(lake.reachable(), "seed {seed}");
            assert_ne!(lake.goal, lake.start);
            assert!(!lake.is_hole(lake.start));
        }
    }

    #[test]
    fn moves_stay_on_the_grid_and_end_the_game() {
        let lake = Lake { size: 2, holes: vec![false, true, false, false], start: (0, 0), goal: (1, 1) };
        assert_eq!(lake.step((0, 0), Move::Up), (0, 0));
        assert_eq!(lake.outcome(lake.step((0, 0), Move::Right)), Outcome::Hole);
        assert_eq!(lake.outcome(lake.step((1, 0), Move::Right)), Outcome::Goal);
        assert_eq!(lake.render((0, 0)), "PH\n.G\n");
    }

    #[test]
    fn the_first_move_word_wins() {
        assert_eq!(parse_move("I go Down, then left"), Some(Move::Down));
        assert_eq!(parse_move("RIGHT"), Some(Move::Right));
        assert_eq!(parse_move("stay"), None);
    }
}
