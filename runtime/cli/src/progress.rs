//! The progress of `trinity run` on stdout: a live line (step of total, phase, ETA, reward, tokens/s) redrawn in
//! place when stdout is a terminal, one plain line per step otherwise (a file or pipe gets whole lines to read).
//!
//! The run reports its plan and phases through `trinity_monitor`'s observer ([`install`]). Log lines go to stderr,
//! which on a terminal is the same screen: the console log writer calls [`around_log`], which wipes the live line,
//! lets the log line print, and draws the live line again below it, so the two never share a row.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use trinity_monitor::{Metrics, Phase, Progress};

/// The live line currently on screen (`None` when nothing is drawn or stdout is not a terminal).
static LIVE_LINE: Mutex<Option<String>> = Mutex::new(None);

/// Starts showing the run's progress on stdout.
pub(crate) fn install() {
    let live = std::io::stdout().is_terminal();
    trinity_monitor::observe(Box::new(Display { live, ..Display::default() }));
}

/// Stops the display; a live line is ended with a newline so the shell prompt starts below it.
pub(crate) fn finish() {
    trinity_monitor::stop_observing();
    let mut line = lock();
    if line.take().is_some() {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out);
        let _ = out.flush();
    }
}

/// Runs `write_log` (which writes one log line to stderr) with the live line out of its way.
pub(crate) fn around_log<T>(write_log: impl FnOnce() -> T) -> T {
    let line = lock();
    let Some(text) = line.as_deref() else { return write_log() };
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "\r\x1b[2K");
    let _ = out.flush();
    let result = write_log();
    let _ = write!(out, "{text}");
    let _ = out.flush();
    result
}

fn lock() -> std::sync::MutexGuard<'static, Option<String>> {
    LIVE_LINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Debug, Default)]
struct Display {
    live: bool,
    total: Option<u64>,
    /// Steps done before this process started (a resumed run): not part of this process's pace.
    resumed_at: u64,
    started: Option<Instant>,
    step: u64,
    phase: Option<Phase>,
    /// The last step recorded and when.
    recorded: u64,
    reward: Option<f64>,
    tokens_per_s: Option<f64>,
}

impl Display {
    /// The estimated time left: this process's mean step time times the steps left.
    fn eta(&self, now: Instant) -> Option<Duration> {
        let done_here = self.recorded.checked_sub(self.resumed_at).filter(|n| *n > 0)?;
        let left = self.total?.checked_sub(self.recorded)?;
        let per_step = now.duration_since(self.started?).as_secs_f64() / done_here as f64;
        Some(Duration::from_secs_f64(per_step * left as f64))
    }

    fn text(&self, now: Instant) -> String {
        let mut text = match self.total {
            Some(total) => {
                let done = self.recorded.min(total);
                let width = 20;
                let filled = (done as usize * width).checked_div(total as usize).unwrap_or(0).min(width);
                format!(
                    "step {}/{total} [{}{}] {:>3}%",
                    self.step.max(self.recorded),
                    "#".repeat(filled),
                    ".".repeat(width - filled),
                    (done * 100).checked_div(total).unwrap_or(0)
                )
            }
            None => format!("step {}", self.step.max(self.recorded)),
        };
        if let Some(phase) = self.phase.filter(|_| self.live) {
            let _ = write!(text, " · {}", phase.label());
        }
        if let Some(eta) = self.eta(now) {
            let _ = write!(text, " · eta {}", clock(eta));
        }
        if let Some(reward) = self.reward {
            let _ = write!(text, " · reward {reward:.3}");
        }
        if let Some(rate) = self.tokens_per_s {
            let _ = write!(text, " · {rate:.0} tokens/s");
        }
        text
    }

    fn draw(&self) {
        let text = self.text(Instant::now());
        let mut out = std::io::stdout().lock();
        if self.live {
            let _ = write!(out, "\r\x1b[2K{text}");
            *lock() = Some(text);
        } else {
            let _ = writeln!(out, "progress: {text}");
        }
        let _ = out.flush();
    }
}

impl Progress for Display {
    fn planned(&mut self, total_steps: Option<u64>, done: u64) {
        self.total = total_steps;
        self.resumed_at = done;
        self.recorded = done;
        self.started = Some(Instant::now());
        if self.live {
            self.draw();
        }
    }

    fn phase(&mut self, step: u64, phase: Phase) {
        self.step = step;
        self.phase = Some(phase);
        // Plain output gets one line per step (at its end); only the live line follows phases.
        if self.live {
            self.draw();
        }
    }

    fn recorded(&mut self, step: u64, metrics: &Metrics) {
        // Step 0 is the evaluation before training: no step of the plan.
        if step == 0 {
            return;
        }
        self.recorded = self.recorded.max(step);
        // The step is over: its last phase no longer describes what the run is doing.
        self.phase = None;
        self.reward = metrics.get("rollout/reward_mean").copied().filter(|v| v.is_finite()).or(self.reward);
        self.tokens_per_s =
            metrics.get("perf/rollout_tokens_per_s").copied().filter(|v| v.is_finite()).or(self.tokens_per_s);
        self.draw();
    }
}

/// `1h02m`, `4m05s`, `12s`.
fn clock(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        _ => format!("{}h{:02}m", seconds / 3600, seconds % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_shows_step_phase_eta_reward_and_rate() {
        let start = Instant::now();
        let mut display = Display { live: true, ..Display::default() };
        display.total = Some(40);
        display.resumed_at = 10;
        display.recorded = 14;
        display.started = Some(start);
        display.step = 15;
        display.phase = Some(Phase::Train);
        display.reward = Some(0.5);
        display.tokens_per_s = Some(1234.4);
        // 4 steps in 20 s: 5 s a step, 26 steps left.
        let text = display.text(start + Duration::from_secs(20));
        assert_eq!(text, "step 15/40 [#######.............]  35% · train · eta 2m10s · reward 0.500 · 1234 tokens/s");
        display.live = false;
        display.total = None;
        let text = display.text(start + Duration::from_secs(20));
        assert_eq!(text, "step 15 · reward 0.500 · 1234 tokens/s");
    }

    #[test]
    fn clock_reads_like_a_person_writes() {
        assert_eq!(clock(Duration::from_secs(9)), "9s");
        assert_eq!(clock(Duration::from_secs(245)), "4m05s");
        assert_eq!(clock(Duration::from_secs(3720)), "1h02m");
    }
}
