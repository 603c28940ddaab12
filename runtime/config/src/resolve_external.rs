//! `model.external_model`: the rules for evaluating a hosted model through an OpenAI-compatible endpoint.
//!
//! Trinity-RFT allows it in mode `bench` only (`ModelConfigValidator._check_external_model`) and requires a model
//! name. The endpoint gets chat messages and returns text: keys that only mean something for a local model
//! (its chat template, a pre-filled reply, checkpoints, auxiliary models beside it) would silently do nothing,
//! so they are refused with what to do instead. The base URL and the API key are read from the environment by
//! variable name at load time, so `--dry-run` refuses a missing variable as the run would; neither value is
//! kept in the config, so the resolved dump never shows them.

use crate::config::{Config, Mode};
use crate::error::ConfigError;
use crate::interpolate::EnvLookup;
use crate::resolve::Resolver;

const ENABLE: &str = "model.external_model.enable";

impl Resolver<'_> {
    /// The mode and the fields of an enabled `model.external_model`; checked first, since the rest of the config
    /// is read differently without a local model.
    pub(crate) fn check_external_model(&mut self, config: &Config) -> Result<(), ConfigError> {
        let external = &config.model.external_model;
        if !external.enable {
            if *external != crate::model::ExternalModelConfig::default() {
                self.notes.push(
                    "model.external_model: `enable` is false, so its other keys have no effect and model.model_path \
                     is evaluated"
                        .into(),
                );
            }
            return Ok(());
        }
        self.require(
            config.mode == Mode::Bench,
            ENABLE,
            format!(
                "an external model is evaluated in mode `bench` only, as in Trinity-RFT: mode `{}` trains or serves \
                 the local model's weights, which an API endpoint does not expose; set `mode: bench`, or remove \
                 model.external_model to use model.model_path",
                config.mode.name()
            ),
        )?;
        let name = external.model_name.as_deref().unwrap_or_default();
        self.require(
            !name.trim().is_empty(),
            "model.external_model.model_name",
            "an external model needs the model id its requests name (Trinity-RFT requires it too), e.g. `gpt-4o-mini`",
        )?;
        for (key, var) in [("base_url_env", &external.base_url_env), ("api_key_env", &external.api_key_env)] {
            self.require(
                !var.is_empty() && !var.contains(['=', '\0']),
                &format!("model.external_model.{key}"),
                "must name an environment variable",
            )?;
        }
        Ok(())
    }

    /// Refuses what an enabled `model.external_model` cannot honour among the other keys (after the tasksets are
    /// resolved), and notes what it changes.
    pub(crate) fn resolve_external_model(&mut self, config: &Config) -> Result<(), ConfigError> {
        let external = &config.model.external_model;
        if !external.enable {
            return Ok(());
        }
        let name = external.model_name.as_deref().unwrap_or_default();
        let local_only: [(bool, &str, &str); 5] = [
            (
                config.explorer.bench_on_latest_checkpoint,
                "explorer.bench_on_latest_checkpoint",
                "an external model has no checkpoints to load: bench evaluates the endpoint once, as step 0; remove it",
            ),
            (
                !config.explorer.eval_on_startup,
                "explorer.eval_on_startup",
                "with model.external_model bench evaluates the endpoint once, as step 0 (Trinity-RFT's evaluation \
                 on startup), and false would evaluate nothing; remove it",
            ),
            (
                config.model.custom_chat_template.is_some() || config.model.chat_template_path.is_some(),
                if config.model.chat_template_path.is_some() {
                    "model.chat_template_path"
                } else {
                    "model.custom_chat_template"
                },
                "the endpoint renders the messages with its own chat template, which a request cannot replace; \
                 remove it",
            ),
            (
                config.model.enable_thinking.is_some() || config.explorer.rollout_model.enable_thinking.is_some(),
                if config.model.enable_thinking.is_some() {
                    "model.enable_thinking"
                } else {
                    "explorer.rollout_model.enable_thinking"
                },
                "it is passed to a local chat template, and the endpoint renders with its own; remove it (and \
                 choose the endpoint's model that thinks or not)",
            ),
            (
                config.explorer.rollout_model.enable_openai_api,
                "explorer.rollout_model.enable_openai_api",
                "the workflows' OpenAI-compatible server fronts a local engine, and with model.external_model there \
                 is none; remove it (the endpoint already speaks the OpenAI API)",
            ),
        ];
        for (set, key, why) in local_only {
            self.require(!set, key, why)?;
        }
        self.require(
            config.explorer.auxiliary_models.is_empty(),
            "explorer.auxiliary_models",
            "judges and teachers serve workflows that read the rollout model's tokens, which an external model does \
             not give; remove them",
        )?;
        for (i, taskset) in config.buffer.explorer_input.eval_tasksets.iter().enumerate() {
            let key = format!("buffer.explorer_input.eval_tasksets[{i}]");
            self.require(
                taskset.format.reply_prefix.is_none(),
                &format!("{key}.format.reply_prefix"),
                format!(
                    "taskset `{}`: a reply prefix pre-fills the start of the assistant's turn, which an OpenAI chat \
                     endpoint cannot continue; remove it",
                    taskset.name
                ),
            )?;
            let use_base = taskset.workflow_args.get("use_base").and_then(serde_json::Value::as_bool);
            self.require(
                use_base != Some(true),
                &format!("{key}.workflow_args.use_base"),
                format!(
                    "taskset `{}`: use_base sends a raw-text prompt through the model's tokenizer, and an external \
                     chat endpoint takes messages only; remove it",
                    taskset.name
                ),
            )?;
        }
        self.notes.push(format!(
            "model.external_model: bench evaluates `{name}` at ${} instead of model.model_path (`{}`, only a name \
             here), once, as step 0; responses are limited by rollout_args.max_tokens, else model.max_response_tokens \
             ({}); model.max_model_len and max_prompt_tokens are not enforced (trinity has no tokenizer for the \
             endpoint's model, which refuses prompts over its own limit)",
            external.base_url_env, config.model.model_path, config.model.resolved.max_response_tokens,
        ));
        Ok(())
    }

    /// Refuses a taskset of a workflow whose judge is an OpenAI-compatible endpoint (`rubric_judge_openai_workflow`)
    /// when its `workflow_args` or environment do not name one, as every task would fail on it.
    fn check_judge_endpoints(&self, config: &Config, env: EnvLookup<'_>) -> Result<(), ConfigError> {
        let input = &config.buffer.explorer_input;
        let tasksets = input.tasksets.iter().map(|t| ("tasksets", t)).enumerate();
        let evals = input.eval_tasksets.iter().map(|t| ("eval_tasksets", t)).enumerate();
        for (i, (list, taskset)) in tasksets.chain(evals) {
            let workflow = taskset.default_workflow_type.as_deref().unwrap_or_default();
            if !crate::external::needs_judge_endpoint(workflow) {
                continue;
            }
            if let Err(message) = crate::external::judge_endpoint_settings(&taskset.workflow_args, |v| env(v)) {
                return Err(self.invalid(
                    &format!("buffer.explorer_input.{list}[{i}].workflow_args"),
                    format!("taskset `{}`: `{workflow}` {message}", taskset.name),
                ));
            }
        }
        Ok(())
    }

    /// Refuses an enabled external model whose base URL or API key variable is not set (or whose URL is not
    /// http(s)). The values are only looked at, never stored: the run reads them again when it starts.
    pub(crate) fn check_external_env(&self, config: &Config, env: EnvLookup<'_>) -> Result<(), ConfigError> {
        self.check_judge_endpoints(config, env)?;
        let external = &config.model.external_model;
        if !external.enable {
            return Ok(());
        }
        let base_key = "model.external_model.base_url_env";
        let var = &external.base_url_env;
        let Some(url) = env(var.as_str()).filter(|v| !v.trim().is_empty()) else {
            return Err(self.invalid(
                base_key,
                format!(
                    "environment variable `{var}` is not set; export the endpoint's base URL in it (such as \
                     https://api.openai.com/v1, requests go to <base URL>/chat/completions), or name another variable"
                ),
            ));
        };
        self.require(
            url.starts_with("http://") || url.starts_with("https://"),
            base_key,
            format!("environment variable `{var}` holds `{url}`, which is not an http:// or https:// URL"),
        )?;
        let var = &external.api_key_env;
        self.require(
            env(var.as_str()).is_some(),
            "model.external_model.api_key_env",
            format!(
                "environment variable `{var}` is not set; export the endpoint's API key in it (any value, such as \
                 EMPTY, for an endpoint that checks none), or name another variable"
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::catalog::AnyName;
    use crate::error::ConfigError;
    use crate::testing::{assert_names, loaded_with_env};
    use crate::{LoadOptions, load_str};

    const KEY: &str = "sk-test-0123456789";

    fn bench(extra_model: &str, rest: &str) -> String {
        format!(
            "mode: bench\nmodel:\n  model_path: hosted\n  max_model_len: 64\n  external_model:\n    enable: true\n    \
             model_name: gpt-x\n{extra_model}buffer:\n  explorer_input:\n    eval_tasksets:\n      - name: test\n        \
             path: /e.jsonl\n{rest}"
        )
    }

    fn env(var: &str) -> Option<String> {
        match var {
            "OPENAI_BASE_URL" => Some("http://127.0.0.1:9/v1".to_owned()),
            "OPENAI_API_KEY" => Some(KEY.to_owned()),
            _ => None,
        }
    }

    fn error(text: &str, env: &dyn Fn(&str) -> Option<String>) -> ConfigError {
        let options = LoadOptions { overrides: &[], env, catalog: &AnyName, cwd: Path::new("/work") };
        match load_str(text, Path::new("c.yaml"), options) {
            Err(errors) => errors.into_vec().remove(0),
            Ok(loaded) => loaded.check_runnable().err().unwrap_or_else(|| panic!("accepted:\n{text}")),
        }
    }

    #[test]
    fn a_bench_config_loads_and_its_dump_names_variables_not_values() {
        let loaded = loaded_with_env(&bench("", ""), &env);
        let external = &loaded.config.model.external_model;
        assert!(external.enable);
        assert_eq!(external.model_name.as_deref(), Some("gpt-x"));
        assert_eq!(
            (external.base_url_env.as_str(), external.api_key_env.as_str()),
            ("OPENAI_BASE_URL", "OPENAI_API_KEY")
        );
        let dump = loaded.dry_run_yaml();
        assert!(dump.contains("api_key_env: OPENAI_API_KEY"), "{dump}");
        assert!(!dump.contains(KEY) && !dump.contains("127.0.0.1:9"), "{dump}");
        assert!(loaded.notes.iter().any(|n| n.contains("evaluates `gpt-x` at $OPENAI_BASE_URL")), "{:?}", loaded.notes);
        assert!(!loaded.notes.iter().any(|n| n.contains(KEY)), "{:?}", loaded.notes);
    }

    #[test]
    fn only_mode_bench_may_evaluate_an_external_model() {
        let text = bench("", "").replace("mode: bench", "mode: explore");
        assert_names(&error(&text, &env), "model.external_model.enable", &["mode `bench` only", "mode `explore`"]);
    }

    #[test]
    fn missing_variables_and_name_are_errors_naming_key_and_variable() {
        let none = |_: &str| None;
        let err = error(&bench("", ""), &none);
        assert_names(&err, "model.external_model.base_url_env", &["`OPENAI_BASE_URL` is not set"]);
        let url_only = |var: &str| (var == "MY_URL").then(|| "https://api.example/v1".to_owned());
        let err = error(&bench("    base_url_env: MY_URL\n    api_key_env: MY_KEY\n", ""), &url_only);
        assert_names(&err, "model.external_model.api_key_env", &["`MY_KEY` is not set", "EMPTY"]);
        let not_http = |var: &str| Some(if var == "OPENAI_BASE_URL" { "api.example/v1" } else { KEY }.to_owned());
        assert_names(&error(&bench("", ""), &not_http), "model.external_model.base_url_env", &["not an http"]);
        let text = bench("", "").replace("    model_name: gpt-x\n", "");
        assert_names(&error(&text, &env), "model.external_model.model_name", &["model id"]);
        assert!(!error(&bench("", ""), &not_http).to_string().contains(KEY));
    }

    #[test]
    fn keys_that_only_mean_something_locally_are_refused() {
        let cases = [
            (bench("", "explorer:\n  bench_on_latest_checkpoint: true\n"), "explorer.bench_on_latest_checkpoint"),
            (bench("", "explorer:\n  eval_on_startup: false\n"), "explorer.eval_on_startup"),
            (bench("  custom_chat_template: x\n", ""), "model.custom_chat_template"),
            (bench("  enable_thinking: false\n", ""), "model.enable_thinking"),
            (
                bench("", "explorer:\n  rollout_model:\n    enable_openai_api: true\n"),
                "explorer.rollout_model.enable_openai_api",
            ),
            (
                bench("", "        format:\n          reply_prefix: 'Answer:'\n"),
                "buffer.explorer_input.eval_tasksets[0].format.reply_prefix",
            ),
            (
                bench("", "        workflow_args:\n          use_base: true\n"),
                "buffer.explorer_input.eval_tasksets[0].workflow_args.use_base",
            ),
        ];
        for (text, key) in cases {
            assert_names(&error(&text, &env), key, &["remove it"]);
        }
    }
}
