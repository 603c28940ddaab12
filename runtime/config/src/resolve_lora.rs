//! `model.lora_configs`: Trinity-RFT's rules for LoRA (`ModelConfigValidator`'s LoRA part).
//!
//! Trinity-RFT serves one adapter (`"Only one lora adapter is supported for now."`), copies its rank, alpha and
//! modules into veRL's actor, and starts from `path` or a fresh ("dummy") adapter. The values the trainer and the
//! model read are checked here, so a bad one is an error naming its key before anything loads.

use serde_json::Value;

use crate::config::Config;
use crate::resolve::Resolver;

impl Resolver<'_> {
    pub(crate) fn resolve_lora(&mut self, config: &Config) {
        let Some(list) = &config.model.lora_configs else { return };
        if !self.check(
            list.len() == 1,
            "model.lora_configs",
            format!(
                "{} entries: trinity trains exactly one LoRA adapter, as Trinity-RFT does; give one entry, or remove \
                 the key to train every weight",
                list.len()
            ),
        ) {
            return;
        }
        let lora = &list[0];
        let key = |field: &str| format!("model.lora_configs[0].{field}");
        self.check(lora.lora_rank >= 1, &key("lora_rank"), "must be at least 1");
        self.check(lora.lora_alpha >= 1, &key("lora_alpha"), "must be at least 1");
        self.check_modules(&key("target_modules"), &lora.target_modules);
        if let Some(exclude) = &lora.exclude_modules {
            self.check_modules(&key("exclude_modules"), exclude);
        }
        if let Some(path) = &lora.path {
            self.check(!path.trim().is_empty(), &key("path"), "must name a PEFT adapter directory, or be left out");
            self.notes.push(format!(
                "model.lora_configs[0].path: training starts from the adapter in {path}; its adapter_config.json \
                 decides the rank, alpha and modules (lora_rank, lora_alpha, target_modules and exclude_modules here \
                 apply to fresh adapters only)"
            ));
        }
    }

    /// `target_modules` / `exclude_modules`: a string (`all-linear`, or a regular expression over whole module
    /// names) or a list of module names.
    fn check_modules(&mut self, key: &str, value: &Value) {
        match value {
            Value::String(s) if s == "all-linear" => {}
            Value::String(s) => {
                let compiled = regex::Regex::new(&format!("^(?:{s})$"));
                self.check(
                    compiled.is_ok(),
                    key,
                    format!("`{s}` is neither `all-linear` nor a regular expression over module names"),
                );
            }
            Value::Array(items) => {
                self.check(
                    !items.is_empty() && items.iter().all(Value::is_string),
                    key,
                    "must be a non-empty list of module names (`[q_proj, v_proj]`)",
                );
            }
            _ => {
                self.check(false, key, "must be `all-linear`, a list of module names or a regular expression");
            }
        }
    }
}
