//! `frozen_lake_workflow`: Trinity-RFT's multi-turn FrozenLake (`FrozenLakeWorkflow`, after rLLM and RAGEN),
//! built in.
//!
//! Why built in rather than the WASM plugin in `plugins/frozen_lake`: that plugin is a different game (its own
//! prompt and grid symbols, start fixed in a corner, a move word anywhere in the reply), written to show how a
//! plugin workflow is made; configs naming `frozen_lake_workflow` expect Trinity's prompts, rendering, action
//! format and token budget, and a built-in runs with no plugin file to ship or load.
//!
//! The game: a square map of frozen tiles, holes, a start and a goal (`size`, `p` = probability of a frozen tile
//! and `seed` from the row; or `workflow_args.desc`, rows of `S`/`F`/`H`/`G`), generated until the goal is
//! reachable within `env_max_steps` (8) moves by Trinity's depth-first check. The conversation: Trinity's system
//! prompt, then each turn the observation (`Current Observation (k): \n` + the grid, one ` P \t` / ` _ \t` /
//! ` O \t` / ` G \t` cell after another, ` X ` in a hole, ` √ ` on the goal) and the reminders, and the model's
//! reply, whose last ```…``` block names the action (Up/Down/Left/Right, or 1–4). An unreadable action leaves
//! the player in place. `is_slippery` moves perpendicular to the intended direction with probability 2/3, as
//! Gymnasium's FrozenLake does. The episode ends at the goal, in a hole, after `agent_max_steps` (10) replies,
//! or when the replies and observations after the first prompt would exceed [`RESPONSE_BUDGET`] tokens: then
//! the last observation is dropped and the experience is marked response-truncated. Each reply may take what is
//! left of that budget (bounded by `max_model_len`), not `max_response_tokens`.
//!
//! Each of the `repeat_times` runs plays the same map from the start and is one experience over the whole
//! conversation, the model's tokens being its actions; reward 1 when the goal was reached, else 0. Metrics
//! (and info): `env_steps`, `env_done`, `test_score`.
//!
//! `step_wise_frozen_lake_workflow` plays the same game but records one experience per turn (as Trinity-RFT's
//! `step_wise_alfworld_workflow` does for ALFWorld), for step-level advantages (`gigpo`, `step_wise_grpo`): turn
//! t's experience is the conversation before its answer as the prompt and the answer as the response, `eid.step`
//! = t, the episode's reward on every turn, and in `info` the keys gigpo groups by: `env_state_hash`, a hash of
//! the grid the model saw before it acted (the anchor state: runs that stand on the same tile share it), and
//! `step_reward`, that turn's own reward from the game. Maps are generated with this crate's generator, so a seed
//! gives another map than in Trinity (NumPy); rows with `desc` play the same map. `workflow_args.reward_fn_type`
//! (an LLM judge in Trinity) is refused: it needs a model service.

use std::sync::Arc;

use serde_json::Value;
use tokio::task::JoinSet;
use trinity_buffer::{Eid, Experience, Task, TruncateStatus};
use trinity_model::ChatMessage;

use crate::conversation::{Conversation, TurnError};
use crate::error::ExplorerError;
use crate::math_workflow::{describe, mix, sampling_params};
use crate::workflow::{Workflow, WorkflowContext, WorkflowEntry, WorkflowFuture};

const SYSTEM_PROMPT: &str = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant. You are walking on \
a frozen lake.

FrozenLake Quick Guide
Goal: Reach the goal (G). Player (P) and Goal (G) must overlap.

Symbols:
_ Frozen | O Hole | G Goal | P Player

Rules:
1. Avoid falling into holes (O).
2. Frozen tiles are slippery, you may move perpendicular to your intended direction.

Valid Action (separated by | ):
Up | Down | Left | Right

Rewards:
Fall into hole: 0
Reach goal: +1.0

You will be provided the current observation, please decide on the next Action.
You should show your thought process and then input the final action in ``` ```.
You should only output the NEXT ACTION at each interation in the ``` ```. For example, if you want to move up, you \
should output ```Up```.
You should plan ahead and need to achieve it in minimum number of steps.
You should be aware that frozen tiles can be slippery, but the chance is small and you should not overthink it.

Please show your thinking process and put the final action in ``` ```. In every turn, the final action MUST be one \
of Up, Down, Left, Right.
";

const INVALID_REMINDER: &str = "\nYour last response is invalid. Your position didn't change at all. You may need \
to recheck your thinking process, action outputted, and the format of response. Remember, you should only output \
the NEXT ACTION at each interation in the ``` ```. For example, if you want to move up, you should output ```Up```.";

/// Trinity's actions: 1 Left, 2 Down, 3 Right, 4 Up (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Left,
    Down,
    Right,
    Up,
}

impl Action {
    /// Gymnasium's numbering (0 left, 1 down, 2 right, 3 up), for perpendicular slips.
    fn gym(self) -> usize {
        self as usize
    }

    fn from_gym(index: usize) -> Action {
        [Action::Left, Action::Down, Action::Right, Action::Up][index % 4]
    }
}

/// The action in the last ```…``` block of a reply (Trinity's `_parse_model_response`).
pub(crate) fn parse_action(reply: &str) -> Option<Action> {
    let mut last = None;
    let mut rest = reply;
    while let Some(start) = rest.find("```") {
        let after = &rest[start + 3..];
        let Some(end) = after.find("```") else { break };
        last = Some(&after[..end]);
        rest = &after[end + 3..];
    }
    let text = last?.trim().to_lowercase();
    // Digits name the action by number (Trinity: `isdigit()` then `int`), so `03` is Right.
    let number = text.bytes().all(|b| b.is_ascii_digit()).then(|| text.parse::<u64>().ok()).flatten();
    match (text.as_str(), number) {
        ("left", _) | (_, Some(1)) => Some(Action::Left),
        ("down", _) | (_, Some(2)) => Some(Action::Down),
        ("right", _) | (_, Some(3)) => Some(Action::Right),
        ("up", _) | (_, Some(4)) => Some(Action::Up),
        _ => None,
    }
}

/// A FrozenLake map: `cells[row][col]` one of `S`, `F`, `H`, `G`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Lake {
    cells: Vec<Vec<u8>>,
}

impl Lake {
    fn size(&self) -> (usize, usize) {
        (self.cells.len(), self.cells.first().map_or(0, Vec::len))
    }

    fn find(&self, tile: u8) -> Option<(usize, usize)> {
        self.cells.iter().enumerate().find_map(|(r, row)| row.iter().position(|&c| c == tile).map(|c| (r, c)))
    }

    /// A map from `desc` rows.
    pub(crate) fn from_desc(rows: &[String]) -> Result<Lake, String> {
        let cells: Vec<Vec<u8>> = rows.iter().map(|row| row.bytes().collect()).collect();
        let lake = Lake { cells };
        let (height, width) = lake.size();
        if height == 0 || lake.cells.iter().any(|row| row.len() != width) {
            return Err("workflow_args.desc must be rows of equal length".to_owned());
        }
        if lake.cells.iter().flatten().any(|c| !b"SFHG".contains(c)) || lake.find(b'S').is_none() {
            return Err("workflow_args.desc may hold only S, F, H, G, with one S".to_owned());
        }
        Ok(lake)
    }

    /// A random map whose goal is reachable within `max_steps` (Trinity's `generate_random_map`).
    pub(crate) fn generate(size: usize, p: f64, seed: u64, max_steps: usize) -> Lake {
        let mut state = seed;
        let mut next = move || {
            state = mix(&[state, 7]);
            state
        };
        let p = p.min(1.0);
        loop {
            let mut cells: Vec<Vec<u8>> =
                (0..size).map(|_| (0..size).map(|_| if unit(next()) < p { b'F' } else { b'H' }).collect()).collect();
            let (start, goal) = loop {
                let mut pick = || ((next() % size as u64) as usize, (next() % size as u64) as usize);
                let (start, goal) = (pick(), pick());
                if start != goal {
                    break (start, goal);
                }
            };
            cells[start.0][start.1] = b'S';
            cells[goal.0][goal.1] = b'G';
            let lake = Lake { cells };
            if lake.reachable(max_steps) {
                return lake;
            }
        }
    }

    /// Trinity's depth-first check (`is_valid`), quirks included: a tile is expanded once, by whichever path
    /// the stack reaches first.
    fn reachable(&self, max_steps: usize) -> bool {
        let (height, width) = self.size();
        let Some(start) = self.find(b'S') else { return false };
        let mut frontier = vec![(start.0, start.1, 0usize)];
        let mut discovered = vec![vec![false; width]; height];
        while let Some((r, c, steps)) = frontier.pop() {
            if steps > max_steps || discovered[r][c] {
                continue;
            }
            discovered[r][c] = true;
            for (dr, dc) in [(1i64, 0i64), (0, 1), (-1, 0), (0, -1)] {
                let (nr, nc) = (r as i64 + dr, c as i64 + dc);
                if nr < 0 || nc < 0 || nr >= height as i64 || nc >= width as i64 {
                    continue;
                }
                let (nr, nc) = (nr as usize, nc as usize);
                match self.cells[nr][nc] {
                    b'G' => return true,
                    b'H' => {}
                    _ => frontier.push((nr, nc, steps + 1)),
                }
            }
        }
        false
    }
}

fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// One game in progress.
#[derive(Debug, Clone)]
pub(crate) struct Game {
    lake: Lake,
    player: (usize, usize),
    slippery: bool,
    rng: u64,
}

impl Game {
    pub(crate) fn new(lake: Lake, slippery: bool, seed: u64) -> Game {
        let player = lake.find(b'S').unwrap_or((0, 0));
        Game { lake, player, slippery, rng: seed }
    }

    fn tile(&self) -> u8 {
        self.lake.cells[self.player.0][self.player.1]
    }

    pub(crate) fn done(&self) -> bool {
        matches!(self.tile(), b'G' | b'H')
    }

    pub(crate) fn success(&self) -> bool {
        self.tile() == b'G'
    }

    /// Trinity's `tiny_rgb_array` rendering.
    pub(crate) fn render(&self) -> String {
        let rows: Vec<String> = self
            .lake
            .cells
            .iter()
            .enumerate()
            .map(|(r, row)| {
                row.iter()
                    .enumerate()
                    .map(|(c, &tile)| match ((r, c) == self.player, tile) {
                        (true, b'H') => " X \t",
                        (true, b'G') => " √ \t",
                        (true, _) => " P \t",
                        (false, b'H') => " O \t",
                        (false, b'G') => " G \t",
                        (false, _) => " _ \t",
                    })
                    .collect()
            })
            .collect();
        rows.join("\n")
    }

    /// Takes `action` (none: stay); the reward is 1 on reaching the goal.
    pub(crate) fn step(&mut self, action: Option<Action>) -> f64 {
        let Some(action) = action else { return 0.0 };
        let mut direction = action;
        if self.slippery {
            self.rng = mix(&[self.rng, 11]);
            // Gymnasium: the intended direction or one of its two perpendiculars, each with probability 1/3.
            let turn = [3, 0, 1][(self.rng % 3) as usize];
            direction = Action::from_gym(action.gym() + turn);
        }
        let (height, width) = self.lake.size();
        let (r, c) = self.player;
        self.player = match direction {
            Action::Left => (r, c.saturating_sub(1)),
            Action::Down => ((r + 1).min(height - 1), c),
            Action::Right => (r, (c + 1).min(width - 1)),
            Action::Up => (r.saturating_sub(1), c),
        };
        if self.success() { 1.0 } else { 0.0 }
    }
}

/// The workflow's settings for one task.
#[derive(Debug, Clone)]
struct Settings {
    lake: Lake,
    agent_max_steps: usize,
    slippery: bool,
    seed: u64,
}

impl Settings {
    fn from_task(task: &Task) -> Result<Settings, String> {
        let args = &task.workflow_args;
        if args.get("reward_fn_type").is_some_and(|v| !v.is_null()) {
            return Err("workflow_args.reward_fn_type (a trajectory judge) needs a model service; remove it to \
                        score by the game's reward"
                .to_owned());
        }
        let count = |key: &str, default: usize| -> Result<usize, String> {
            match args.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v.as_u64().map(|n| n as usize).ok_or(format!("workflow_args.{key} must be a count")),
            }
        };
        let env_max_steps = count("env_max_steps", 8)?;
        let seed = task.raw.get("seed").and_then(Value::as_u64).unwrap_or(42);
        let lake = match args.get("desc") {
            Some(Value::Array(rows)) => {
                let rows: Vec<String> = rows.iter().filter_map(|r| r.as_str().map(str::to_owned)).collect();
                Lake::from_desc(&rows)?
            }
            Some(Value::Null) | None => {
                let size = task.raw.get("size").and_then(Value::as_u64).unwrap_or(1) as usize;
                if !(2..=32).contains(&size) {
                    return Err(format!("the row's `size` {size} must be between 2 and 32"));
                }
                let p = task.raw.get("p").and_then(Value::as_f64).unwrap_or(0.8);
                if p <= 0.0 {
                    return Err(format!("the row's `p` {p} must be positive (the share of frozen tiles)"));
                }
                Lake::generate(size, p, seed, env_max_steps)
            }
            Some(other) => return Err(format!("workflow_args.desc must be a list of rows, found {other}")),
        };
        let slippery = match args.get("is_slippery") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(format!("workflow_args.is_slippery must be true or false, found {other}")),
        };
        Ok(Settings { lake, agent_max_steps: count("agent_max_steps", 10)?, slippery, seed })
    }
}

/// Tokens the replies and observations after the first prompt may take in one conversation. Trinity-RFT 0.6.0's
/// `FrozenLakeWorkflow` reads it from `rollout_args["max_response_tokens"]` with 10240 as the default, and its
/// rollout args (`GenerationConfig`: temperature, top_p, top_k, logprobs, max_tokens, n) never hold that key, so
/// the budget is always 10240, whatever `max_tokens` or `model.max_response_tokens` say.
pub(crate) const RESPONSE_BUDGET: usize = 10240;

/// The user message of turn `step`.
pub(crate) fn observation_prompt(step: usize, observation: &str, unchanged: bool, max_steps: usize) -> String {
    let mut content = format!(
        "Current Observation ({step}): \n{observation}\nYou have not achieved the goal, P has not reached G yet. \
         Please give the next action."
    );
    if unchanged {
        content.push_str(INVALID_REMINDER);
    }
    if max_steps > step {
        content.push_str(&format!("\nThe maximum number of steps remaining is {}.", max_steps - step));
    }
    content
}

/// A stable 64-bit FNV-1a hash of an observation, in hex: the anchor state of a step-wise turn.
fn state_hash(observation: &str) -> String {
    let hash =
        observation.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("{hash:016x}")
}

/// One run: the conversation until the game ends, as one experience, or with `step_wise` one per turn.
async fn episode(
    task: &Task,
    ctx: &WorkflowContext,
    settings: &Settings,
    run: u32,
    step_wise: bool,
) -> Result<Vec<Experience>, ExplorerError> {
    let model = &ctx.model;
    let fail = |error: TurnError| ExplorerError::Task { task: describe(task), message: error.to_string() };
    let mut game = Game::new(settings.lake.clone(), settings.slippery, settings.seed);
    let mut messages = vec![ChatMessage::new("system", SYSTEM_PROMPT)];
    let mut conversation = Conversation::default();
    let (mut observation, mut last_observation) = (game.render(), None::<String>);
    let (mut steps, mut total, mut acted) = (0usize, 0.0, false);
    let mut truncated = false;
    let mut initial_length = 0;
    let mut turns = Vec::new();
    for turn in 0..settings.agent_max_steps {
        let unchanged = acted && last_observation.as_deref() == Some(observation.as_str());
        messages.push(ChatMessage::new(
            "user",
            observation_prompt(steps, &observation, unchanged, settings.agent_max_steps),
        ));
        let length = match conversation.extend_to(model, &messages) {
            Ok(length) => length,
            Err(TurnError::NotAPrefix) => {
                tracing::warn!("task {}: {}; the episode ends here", describe(task), TurnError::NotAPrefix);
                truncated = true;
                break;
            }
            Err(error) => return Err(fail(error)),
        };
        if turn == 0 {
            initial_length = length;
        }
        let budget = RESPONSE_BUDGET as i64 - (length - initial_length) as i64;
        if budget <= 0 {
            truncated = true;
            break;
        }
        let mut params = sampling_params(task, ctx);
        params.max_tokens = Some(budget as usize);
        params.seed = params.seed.map(|seed| mix(&[seed, u64::from(run), turn as u64]));
        let (start, version) = (conversation.len(), model.model_version());
        let completion = conversation.answer(model, params).await.map_err(fail)?;
        messages.push(ChatMessage::new("assistant", completion.text.clone()));
        let action = parse_action(&completion.text);
        let reward = game.step(action);
        total += reward;
        if step_wise {
            let eid = Eid { batch: task.batch_id, task: task.index as u64, run: u64::from(run), step: turn as u64 };
            if let Some(mut experience) = conversation.turn_experience(start, eid, model) {
                experience.model_version = version;
                experience.info.insert("env_state_hash".to_owned(), state_hash(&observation).into());
                experience.info.insert("step_reward".to_owned(), reward.into());
                turns.push(experience);
            }
        }
        acted = true;
        last_observation = Some(std::mem::replace(&mut observation, game.render()));
        steps += 1;
        if game.done() {
            break;
        }
    }
    let never = || ExplorerError::Task {
        task: describe(task),
        message: "the model never answered (agent_max_steps is 0 or the first prompt left no token budget)".into(),
    };
    let mut experiences = if step_wise {
        if turns.is_empty() {
            return Err(never());
        }
        turns
    } else {
        let eid = Eid { batch: task.batch_id, task: task.index as u64, run: u64::from(run), step: 0 };
        vec![conversation.into_experience(eid, model).ok_or_else(never)?]
    };
    let facts = [("env_steps", steps as f64), ("env_done", f64::from(game.done())), ("test_score", total)];
    let last = experiences.len() - 1;
    for (i, experience) in experiences.iter_mut().enumerate() {
        experience.reward = total;
        if truncated && i == last {
            experience.truncate_status = Some(TruncateStatus::ResponseTruncated);
        }
        for (key, value) in facts {
            experience.metrics.insert(key.to_owned(), value);
            experience.info.insert(key.to_owned(), value.into());
        }
        experience.info.insert("taskset".to_owned(), task.taskset.clone().into());
    }
    Ok(experiences)
}

#[derive(Debug, Clone, Copy)]
struct FrozenLake {
    step_wise: bool,
}

impl Workflow for FrozenLake {
    fn run<'a>(&'a self, task: &'a Task, ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async move {
            let settings =
                Settings::from_task(task).map_err(|message| ExplorerError::Task { task: describe(task), message })?;
            // The runs play concurrently so that the engine batches their turns together.
            let shared = Arc::new((task.clone(), ctx.clone(), settings));
            let step_wise = self.step_wise;
            let mut runs = JoinSet::new();
            for run in 0..ctx.repeat_times {
                let shared = Arc::clone(&shared);
                runs.spawn(async move {
                    let (task, ctx, settings) = &*shared;
                    (run, episode(task, ctx, settings, run, step_wise).await)
                });
            }
            let mut experiences = Vec::with_capacity(ctx.repeat_times as usize);
            while let Some(joined) = runs.join_next().await {
                let (run, result) = joined.map_err(|e| ExplorerError::Task {
                    task: describe(task),
                    message: format!("a FrozenLake run panicked: {e}"),
                })?;
                experiences.push((run, result?));
            }
            experiences.sort_by_key(|(run, _)| *run);
            Ok(experiences.into_iter().flat_map(|(_, turns)| turns).collect())
        })
    }
}

fn frozen_lake() -> Box<dyn Workflow> {
    Box::new(FrozenLake { step_wise: false })
}

fn step_wise_frozen_lake() -> Box<dyn Workflow> {
    Box::new(FrozenLake { step_wise: true })
}

inventory::submit! {
    WorkflowEntry {
        name: "frozen_lake_workflow",
        description: "Trinity's multi-turn FrozenLake: actions in ``` ```, reward 1 at the goal",
        build: frozen_lake,
    }
}

inventory::submit! {
    WorkflowEntry {
        name: "step_wise_frozen_lake_workflow",
        description: "FrozenLake with one experience per turn and gigpo's anchor states (env_state_hash, step_reward)",
        build: step_wise_frozen_lake,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lake(rows: &[&str]) -> Lake {
        Lake::from_desc(&rows.iter().map(|r| (*r).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn actions_come_from_the_last_code_block() {
        assert_eq!(parse_action("I think ```Left``` no, ```Up```"), Some(Action::Up));
        assert_eq!(parse_action("```  down ```"), Some(Action::Down));
        assert_eq!(parse_action("```3```"), Some(Action::Right));
        assert_eq!(parse_action("```03```"), Some(Action::Right));
        assert_eq!(parse_action("```5```"), None);
        assert_eq!(parse_action("Right"), None, "outside a code block it does not count");
        assert_eq!(parse_action("```Up``` then ```jump```"), None);
    }

    #[test]
    fn rendering_and_moves_follow_trinity() {
        let mut game = Game::new(lake(&["SF", "HG"]), false, 0);
        assert_eq!(game.render(), " P \t _ \t\n O \t G \t");
        assert_eq!(game.step(Some(Action::Up)), 0.0, "against the wall: no move");
        assert_eq!(game.step(None), 0.0);
        assert_eq!(game.step(Some(Action::Right)), 0.0);
        assert!(!game.done());
        assert_eq!(game.step(Some(Action::Down)), 1.0);
        assert!(game.done() && game.success());
        assert_eq!(game.render(), " _ \t _ \t\n O \t √ \t");
        let mut fall = Game::new(lake(&["SF", "HG"]), false, 0);
        fall.step(Some(Action::Down));
        assert!(fall.done() && !fall.success());
        assert_eq!(fall.render(), " _ \t _ \t\n X \t G \t");
    }

    #[test]
    fn slippery_ice_moves_perpendicular_two_times_in_three() {
        let mut sideways = 0;
        for seed in 0..300 {
            let mut game = Game::new(lake(&["FFF", "FSF", "FFG"]), true, seed);
            game.step(Some(Action::Up));
            match game.player {
                (0, 1) => {}
                (1, 0) | (1, 2) => sideways += 1,
                other => panic!("moved backwards to {other:?}"),
            }
        }
        assert!((170..230).contains(&sideways), "{sideways}");
    }

    #[test]
    fn generated_maps_are_reachable_and_seeded() {
        for seed in 0..50 {
            let lake = Lake::generate(4, 0.6, seed, 8);
            assert!(lake.reachable(8));
            assert_eq!(lake.cells.iter().flatten().filter(|&&c| c == b'S').count(), 1);
            assert_eq!(lake.cells.iter().flatten().filter(|&&c| c == b'G').count(), 1);
            assert_eq!(Lake::generate(4, 0.6, seed, 8), lake);
        }
        // A goal behind a wall of holes is not reachable.
        assert!(!lake(&["SH", "HG"]).reachable(8));
        // Nor beyond the step limit: 4 moves needed, the check allows max_steps + 1 to reach G.
        assert!(!lake(&["SFFFG"]).reachable(2));
        assert!(lake(&["SFFFG"]).reachable(3));
    }

    #[test]
    fn observation_prompts() {
        let first = observation_prompt(0, "grid", false, 10);
        assert_eq!(
            first,
            "Current Observation (0): \ngrid\nYou have not achieved the goal, P has not reached G yet. Please give \
             the next action.\nThe maximum number of steps remaining is 10."
        );
        let again = observation_prompt(3, "grid", true, 10);
        assert!(again.contains("Your last response is invalid.") && again.ends_with("remaining is 7."));
    }
}
