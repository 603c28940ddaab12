//! Unknown and unsupported keys, found by walking the parsed tree against the generated JSON Schema.
//!
//! serde's `deny_unknown_fields` would also refuse a typo, but its message has neither a position nor a
//! suggestion, and it cannot tell a typo from a Trinity-RFT key that trinity deliberately does not support.
//! The schema walk does all three; serde's check stays as a second line.

use serde_json::Value;

use crate::category::Category;
use crate::error::closest;
use crate::yaml::{join_index, join_key};

/// A key the walk refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyProblem {
    /// Not a key of the schema at this point.
    Unknown { key: String, suggestion: Option<String> },
    /// A Trinity-RFT key that trinity does not support, or a refused key set to a value other than its default.
    Unsupported { key: String, reason: String },
}

/// A key the user set whose category asks for a log line (placement and derived keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyNote {
    pub key: String,
    pub category: Category,
    pub note: String,
}

impl std::fmt::Display for KeyNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` ({}): {}", self.key, self.category.name(), self.note)
    }
}

/// Trinity-RFT keys trinity has no field for, by (schema definition, key), with the reason users see: always
/// refused, whatever their value.
pub const UNSUPPORTED: &[(&str, &str, &str)] = &[
    ("Config", "checkpoint_job_dir", "it is derived from checkpoint_root_dir/project/group/name; remove it"),
    (
        "Config",
        "service",
        "Data-Juicer runs as a Python service that trinity cannot start or reach; remove `service` and the operators that use it, or write the cleaning step as a WASM operator plugin (`cargo xtask new-plugin --kind operator`)",
    ),
    (
        "ModelConfig",
        "tinker",
        "Tinker is a hosted training service that cannot be reached from here; remove `model.tinker` to train locally",
    ),
    ("BufferConfig", "explorer_output", "it is set automatically; remove it"),
    ("BufferConfig", "tokenizer_path", "it is set automatically; remove it"),
    ("BufferConfig", "pad_token_id", "it is set automatically; remove it"),
    ("BufferConfig", "cache_dir", "it is set automatically; remove it"),
    ("TrainerInput", "sft_warmup_dataset", "deprecated in Trinity-RFT; use `stages` with an `sft` stage"),
    ("TrainerInput", "sft_warmup_steps", "deprecated in Trinity-RFT; use `stages` with an `sft` stage"),
    (
        "FormatConfig",
        "image_key",
        "trinity's models are text-only, so images and videos cannot reach the model; remove the key and use a text-only taskset",
    ),
    (
        "FormatConfig",
        "video_key",
        "trinity's models are text-only, so images and videos cannot reach the model; remove the key and use a text-only taskset",
    ),
    (
        "TasksetConfig",
        "mm_data_kwargs",
        "trinity's models are text-only, so images and videos cannot reach the model; remove the key and use a text-only taskset",
    ),
    ("TasksetConfig", "ray_namespace", "trinity does not use Ray; remove it"),
    ("TasksetConfig", "wrap_in_ray", "trinity does not use Ray; remove it"),
    ("TasksetConfig", "schema_type", "it is set automatically; remove it"),
    ("TasksetConfig", "is_eval", "it is set automatically; remove it"),
    ("TasksetConfig", "index", "it is set automatically; remove it"),
    ("TasksetConfig", "total_epochs", "it is copied from buffer.total_epochs; set that instead"),
    ("TasksetConfig", "total_steps", "it is copied from buffer.total_steps; set that instead"),
    ("RolloutModelConfig", "model_path", "it is copied from model.model_path; set that instead"),
    ("RolloutModelConfig", "max_model_len", "it is copied from model.max_model_len; set that instead"),
    ("RolloutModelConfig", "max_prompt_tokens", "it is copied from model.max_prompt_tokens; set that instead"),
    ("RolloutModelConfig", "max_response_tokens", "it is copied from model.max_response_tokens; set that instead"),
    ("RolloutModelConfig", "min_response_tokens", "it is copied from model.min_response_tokens; set that instead"),
    ("TrainerConfig", "trainer_config_path", "deprecated in Trinity-RFT; use the trainer.* keys"),
    ("TrainerConfig", "actor_grad_clip", "deprecated in Trinity-RFT; use trainer.grad_clip"),
    ("MonitorConfig", "cache_dir", "it is set automatically; remove it"),
    ("SynchronizerConfig", "explorer_world_size", "it is set automatically; remove it"),
    ("SynchronizerConfig", "ray_namespace", "trinity does not use Ray; remove it"),
    (
        "DataProcessorConfig",
        "task_pipeline",
        "Data-Juicer task pipelines run in Trinity-RFT's Python Data-Juicer service, which trinity cannot start; prepare the taskset beforehand and remove `task_pipeline`",
    ),
    (
        "ExperiencePipelineConfig",
        "inputs",
        "trinity's experience pipeline reads only the explorer's experiences; remove `inputs`",
    ),
    ("ExperiencePipelineConfig", "output", "the pipeline always writes to the trainer's experience buffer"),
    ("LogConfig", "save_dir", "it is set automatically; remove it"),
    ("AlgorithmConfig", "use_token_level_loss", "deprecated in Trinity-RFT; use loss_agg_mode"),
    (
        "Config",
        "cod",
        "CoD task packing is an experimental Trinity-RFT workflow setting trinity does not implement; remove it",
    ),
    ("ClusterConfig", "total_gpu_num", "it is derived from the cluster; remove it"),
    ("ClusterConfig", "rollout_gpu_num", "it is derived from the cluster; remove it"),
    ("ClusterConfig", "auxiliary_model_gpu_num", "it is derived from the cluster; remove it"),
    ("ClusterConfig", "explorer_gpu_num", "it is derived from the cluster; remove it"),
    ("ClusterConfig", "trainer_gpu_num", "it is derived from the cluster; remove it"),
    ("ClusterConfig", "trainer_node_num", "it is derived from the cluster; remove it"),
    ("ClusterConfig", "trainer_gpu_num_per_node", "it is derived from the cluster; remove it"),
    ("ExplorerConfig", "mode", "it is copied from the top-level `mode`; set that instead"),
    (
        "RolloutModelConfig",
        "temperature",
        "it is copied from model.temperature; set that (or a taskset's rollout_args) instead",
    ),
    ("RolloutModelConfig", "top_p", "it is copied from model.top_p; set that (or a taskset's rollout_args) instead"),
    ("RolloutModelConfig", "top_k", "it is copied from model.top_k; set that (or a taskset's rollout_args) instead"),
    ("RolloutModelConfig", "logprobs", "it is copied from model.logprobs; set that instead"),
    ("RolloutModelConfig", "repetition_penalty", "it is copied from model.repetition_penalty; set that instead"),
    (
        "RolloutModelConfig",
        "enable_prompt_truncation",
        "it is copied from model.enable_prompt_truncation; set that instead",
    ),
    ("RolloutModelConfig", "rope_scaling", "it is copied from model.rope_scaling; set that instead"),
    ("RolloutModelConfig", "rope_theta", "it is copied from model.rope_theta; set that instead"),
    ("RolloutModelConfig", "trust_remote_code", "it is copied from model.trust_remote_code; set that instead"),
    (
        "RolloutModelConfig",
        "name",
        "the rollout model answers over the OpenAI API under `model.model_path`; only auxiliary models take a `name`; remove it",
    ),
    ("RolloutModelConfig", "enable_multimodal", "trinity's models are text-only; remove it"),
    (
        "RolloutModelConfig",
        "base_port",
        "the workflows' OpenAI-compatible server listens on a free loopback port (each workflow run gets its URL); remove it",
    ),
    (
        "RolloutModelConfig",
        "api_key",
        "the workflows' OpenAI-compatible server listens on loopback only and checks no key; remove it",
    ),
    ("RolloutModelConfig", "external_model_config", "it is copied from model.external_model; set that instead"),
    ("RolloutModelConfig", "gpu_per_engine", "it is derived from the parallel sizes; remove it"),
    ("RolloutModelConfig", "nnodes", "it is derived from the cluster; remove it"),
    ("RolloutModelConfig", "node_rank", "it is derived from the cluster; remove it"),
    ("RolloutModelConfig", "enable_return_routed_experts", "it is set from algorithm.enable_router_replay; remove it"),
    ("RolloutModelConfig", "engine_id", "it is set automatically; remove it"),
    ("RolloutModelConfig", "ray_namespace", "trinity does not use Ray; remove it"),
    ("RolloutModelConfig", "ray_actor_name", "trinity does not use Ray; remove it"),
    ("RolloutModelConfig", "sync_method", "it is copied from synchronizer.sync_method; set that instead"),
    (
        "RolloutModelConfig",
        "checkpoint_job_dir",
        "it is derived from checkpoint_root_dir/project/group/name; remove it",
    ),
    ("RolloutModelConfig", "cuda_visible_devices", "it is set automatically; remove it"),
    ("RolloutModelConfig", "enable_lora", "it is set from model.lora_configs; set LoRA there and remove it"),
    (
        "RolloutModelConfig",
        "enable_runtime_lora_updating",
        "vLLM loads adapters at run time; trinity's rollout engine takes the trained adapter merged into its weights at every sync (model.lora_configs); remove it",
    ),
    ("RolloutModelConfig", "lora_modules", "it is set from model.lora_configs; set LoRA there and remove it"),
    ("RolloutModelConfig", "lora_kwargs", "it is set from model.lora_configs; set LoRA there and remove it"),
    ("LoraConfig", "is_dummy", "it is set automatically; remove it"),
    ("TrainerConfig", "trust_remote_code", "it is copied from model.trust_remote_code; set that instead"),
];

/// Walks `value` against the root `schema`: every refused key is an error (the walk goes on past each, so one
/// load reports them all); placement and derived keys the user set to something other than their default come
/// back as notes, one per key.
pub fn check(schema: &Value, value: &Value) -> Result<Vec<KeyNote>, Vec<KeyProblem>> {
    let mut walker = Walker { root: schema, notes: Vec::new(), problems: Vec::new() };
    walker.walk(schema, "Config", value, "");
    if walker.problems.is_empty() { Ok(walker.notes) } else { Err(walker.problems) }
}

struct Walker<'a> {
    root: &'a Value,
    notes: Vec<KeyNote>,
    problems: Vec<KeyProblem>,
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

    fn walk(&mut self, schema: &'a Value, name: &'a str, value: &Value, path: &str) {
        let (schema, name) = self.deref(schema, name);
        for combinator in ["anyOf", "oneOf"] {
            if let Some(branches) = schema.get(combinator).and_then(Value::as_array) {
                let branch = branches.iter().find(|b| {
                    let (b, _) = self.deref(b, name);
                    shape_matches(b, value)
                });
                // No branch of this shape: the typed deserializer reports the mismatch.
                if let Some(branch) = branch {
                    self.walk(branch, name, value, path);
                }
                return;
            }
        }
        match value {
            Value::Object(map) => {
                let properties = schema.get("properties").and_then(Value::as_object);
                let additional = schema.get("additionalProperties");
                for (key, item) in map {
                    let child_path = join_key(path, key);
                    if let Some(child) = properties.and_then(|p| p.get(key)) {
                        let category =
                            child.get("x-trinity-category").and_then(Value::as_str).and_then(Category::parse);
                        let note =
                            || child.get("x-trinity-note").and_then(Value::as_str).unwrap_or_default().to_owned();
                        match category {
                            Some(Category::Refused) if !same_as_default(item, child.get("default")) => {
                                self.problems.push(KeyProblem::Unsupported { key: child_path, reason: note() });
                            }
                            // A value equal to the default changes nothing even in Trinity-RFT; only other values
                            // are worth a line in the log.
                            Some(category @ (Category::Placement | Category::Derived))
                                if !same_as_default(item, child.get("default")) =>
                            {
                                self.notes.push(KeyNote { key: child_path, category, note: note() });
                            }
                            _ => self.walk(child, name, item, &child_path),
                        }
                        continue;
                    }
                    match additional {
                        Some(Value::Bool(false)) => {
                            let problem = match UNSUPPORTED.iter().find(|(def, k, _)| *def == name && k == key) {
                                Some((_, _, reason)) => {
                                    KeyProblem::Unsupported { key: child_path, reason: (*reason).to_owned() }
                                }
                                None => {
                                    let known = properties.into_iter().flat_map(|p| p.keys().map(String::as_str));
                                    KeyProblem::Unknown { suggestion: closest(key, known), key: child_path }
                                }
                            };
                            self.problems.push(problem);
                        }
                        Some(item_schema @ Value::Object(_)) => self.walk(item_schema, name, item, &child_path),
                        _ => {}
                    }
                }
            }
            Value::Array(items) => {
                if let Some(item_schema) = schema.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        self.walk(item_schema, name, item, &join_index(path, i));
                    }
                }
            }
            _ => {}
        }
    }
}

/// Whether a value the user wrote for a refused key is its default (so it changes nothing): `null`, the
/// default itself (numbers compared by value), or a mapping whose every entry is the default's.
fn same_as_default(value: &Value, default: Option<&Value>) -> bool {
    let Some(default) = default else {
        return value.is_null();
    };
    match (value, default) {
        (Value::Null, _) => true,
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Value::Object(map), Value::Object(defaults)) => {
            map.iter().all(|(k, v)| same_as_default(v, defaults.get(k).or(Some(&Value::Null))))
        }
        (Value::Array(items), Value::Array(defaults)) => {
            items.len() == defaults.len() && items.iter().zip(defaults).all(|(a, b)| same_as_default(a, Some(b)))
        }
        _ => value == default,
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
            check(&schema, &tree).err(),
            Some(vec![KeyProblem::Unknown {
                key: "algorithm.optimizer.weight_decy".into(),
                suggestion: Some("weight_decay".into())
            }])
        );
        let tree = json!({"buffer": {"explorer_input": {"eval_tasksets": [{"name": "a"}, {"pth": "x"}]}}});
        assert_eq!(
            check(&schema, &tree).err(),
            Some(vec![KeyProblem::Unknown {
                key: "buffer.explorer_input.eval_tasksets[1].pth".into(),
                suggestion: Some("path".into())
            }])
        );
    }

    #[test]
    fn reports_every_refused_key_not_only_the_first() {
        let schema = json_schema();
        let tree = json!({
            "algoritm": {},
            "model": {"tinker": {"enable": true}, "model_pth": "/m"},
            "buffer": {"explorer_input": {"eval_tasksets": [{"pth": "x"}, {"nme": "y"}]}},
        });
        let keys: Vec<String> = check(&schema, &tree)
            .unwrap_err()
            .into_iter()
            .map(|problem| match problem {
                KeyProblem::Unknown { key, .. } | KeyProblem::Unsupported { key, .. } => key,
            })
            .collect();
        assert_eq!(
            keys,
            [
                "algoritm",
                "model.tinker",
                "model.model_pth",
                "buffer.explorer_input.eval_tasksets[0].pth",
                "buffer.explorer_input.eval_tasksets[1].nme",
            ]
        );
    }

    #[test]
    fn knows_trinity_keys_it_does_not_support() {
        let schema = json_schema();
        let tree = json!({"model": {"tinker": {"enable": true}}});
        assert!(matches!(
            check(&schema, &tree).as_ref().map_err(Vec::as_slice),
            Err([KeyProblem::Unsupported { key, .. }]) if key == "model.tinker"
        ));
        // LoRA is accepted, but not the key Trinity-RFT sets itself.
        let tree = json!({"model": {"lora_configs": [{"lora_rank": 8, "is_dummy": true}]}});
        assert!(matches!(
            check(&schema, &tree).as_ref().map_err(Vec::as_slice),
            Err([KeyProblem::Unsupported { key, .. }]) if key == "model.lora_configs[0].is_dummy"
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
        assert_eq!(check(&schema, &tree), Ok(Vec::new()));
        let tree = json!({"plugins": [{"path": "b.wasm", "overide": true}]});
        assert!(matches!(check(&schema, &tree).as_ref().map_err(Vec::as_slice), Err([KeyProblem::Unknown { .. }])));
    }

    #[test]
    fn placement_keys_give_one_note_each_and_refused_keys_refuse_only_other_values() {
        let schema = json_schema();
        let tree = json!({
            "trainer": {"ulysses_sequence_parallel_size": 2, "trainer_config": {"actor_rollout_ref": {
                "ref": {"fsdp_config": {"param_offload": true}}, "actor": {"ppo_epochs": 2}}}},
            "explorer": {"rollout_model": {"engine_num": 4, "tool_call_parser": null}, "auxiliary_models": []},
            "buffer": {"trainer_input": {"experience_buffer": {"enable_progress_bar": true,
                "format": {"enable_concatenated_multi_turn": false}}}},
        });
        let notes = check(&schema, &tree).unwrap();
        let mut keys: Vec<&str> = notes.iter().map(|n| n.key.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "buffer.trainer_input.experience_buffer.enable_progress_bar",
                "explorer.rollout_model.engine_num",
                "trainer.trainer_config.actor_rollout_ref.ref.fsdp_config",
                "trainer.ulysses_sequence_parallel_size",
            ]
        );
        assert!(notes.iter().all(|n| n.category == Category::Placement), "{notes:?}");
        for (tree, key) in [
            (
                json!({"buffer": {"explorer_input": {"taskset": {"format": {"enable_concatenated_multi_turn": true}}}}}),
                "buffer.explorer_input.taskset.format.enable_concatenated_multi_turn",
            ),
            (json!({"trainer": {"fix_actor_microbatch_loss_scale": true}}), "trainer.fix_actor_microbatch_loss_scale"),
        ] {
            match check(&schema, &tree).as_ref().map_err(Vec::as_slice) {
                Err([KeyProblem::Unsupported { key: refused, reason }]) => {
                    assert_eq!(refused, key);
                    assert!(reason.len() > 20, "{reason}");
                }
                other => panic!("{key}: {other:?}"),
            }
        }
        assert!(check(&schema, &json!({"explorer": {"over_rollout": {"ratio": 0.5}}})).is_ok());
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
