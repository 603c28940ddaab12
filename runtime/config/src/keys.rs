//! Unknown and unsupported keys, found by walking the parsed tree against the generated JSON Schema.
//!
//! serde's `deny_unknown_fields` would also refuse a typo, but its message has neither a position nor a
//! suggestion, and it cannot tell a typo from a Trinity-RFT key that trinity deliberately does not support.
//! The schema walk does all three; serde's check stays as a second line.

use serde_json::Value;

use crate::error::closest;
use crate::yaml::{join_index, join_key};

/// A key the walk refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyProblem {
    /// Not a key of the schema at this point.
    Unknown { key: String, suggestion: Option<String> },
    /// A Trinity-RFT key that trinity does not support.
    Unsupported { key: String, reason: String },
}

/// Trinity-RFT keys trinity refuses, by (schema definition, key), with the reason users see.
const UNSUPPORTED: &[(&str, &str, &str)] = &[
    ("Config", "ray_namespace", "trinity does not use Ray; remove it"),
    ("Config", "checkpoint_job_dir", "it is derived from checkpoint_root_dir/project/group/name; remove it"),
    ("Config", "ignore_validator_suggestions", "trinity has no GPU-memory estimator to silence; remove it"),
    ("Config", "service", "the Data-Juicer service is not supported yet"),
    ("ModelConfig", "lora_configs", "LoRA training is not supported yet"),
    ("ModelConfig", "fully_sharded_loras", "LoRA training is not supported yet"),
    ("ModelConfig", "max_cpu_loras", "LoRA training is not supported yet"),
    ("ModelConfig", "tinker", "the Tinker backend is not supported"),
    ("ModelConfig", "external_model", "external API models are not supported yet"),
    ("BufferConfig", "explorer_output", "it is set automatically; remove it"),
    ("BufferConfig", "tokenizer_path", "it is set automatically; remove it"),
    ("BufferConfig", "pad_token_id", "it is set automatically; remove it"),
    ("BufferConfig", "cache_dir", "it is set automatically; remove it"),
    ("TrainerInput", "sft_warmup_dataset", "deprecated in Trinity-RFT; use `stages` with an `sft` stage"),
    ("TrainerInput", "sft_warmup_steps", "deprecated in Trinity-RFT; use `stages` with an `sft` stage"),
    ("FormatConfig", "image_key", "multi-modal data is not supported yet"),
    ("FormatConfig", "video_key", "multi-modal data is not supported yet"),
    ("TasksetConfig", "mm_data_kwargs", "multi-modal data is not supported yet"),
    ("TasksetConfig", "ray_namespace", "trinity does not use Ray; remove it"),
    ("TasksetConfig", "wrap_in_ray", "trinity does not use Ray; remove it"),
    ("TasksetConfig", "schema_type", "it is set automatically; remove it"),
    ("TasksetConfig", "is_eval", "it is set automatically; remove it"),
    ("TasksetConfig", "index", "it is set automatically; remove it"),
    ("TasksetConfig", "total_epochs", "it is copied from buffer.total_epochs; set that instead"),
    ("TasksetConfig", "total_steps", "it is copied from buffer.total_steps; set that instead"),
    ("ExplorerConfig", "auxiliary_models", "auxiliary models are not supported yet"),
    ("ExplorerConfig", "runner_num", "deprecated in Trinity-RFT; use runner_per_model"),
    ("ExplorerConfig", "concurrent_mode", "repeats of a task always share one batched request in trinity"),
    ("ExplorerConfig", "max_repeat_times_per_runner", "repeats of a task always share one batched request in trinity"),
    ("ExplorerConfig", "over_rollout", "over-rollout is not supported yet"),
    ("ExplorerConfig", "dynamic_timeout", "dynamic timeouts are not supported yet"),
    ("ExplorerConfig", "service_status_check_interval", "trinity has no rollout services to poll"),
    ("ExplorerConfig", "min_running_model_num", "trinity has no rollout services to poll"),
    ("ExplorerConfig", "db_url", "not supported yet"),
    ("ExplorerConfig", "runner_state_report_interval", "not supported yet"),
    ("RolloutModelConfig", "model_path", "it is copied from model.model_path; set that instead"),
    ("RolloutModelConfig", "max_model_len", "it is copied from model.max_model_len; set that instead"),
    ("RolloutModelConfig", "max_prompt_tokens", "it is copied from model.max_prompt_tokens; set that instead"),
    ("RolloutModelConfig", "max_response_tokens", "it is copied from model.max_response_tokens; set that instead"),
    ("RolloutModelConfig", "min_response_tokens", "it is copied from model.min_response_tokens; set that instead"),
    ("RolloutModelConfig", "enable_auto_tool_choice", "tool-call parsing is not supported yet"),
    ("RolloutModelConfig", "tool_call_parser", "tool-call parsing is not supported yet"),
    ("RolloutModelConfig", "reasoning_parser", "reasoning parsers are not supported yet"),
    ("RolloutModelConfig", "enable_log_requests", "not supported yet"),
    ("RolloutModelConfig", "bundle_indices", "it is set automatically; remove it"),
    (
        "TrainerConfig",
        "trainer_config",
        "inline veRL configs are not supported; use the trainer.* and algorithm.* keys",
    ),
    ("TrainerConfig", "trainer_config_path", "deprecated in Trinity-RFT; use the trainer.* keys"),
    ("TrainerConfig", "actor_grad_clip", "deprecated in Trinity-RFT; use trainer.grad_clip"),
    ("TrainerConfig", "ulysses_sequence_parallel_size", "sequence parallelism is not supported yet"),
    ("TrainerConfig", "fix_actor_microbatch_loss_scale", "not supported yet"),
    ("TrainerConfig", "save_strategy", "trinity saves from one process; remove it"),
    ("MonitorConfig", "enable_ray_timeline", "trinity does not use Ray; remove it"),
    ("MonitorConfig", "cache_dir", "it is set automatically; remove it"),
    ("SynchronizerConfig", "wait_for_checkpoint", "not supported yet"),
    ("SynchronizerConfig", "explorer_world_size", "it is set automatically; remove it"),
    ("SynchronizerConfig", "ray_namespace", "trinity does not use Ray; remove it"),
    ("DataProcessorConfig", "task_pipeline", "Data-Juicer task pipelines are not supported yet"),
    ("ExperiencePipelineConfig", "inputs", "extra pipeline inputs are not supported yet"),
    ("ExperiencePipelineConfig", "output", "the pipeline always writes to the trainer's experience buffer"),
    ("LogConfig", "group_by_node", "trinity runs on one node"),
    ("LogConfig", "save_dir", "it is set automatically; remove it"),
    ("AlgorithmConfig", "use_token_level_loss", "deprecated in Trinity-RFT; use loss_agg_mode"),
];

/// Walks `value` against the root `schema` and returns the first refused key.
pub fn check(schema: &Value, value: &Value) -> Option<KeyProblem> {
    Walker { root: schema }.walk(schema, "Config", value, "")
}

struct Walker<'a> {
    root: &'a Value,
}

impl<'a> Walker<'a> {
    /// Follows `$ref`s, remembering the name of the last definition (for the unsupported-key table).
    fn deref(&self, mut schema: &'a Value, mut name: &'a str) -> (&'a Value, &'a str) {
        while let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
            let Some(def) = reference.strip_prefix("#/$defs/") else {
                break;
            };
            match self.root.get("$defs").and_then(|defs| defs.get(def)) {
                Some(target) => {
                    schema = target;
                    name = def;
                }
                None => break,
            }
        }
        (schema, name)
    }

    fn walk(&self, schema: &'a Value, name: &'a str, value: &Value, path: &str) -> Option<KeyProblem> {
        let (schema, name) = self.deref(schema, name);
        for combinator in ["anyOf", "oneOf"] {
            if let Some(branches) = schema.get(combinator).and_then(Value::as_array) {
                let branch = branches.iter().find(|b| {
                    let (b, _) = self.deref(b, name);
                    shape_matches(b, value)
                })?;
                return self.walk(branch, name, value, path);
            }
        }
        match value {
            Value::Object(map) => {
                let properties = schema.get("properties").and_then(Value::as_object);
                let additional = schema.get("additionalProperties");
                for (key, item) in map {
                    let child_path = join_key(path, key);
                    if let Some(child) = properties.and_then(|p| p.get(key)) {
                        if let Some(problem) = self.walk(child, name, item, &child_path) {
                            return Some(problem);
                        }
                        continue;
                    }
                    match additional {
                        Some(Value::Bool(false)) => {
                            if let Some((_, _, reason)) =
                                UNSUPPORTED.iter().find(|(def, k, _)| *def == name && k == key)
                            {
                                return Some(KeyProblem::Unsupported { key: child_path, reason: (*reason).to_owned() });
                            }
                            let known = properties.into_iter().flat_map(|p| p.keys().map(String::as_str));
                            return Some(KeyProblem::Unknown { suggestion: closest(key, known), key: child_path });
                        }
                        Some(item_schema @ Value::Object(_)) => {
                            if let Some(problem) = self.walk(item_schema, name, item, &child_path) {
                                return Some(problem);
                            }
                        }
                        _ => {}
                    }
                }
                None
            }
            Value::Array(items) => {
                let item_schema = schema.get("items")?;
                items.iter().enumerate().find_map(|(i, item)| self.walk(item_schema, name, item, &join_index(path, i)))
            }
            _ => None,
        }
    }
}

/// Whether a schema branch describes the JSON type of `value` (to pick the branch of an `anyOf`).
fn shape_matches(schema: &Value, value: &Value) -> bool {
    let wanted = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    match schema.get("type") {
        Some(Value::String(t)) => t == wanted || (t == "integer" && wanted == "number"),
        Some(Value::Array(types)) => {
            types.iter().any(|t| t.as_str().is_some_and(|t| t == wanted || (t == "integer" && wanted == "number")))
        }
        // A branch without a type (an enum of strings, a nested anyOf) matches strings and everything else
        // it might describe; the typed deserializer reports real mismatches.
        _ => schema.get("properties").is_some() == (wanted == "object"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::json_schema;
    use serde_json::json;

    #[test]
    fn finds_typos_with_suggestions_at_any_depth() {
        let schema = json_schema();
        let tree = json!({"algorithm": {"optimizer": {"lr": 1e-5, "weight_decy": 0.1}}});
        assert_eq!(
            check(&schema, &tree),
            Some(KeyProblem::Unknown {
                key: "algorithm.optimizer.weight_decy".into(),
                suggestion: Some("weight_decay".into())
            })
        );
        let tree = json!({"buffer": {"explorer_input": {"eval_tasksets": [{"name": "a"}, {"pth": "x"}]}}});
        assert_eq!(
            check(&schema, &tree),
            Some(KeyProblem::Unknown {
                key: "buffer.explorer_input.eval_tasksets[1].pth".into(),
                suggestion: Some("path".into())
            })
        );
    }

    #[test]
    fn knows_trinity_keys_it_does_not_support() {
        let schema = json_schema();
        let tree = json!({"model": {"lora_configs": [{"lora_rank": 8}]}});
        assert!(matches!(
            check(&schema, &tree),
            Some(KeyProblem::Unsupported { key, .. }) if key == "model.lora_configs"
        ));
    }

    #[test]
    fn accepts_free_form_maps_and_option_sections() {
        let schema = json_schema();
        let tree = json!({
            "buffer": {"explorer_input": {"taskset": {"workflow_args": {"anything": {"goes": 1}}}}},
            "algorithm": {"advantage_fn_args": {"epsilon": 1e-6}},
            "plugins": ["a.wasm", {"path": "b.wasm", "override_builtin": true}],
        });
        assert_eq!(check(&schema, &tree), None);
        let tree = json!({"plugins": [{"path": "b.wasm", "overide": true}]});
        assert!(matches!(check(&schema, &tree), Some(KeyProblem::Unknown { .. })));
    }

    #[test]
    fn every_unsupported_entry_names_a_schema_definition() {
        let schema = json_schema();
        let defs = schema["$defs"].as_object().unwrap();
        for (def, key, _) in UNSUPPORTED {
            assert!(*def == "Config" || defs.contains_key(*def), "{def} is not a schema definition");
            let properties = if *def == "Config" { &schema["properties"] } else { &defs[*def]["properties"] };
            assert!(properties.get(*key).is_none(), "{def}.{key} is supported, not unsupported");
        }
    }
}
