//! `reward_shaping_mapper`: reshapes rewards with statistics another step stored on the experience (Trinity-RFT's
//! `RewardShapingMapper`), e.g. a quality score a data-processing plugin wrote into `info`.
//!
//! Args: `reward_shaping_configs`, a list of `{stats_key, op_type, weight}` (op_type `ADD` | `SUB` | `MUL` | `DIV`,
//! default `ADD`; weight default 1.0), applied in order to each experience whose `info` holds `stats_key`:
//! `ADD` r += w·s, `SUB` r −= w·s, `MUL` r *= w·s, `DIV` r /= w·s (skipped when w·s = 0). An entry without
//! `stats_key`, or an experience without that stat, is left alone. Metrics: `reward_diff/{mean,min,max}` of the
//! change over the batch (0 for an empty batch).

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use trinity_buffer::Experience;

use crate::operator::{ExperienceOperator, OperatorEntry, OperatorOutput};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Debug, Clone, PartialEq)]
struct Shaping {
    stats_key: Option<String>,
    op: Op,
    weight: f64,
}

fn parse_configs(args: &Map<String, Value>) -> Result<Vec<Shaping>, String> {
    let list = match args.get("reward_shaping_configs") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => return Err(format!("args.reward_shaping_configs must be a list, found {other}")),
    };
    list.iter()
        .enumerate()
        .map(|(i, entry)| {
            let bad = |what: String| format!("args.reward_shaping_configs[{i}]: {what}");
            let entry = entry.as_object().ok_or_else(|| bad("must be a mapping".to_owned()))?;
            let stats_key = match entry.get("stats_key") {
                None | Some(Value::Null) => None,
                Some(Value::String(key)) => Some(key.clone()),
                Some(other) => return Err(bad(format!("stats_key must be a string, found {other}"))),
            };
            let op = match entry.get("op_type").and_then(Value::as_str).unwrap_or("ADD") {
                "ADD" => Op::Add,
                "SUB" => Op::Sub,
                "MUL" => Op::Mul,
                "DIV" => Op::Div,
                other => return Err(bad(format!("op_type `{other}` is not one of ADD, SUB, MUL, DIV"))),
            };
            let weight = match entry.get("weight") {
                None | Some(Value::Null) => 1.0,
                Some(value) => value.as_f64().ok_or_else(|| bad(format!("weight must be a number, found {value}")))?,
            };
            Ok(Shaping { stats_key, op, weight })
        })
        .collect()
}

/// Applies one shaping to `experience`; an error names a stat that is not a number.
fn shape(experience: &mut Experience, shaping: &Shaping) -> Result<(), String> {
    let Some(key) = &shaping.stats_key else { return Ok(()) };
    let Some(value) = experience.info.get(key) else { return Ok(()) };
    let stat = value
        .as_f64()
        .ok_or_else(|| format!("experience {}: info.{key} is {value}, not a number", experience.eid.uid()))?;
    let term = shaping.weight * stat;
    match shaping.op {
        Op::Add => experience.reward += term,
        Op::Sub => experience.reward -= term,
        Op::Mul => experience.reward *= term,
        Op::Div if term != 0.0 => experience.reward /= term,
        Op::Div => {}
    }
    Ok(())
}

#[derive(Debug)]
struct RewardShapingMapper;

impl ExperienceOperator for RewardShapingMapper {
    fn apply(&self, experiences: &[Experience], args: &Map<String, Value>) -> Result<OperatorOutput, String> {
        let configs = parse_configs(args)?;
        let mut out = Vec::with_capacity(experiences.len());
        let mut diffs = Vec::with_capacity(experiences.len());
        for experience in experiences {
            let mut shaped = experience.clone();
            for shaping in &configs {
                shape(&mut shaped, shaping)?;
            }
            diffs.push(shaped.reward - experience.reward);
            out.push(shaped);
        }
        let (mean, min, max) = if diffs.is_empty() {
            (0.0, 0.0, 0.0)
        } else {
            let min = diffs.iter().copied().fold(f64::INFINITY, f64::min);
            let max = diffs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (diffs.iter().sum::<f64>() / diffs.len() as f64, min, max)
        };
        let metrics = BTreeMap::from([
            ("reward_diff/mean".to_owned(), mean),
            ("reward_diff/min".to_owned(), min),
            ("reward_diff/max".to_owned(), max),
        ]);
        Ok(OperatorOutput { experiences: out, metrics, ..OperatorOutput::default() })
    }
}

inventory::submit! {
    OperatorEntry {
        name: "reward_shaping_mapper",
        description: "reshape rewards with info stats: reward ADD/SUB/MUL/DIV weight * info[stats_key]",
        build: || Box::new(RewardShapingMapper),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use trinity_buffer::Eid;

    fn experience(run: u64, reward: f64, info: Value) -> Experience {
        let mut e = Experience::single_turn(Eid { run, ..Eid::default() }, vec![1, 2, 3], 1, vec![0.0; 2]);
        e.reward = reward;
        e.info = info.as_object().cloned().unwrap_or_default();
        e
    }

    fn run(configs: Value, input: &[Experience]) -> Result<OperatorOutput, String> {
        let args = json!({ "reward_shaping_configs": configs });
        RewardShapingMapper.apply(input, args.as_object().unwrap())
    }

    #[test]
    fn shapes_in_order_with_trinitys_operations() {
        let input = [
            experience(0, 1.0, json!({"quality": 0.5, "len": 4.0})),
            experience(1, 0.0, json!({"quality": 1.0})),
            experience(2, 2.0, json!({})),
        ];
        // ADD 2·q, then MUL 0.5·len: run 0 → (1 + 1)·2 = 4; run 1 → 0 + 2 = 2 (no len); run 2 untouched.
        let configs = json!([
            {"stats_key": "quality", "op_type": "ADD", "weight": 2.0},
            {"stats_key": "len", "op_type": "MUL", "weight": 0.5},
        ]);
        let out = run(configs, &input).unwrap();
        let rewards: Vec<f64> = out.experiences.iter().map(|e| e.reward).collect();
        assert_eq!(rewards, [4.0, 2.0, 2.0]);
        assert_eq!(out.metrics["reward_diff/mean"], (3.0 + 2.0 + 0.0) / 3.0);
        assert_eq!(out.metrics["reward_diff/min"], 0.0);
        assert_eq!(out.metrics["reward_diff/max"], 3.0);
    }

    #[test]
    fn sub_div_and_defaults() {
        let input = [experience(0, 3.0, json!({"s": 2.0})), experience(1, 3.0, json!({"s": 0.0}))];
        let out = run(json!([{"stats_key": "s", "op_type": "DIV"}]), &input).unwrap();
        // DIV by zero is skipped.
        assert_eq!(out.experiences.iter().map(|e| e.reward).collect::<Vec<_>>(), [1.5, 3.0]);
        let out = run(json!([{"stats_key": "s", "op_type": "SUB", "weight": 0.5}, {"op_type": "MUL"}]), &input);
        assert_eq!(out.unwrap().experiences.iter().map(|e| e.reward).collect::<Vec<_>>(), [2.0, 3.0]);
        // Default op ADD, default weight 1.
        let out = run(json!([{"stats_key": "s"}]), &input).unwrap();
        assert_eq!(out.experiences[0].reward, 5.0);
        // No configs: unchanged, zero diffs.
        let out = RewardShapingMapper.apply(&input, &Map::new()).unwrap();
        assert_eq!(out.metrics["reward_diff/max"], 0.0);
    }

    #[test]
    fn bad_configs_and_stats_are_errors() {
        let input = [experience(0, 1.0, json!({"s": "high"}))];
        assert!(run(json!([{"stats_key": "s"}]), &input).unwrap_err().contains("not a number"));
        assert!(run(json!([{"stats_key": "s", "op_type": "POW"}]), &input).unwrap_err().contains("POW"));
        assert!(run(json!({"stats_key": "s"}), &input).unwrap_err().contains("list"));
    }
}
