//! `GET /metrics`: Prometheus text exposition of the server's counters, the engine's stats and the recorder's
//! state. Counters are atomics updated by the handlers; nothing here is on the decode path.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use trinity_engine::{EngineInfo, EngineStats};

use crate::recorder::RecorderStats;

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 14] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// A cumulative histogram of durations.
#[derive(Debug, Default)]
struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    /// Sum in microseconds (integers add atomically).
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            if seconds <= *bound {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(duration.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {}", count.load(Ordering::Relaxed));
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// The server's own counters.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// Finished requests by (endpoint, HTTP status).
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    cancelled: AtomicU64,
    in_flight: AtomicU64,
    latency: Histogram,
    first_token: Histogram,
}

/// What `/metrics` shows besides the server's counters.
pub(crate) struct Snapshot<'a> {
    pub(crate) engine: EngineStats,
    pub(crate) info: &'a EngineInfo,
    /// Mode `serve`'s pending store (the workflows' view has none).
    pub(crate) recorder: Option<RecorderStats>,
    pub(crate) model_version: u64,
}

impl Metrics {
    pub(crate) fn request_done(&self, endpoint: &'static str, status: u16, latency: Duration) {
        *self.requests.lock().unwrap_or_else(|e| e.into_inner()).entry((endpoint, status)).or_default() += 1;
        self.latency.observe(latency);
    }

    pub(crate) fn tokens(&self, prompt: usize, completion: usize) {
        self.prompt_tokens.fetch_add(prompt as u64, Ordering::Relaxed);
        self.completion_tokens.fetch_add(completion as u64, Ordering::Relaxed);
    }

    pub(crate) fn first_token(&self, after: Duration) {
        self.first_token.observe(after);
    }

    pub(crate) fn cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn enter(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// The Prometheus text.
    pub(crate) fn render(&self, snapshot: &Snapshot<'_>) -> String {
        let mut out = String::with_capacity(4096);
        let counter = |out: &mut String, name: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        };
        let gauge = |out: &mut String, name: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        };
        let _ = writeln!(
            out,
            "# HELP trinity_serve_requests_total Finished HTTP requests by endpoint and status.\n# TYPE trinity_serve_requests_total counter"
        );
        for ((endpoint, status), count) in self.requests.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ =
                writeln!(out, "trinity_serve_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {count}");
        }
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        counter(
            &mut out,
            "trinity_serve_prompt_tokens_total",
            "Prompt tokens of served requests.",
            load(&self.prompt_tokens),
        );
        counter(
            &mut out,
            "trinity_serve_completion_tokens_total",
            "Tokens generated for served requests.",
            load(&self.completion_tokens),
        );
        counter(
            &mut out,
            "trinity_serve_cancelled_requests_total",
            "Generation requests whose client went away before they finished.",
            load(&self.cancelled),
        );
        gauge(&mut out, "trinity_serve_requests_in_flight", "Generation requests being served.", load(&self.in_flight));
        self.latency.render(&mut out, "trinity_serve_request_duration_seconds", "Time from request to last byte.");
        self.first_token.render(
            &mut out,
            "trinity_serve_time_to_first_token_seconds",
            "Time from request to first token.",
        );

        let e = &snapshot.engine;
        counter(&mut out, "trinity_engine_requests_total", "Requests the engine answered.", e.requests as f64);
        counter(&mut out, "trinity_engine_prefill_tokens_total", "Prompt tokens prefilled.", e.prefill_tokens as f64);
        counter(
            &mut out,
            "trinity_engine_prefix_cache_tokens_total",
            "Prompt tokens copied from the prefix cache (an earlier prompt or conversation) instead of computed.",
            e.reused_prompt_tokens as f64,
        );
        counter(
            &mut out,
            "trinity_engine_prefill_seconds_total",
            "Time in prefill passes.",
            e.prefill_time.as_secs_f64(),
        );
        counter(&mut out, "trinity_engine_decode_steps_total", "Decode steps run.", e.decode_steps as f64);
        counter(&mut out, "trinity_engine_decode_seconds_total", "Time in decode steps.", e.decode_time.as_secs_f64());
        counter(&mut out, "trinity_engine_generated_tokens_total", "Tokens generated.", e.generated_tokens as f64);
        counter(
            &mut out,
            "trinity_engine_cancelled_requests_total",
            "Requests the engine dropped because their caller went away.",
            e.cancelled_requests as f64,
        );
        gauge(
            &mut out,
            "trinity_engine_running_sequences",
            "Sequences in the decode batch.",
            e.running_sequences as f64,
        );
        gauge(
            &mut out,
            "trinity_engine_waiting_requests",
            "Requests waiting for KV-cache slots.",
            e.waiting_requests as f64,
        );
        gauge(
            &mut out,
            "trinity_engine_kv_cache_slots",
            "KV-cache slots (most sequences at once).",
            snapshot.info.num_slots as f64,
        );
        gauge(
            &mut out,
            "trinity_engine_decode_tokens_per_second",
            "Decode throughput so far.",
            e.decode_tokens_per_second(),
        );
        gauge(
            &mut out,
            "trinity_model_version",
            "Weight updates the served weights include.",
            snapshot.model_version as f64,
        );

        let Some(r) = &snapshot.recorder else { return out };
        gauge(
            &mut out,
            "trinity_serve_pending_experiences",
            "Recorded experiences not yet committed.",
            r.pending as f64,
        );
        gauge(
            &mut out,
            "trinity_serve_rewarded_experiences",
            "Pending experiences that have a reward.",
            r.rewarded as f64,
        );
        gauge(&mut out, "trinity_serve_pending_capacity", "Most experiences the recorder holds.", r.capacity as f64);
        counter(
            &mut out,
            "trinity_serve_committed_experiences_total",
            "Experiences handed to the buffer.",
            r.committed as f64,
        );
        counter(&mut out, "trinity_serve_commits_total", "Successful commits.", r.commits as f64);
        out
    }
}
