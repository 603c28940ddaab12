//! A plugin's stdout and stderr: captured into a capped buffer per Store, and written to the run log line by line
//! under the plugin's name after each call.
//!
//! Past the cap ([`OUTPUT_CAP`] bytes between two drains), output is counted and dropped, and the log says how
//! much was dropped. The plugin's writes still succeed: Rust's `eprintln!` panics when stderr fails, and a plugin
//! must not trap for talking too much.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Bytes of one stream kept between two drains: a panic message with its backtrace fits many times over.
pub(crate) const OUTPUT_CAP: usize = 64 << 10;

/// One captured stream; clones share the buffer.
#[derive(Debug, Clone)]
pub(crate) struct CapturedOutput {
    stream: &'static str,
    buffer: Arc<Mutex<Buffer>>,
}

#[derive(Debug, Default)]
struct Buffer {
    bytes: Vec<u8>,
    dropped: u64,
}

impl CapturedOutput {
    /// A capture of the stream called `stream` (`stdout`, `stderr`) in the log.
    pub(crate) fn new(stream: &'static str) -> Self {
        CapturedOutput { stream, buffer: Arc::default() }
    }

    fn append(&self, bytes: &[u8]) {
        let mut buffer = self.buffer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let room = OUTPUT_CAP.saturating_sub(buffer.bytes.len());
        let kept = bytes.len().min(room);
        buffer.bytes.extend_from_slice(&bytes[..kept]);
        buffer.dropped += (bytes.len() - kept) as u64;
    }

    /// What was captured since the last drain, with a line saying how much was dropped; `None` when nothing.
    pub(crate) fn drain(&self) -> Option<String> {
        let mut buffer = self.buffer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let taken = std::mem::take(&mut *buffer);
        drop(buffer);
        if taken.bytes.is_empty() && taken.dropped == 0 {
            return None;
        }
        let mut text = String::from_utf8_lossy(&taken.bytes).into_owned();
        if taken.dropped > 0 {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!(
                "[{} more bytes of {} dropped: over the {} KiB kept per call]",
                taken.dropped,
                self.stream,
                OUTPUT_CAP >> 10
            ));
        }
        Some(text)
    }

    /// Writes what was captured to the run log, one event per line, naming the plugin and the stream (stderr as
    /// warnings: that is where panics go).
    pub(crate) fn log(&self, plugin: &str) {
        let Some(text) = self.drain() else { return };
        for line in text.lines() {
            if self.stream == "stderr" {
                tracing::warn!("plugin {plugin} stderr: {line}");
            } else {
                tracing::info!("plugin {plugin} stdout: {line}");
            }
        }
    }
}

impl IsTerminal for CapturedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl Pollable for CapturedOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for CapturedOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Any size: writes never block and never fail.
        Ok(1 << 20)
    }
}

impl AsyncWrite for CapturedOutput {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.append(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_past_the_cap_is_counted_and_marked() {
        let out = CapturedOutput::new("stderr");
        assert_eq!(out.drain(), None);
        out.append(b"panicked at src/lib.rs\n");
        assert_eq!(out.drain().as_deref(), Some("panicked at src/lib.rs\n"));
        for _ in 0..100 {
            out.append(&[b'x'; 10 << 10]);
        }
        let text = out.drain().unwrap();
        assert!(text.len() < OUTPUT_CAP + 200, "{} bytes kept", text.len());
        let dropped = 100 * (10 << 10) - OUTPUT_CAP;
        assert!(text.ends_with(&format!("[{dropped} more bytes of stderr dropped: over the 64 KiB kept per call]")));
        assert_eq!(out.drain(), None, "a drain empties the buffer");
    }
}
