//! trinity studio: a web page, served by the binary itself, to watch runs, read their rollouts and build configs.
//!
//! The studio only reads run directories (`monitor/metrics.jsonl`, the experiences files, checkpoints, the
//! `status/` records written by [`run_record`]); it never talks to a running process, so it works the same on a
//! live run, a finished one, or a copy of one. What only the binary can do (validate a config exactly like
//! `trinity run --dry-run`, list plugins, decode tokens with a run's tokenizer) comes in through [`Host`], which
//! keeps this crate free of libtorch and wasmtime.
//!
//! Pieces: [`runs`] finds runs under the root, [`metrics`], [`rollouts`] and [`failed_tasks`] read their files
//! incrementally (a growing file is read from where the last request stopped; a huge experiences file is indexed,
//! never held),
//! `server` answers the JSON API and serves the page (`assets/`, with uPlot embedded at build time), behind
//! `request_guard`, which answers only requests addressed to the studio by its own name and lets only its own page
//! change anything (validate or save a config).

mod assets;
mod config_api;
pub mod error;
pub mod failed_tasks;
pub mod host;
pub mod metrics;
mod query;
mod request_guard;
pub mod rollouts;
pub mod run_record;
pub mod runs;
mod server;
mod tail;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

pub use crate::error::StudioError;
pub use crate::host::{Host, PluginRow, Problem, Validation};
pub use crate::run_record::{RunRecord, RunStatus};

/// Where the studio looks and listens.
#[derive(Debug, Clone)]
pub struct StudioOptions {
    /// The checkpoint root the runs are under (`checkpoint_root_dir`).
    pub root: PathBuf,
    /// `HOST:PORT`; port 0 picks a free one. Requests must name the studio by this address in their `Host`
    /// header (on loopback also `localhost`; on `0.0.0.0` any IP literal), which is what defeats DNS rebinding.
    pub listen: String,
    /// Where configs are saved, and relative paths in them resolve.
    pub workdir: PathBuf,
    /// Example configs offered on the config page.
    pub examples: Option<PathBuf>,
}

/// A bound, not yet serving, studio.
#[derive(Debug)]
pub struct Studio {
    listener: tokio::net::TcpListener,
    router: axum::Router,
}

impl Studio {
    /// Binds the address; the page is served once [`Studio::serve`] runs.
    pub async fn bind(options: StudioOptions, host: Arc<dyn Host>) -> Result<Studio, StudioError> {
        let listener = tokio::net::TcpListener::bind(&options.listen)
            .await
            .map_err(|source| StudioError::Bind { address: options.listen.clone(), source })?;
        let address = listener.local_addr().map_err(StudioError::Serve)?;
        let router = router_at(options, host, address)?;
        Ok(Studio { listener, router })
    }

    /// The address it listens on (with the port picked when 0 was asked for).
    pub fn local_addr(&self) -> Result<SocketAddr, StudioError> {
        self.listener.local_addr().map_err(StudioError::Serve)
    }

    /// Serves until the process ends.
    pub async fn serve(self) -> Result<(), StudioError> {
        axum::serve(self.listener, self.router).await.map_err(StudioError::Serve)
    }
}

/// The studio's routes over `options.root`, for embedding or testing without a socket. `options.listen` must be
/// the `IP:PORT` the requests are addressed to (their `Host`), since no socket says where it listens.
pub fn router(options: StudioOptions, host: Arc<dyn Host>) -> Result<axum::Router, StudioError> {
    let address = options.listen.parse::<SocketAddr>().map_err(|e| StudioError::Bind {
        address: options.listen.clone(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("give it as IP:PORT ({e})")),
    })?;
    router_at(options, host, address)
}

/// The routes of a studio whose requests arrive at `address`, with a fresh token for its page.
fn router_at(options: StudioOptions, host: Arc<dyn Host>, address: SocketAddr) -> Result<axum::Router, StudioError> {
    let guard = request_guard::RequestGuard::new(address, &options.listen)?;
    let page = assets::index_html(guard.token());
    let state = server::AppState::new(options.root, options.workdir, options.examples, host, page);
    Ok(server::router(Arc::new(state), Arc::new(guard)))
}

#[cfg(test)]
mod tests;
