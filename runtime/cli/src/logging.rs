//! Logging: human-readable lines on stderr, and the same events in a log file in the run directory.

use std::io::{IsTerminal, Write};
use std::path::Path;

use anyhow::{Context, Result};
use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, fmt};

use crate::cli::LogLevel;

/// Keeps the file writer flushing until the process ends; drop it last.
#[derive(Debug)]
pub(crate) struct LogGuard {
    _file: Option<WorkerGuard>,
}

/// stderr, keeping clear of `trinity run`'s live progress line (see [`crate::progress::around_log`]).
struct Console;

impl Write for Console {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        crate::progress::around_log(|| std::io::stderr().write_all(buf)).map(|()| buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Starts logging to stderr, and to the file `log` (a directory and a file name) when given.
pub(crate) fn init(level: LogLevel, log: Option<(&Path, &str)>) -> Result<LogGuard> {
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level.directive()));
    let console = fmt::layer()
        .with_writer(|| Console)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .with_filter(filter());
    let (file_layer, guard) = match log {
        Some((dir, file)) => {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create log directory {}", dir.display()))?;
            let appender = tracing_appender::rolling::never(dir, file);
            let (writer, guard) = tracing_appender::non_blocking(appender);
            let layer = fmt::layer().with_writer(writer).with_ansi(false).with_filter(filter());
            (Some(layer), Some(guard))
        }
        None => (None, None),
    };
    tracing_subscriber::registry().with(console).with(file_layer).try_init().context("cannot start logging")?;
    Ok(LogGuard { _file: guard })
}
