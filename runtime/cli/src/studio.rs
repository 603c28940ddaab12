//! `trinity studio`: the web page over a checkpoint root, served by this binary (`trinity_studio`), with this
//! binary's registry behind config validation and the plugins page and its tokenizers behind the rollouts view.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use clap::Args;
use trinity_model::Tokenizer;
use trinity_studio::{Host, PluginRow, Problem, Studio, StudioOptions, Validation};

use crate::plugins;
use crate::registry::Registry;

#[derive(Debug, Args)]
pub(crate) struct StudioArgs {
    /// The checkpoint root whose runs the studio shows (the configs' `checkpoint_root_dir`).
    #[arg(long, value_name = "DIR", default_value = "checkpoints")]
    pub(crate) root: PathBuf,

    /// Address to listen on (`HOST:PORT`; port 0 picks a free one). Loopback by default: the studio reads every
    /// run under the root and writes config files, so listen elsewhere only on a network you trust.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8765")]
    pub(crate) listen: String,

    /// Load a plugin first, so the plugins page lists it and config validation knows its names; repeatable.
    #[arg(long = "plugin", value_name = "PATH")]
    pub(crate) plugins: Vec<PathBuf>,
}

pub(crate) fn run(args: StudioArgs) -> Result<()> {
    let specs: Vec<_> = args.plugins.iter().map(|path| plugins::spec_for(path)).collect();
    plugins::load(&specs)?;
    let workdir = std::env::current_dir().context("cannot read the working directory")?;
    let root = std::path::absolute(&args.root).with_context(|| format!("--root {}", args.root.display()))?;
    if !root.is_dir() {
        tracing::warn!("{} does not exist yet: the runs page stays empty until a run writes there", root.display());
    }
    let examples = Some(workdir.join("examples")).filter(|dir| dir.is_dir());
    let options = StudioOptions { root: root.clone(), listen: args.listen, workdir: workdir.clone(), examples };
    let host = Arc::new(CliHost { registry: Registry::builtin(), workdir, tokenizers: Mutex::default() });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("cannot start the studio's runtime")?;
    runtime.block_on(async {
        let studio = Studio::bind(options, host).await?;
        let address = studio.local_addr()?;
        // The first line a user (or a test) reads: where to point the browser.
        println!("studio: http://{address}/ (runs under {})", root.display());
        std::io::stdout().flush().context("cannot write to stdout")?;
        studio.serve().await?;
        Ok::<(), anyhow::Error>(())
    })
}

/// This binary's side of the studio.
struct CliHost {
    registry: Registry,
    workdir: PathBuf,
    /// Tokenizers by model path, loaded on first use.
    tokenizers: Mutex<HashMap<PathBuf, Arc<Tokenizer>>>,
}

impl Host for CliHost {
    fn validate(&self, text: &str, path: &Path) -> Validation {
        let env = |var: &str| std::env::var(var).ok();
        let options =
            trinity_config::LoadOptions { overrides: &[], env: &env, catalog: &self.registry, cwd: &self.workdir };
        let loaded = match trinity_config::load_str(text, path, options) {
            Ok(loaded) => loaded,
            Err(errors) => {
                return Validation {
                    problems: errors.iter().map(Problem::from_config_error).collect(),
                    notes: vec![],
                    resolved: None,
                };
            }
        };
        let notes: Vec<String> =
            loaded.notes.iter().chain(loaded.stages.iter().flat_map(|s| &s.notes)).map(ToString::to_string).collect();
        let problems = match crate::run::check(&loaded, path) {
            Ok(()) => Vec::new(),
            Err(error) => match error.downcast_ref::<trinity_config::ConfigError>() {
                Some(config_error) => vec![Problem::from_config_error(config_error)],
                None => vec![Problem::general(crate::report::chain(&error))],
            },
        };
        Validation { problems, notes, resolved: Some(loaded.dry_run_yaml()) }
    }

    fn plugins(&self) -> Vec<PluginRow> {
        plugins::listing()
            .into_iter()
            .map(|row| PluginRow { kind: row.kind, name: row.name, version: row.version, origin: row.origin })
            .collect()
    }

    fn token_texts(&self, model_path: &Path, ids: &[u32]) -> Result<Vec<String>, String> {
        let tokenizer = self.tokenizer(model_path).map_err(|e| crate::report::chain(&e))?;
        ids.iter().map(|id| tokenizer.decode(&[*id], false).map_err(|e| format!("token {id}: {e}"))).collect()
    }
}

impl CliHost {
    fn tokenizer(&self, model_path: &Path) -> Result<Arc<Tokenizer>> {
        let mut cache = self.tokenizers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tokenizer) = cache.get(model_path) {
            return Ok(Arc::clone(tokenizer));
        }
        let tokenizer = Arc::new(load_tokenizer(model_path)?);
        cache.insert(model_path.to_owned(), Arc::clone(&tokenizer));
        Ok(tokenizer)
    }
}

/// The tokenizer of a model (an HF directory's `tokenizer.json`, or a GGUF file's metadata), without its weights.
fn load_tokenizer(model_path: &Path) -> Result<Tokenizer> {
    if model_path.is_dir() {
        let config_path = model_path.join("tokenizer_config.json");
        let config: Option<serde_json::Value> = match std::fs::read_to_string(&config_path) {
            Ok(text) => Some(serde_json::from_str(&text).with_context(|| config_path.display().to_string())?),
            Err(_) => None,
        };
        return Ok(Tokenizer::from_files(&model_path.join("tokenizer.json"), config.as_ref())?);
    }
    let gguf = trinity_model::GgufFile::open(model_path)?;
    Tokenizer::from_gguf(&gguf).with_context(|| model_path.display().to_string())
}
