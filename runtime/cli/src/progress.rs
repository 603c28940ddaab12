//! Progress displays: a live line redrawn in place when its stream is a terminal, plain lines otherwise (a file or
//! pipe gets whole lines to read).
//!
//! `trinity run` shows its progress on stdout (step of total, phase, ETA, reward, tokens/s), reported through
//! `trinity_monitor`'s observer ([`install`]). `generate`, `score` and `convert` show theirs on stderr ([`Count`],
//! [`Phases`]): their stdout is their result (JSONL, or the directory written), which a progress line must never
//! mix into. Log lines go to stderr, which on a terminal is the same screen: the console log writer calls
//! [`around_log`], which wipes the live line, lets the log line print, and draws the live line again below it, so
//! the two never share a row.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use trinity_monitor::{Metrics, Phase, Progress};

/// Where a display draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Stream {
    #[default]
    Stdout,
    Stderr,
}

impl Stream {
    fn is_terminal(self) -> bool {
        match self {
            Stream::Stdout => std::io::stdout().is_terminal(),
            Stream::Stderr => std::io::stderr().is_terminal(),
        }
    }

    fn write(self, text: std::fmt::Arguments) {
        match self {
            Stream::Stdout => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_fmt(text);
                let _ = out.flush();
            }
            Stream::Stderr => {
                let mut out = std::io::stderr().lock();
                let _ = out.write_fmt(text);
                let _ = out.flush();
            }
        }
    }
}

/// The live line currently on screen and its stream (`None` when nothing is drawn in place).
static LIVE_LINE: Mutex<Option<(Stream, String)>> = Mutex::new(None);

/// Starts showing the run's progress on stdout.
pub(crate) fn install() {
    let line = Line::on(Stream::Stdout);
    trinity_monitor::observe(Box::new(Display { line, ..Display::default() }));
}

/// Stops the run's display; a live line is ended with a newline so the shell prompt starts below it.
pub(crate) fn finish() {
    trinity_monitor::stop_observing();
    end_live_line();
}

fn end_live_line() {
    if let Some((stream, _)) = lock().take() {
        stream.write(format_args!("\n"));
    }
}

/// Runs `write_log` (which writes one log line to stderr) with the live line out of its way.
pub(crate) fn around_log<T>(write_log: impl FnOnce() -> T) -> T {
    let line = lock();
    let Some((stream, text)) = line.as_ref() else { return write_log() };
    stream.write(format_args!("\r\x1b[2K"));
    let result = write_log();
    stream.write(format_args!("{text}"));
    result
}

fn lock() -> std::sync::MutexGuard<'static, Option<(Stream, String)>> {
    LIVE_LINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One progress line: drawn in place on a terminal, printed as `progress: ...` otherwise.
#[derive(Debug, Default, Clone, Copy)]
struct Line {
    stream: Stream,
    live: bool,
}

impl Line {
    fn on(stream: Stream) -> Line {
        Line { stream, live: stream.is_terminal() }
    }

    fn show(&self, text: String) {
        if self.live {
            self.stream.write(format_args!("\r\x1b[2K{text}"));
            *lock() = Some((self.stream, text));
        } else {
            self.stream.write(format_args!("progress: {text}\n"));
        }
    }
}

/// `[#####...............]  25%` for `done` of `total`.
fn bar(done: u64, total: u64) -> String {
    let done = done.min(total);
    let width = 20;
    let filled = (done as usize * width).checked_div(total as usize).unwrap_or(0).min(width);
    format!(
        "[{}{}] {:>3}%",
        "#".repeat(filled),
        ".".repeat(width - filled),
        (done * 100).checked_div(total).unwrap_or(0)
    )
}

/// The time left at the pace so far: `elapsed` for `done` units, `left` to go.
fn eta(elapsed: Duration, done: u64, left: u64) -> Option<Duration> {
    let per_unit = elapsed.as_secs_f64() / (done as f64);
    (done > 0).then(|| Duration::from_secs_f64(per_unit * left as f64))
}

#[derive(Debug, Default)]
struct Display {
    line: Line,
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
        let done_here = self.recorded.checked_sub(self.resumed_at)?;
        let left = self.total?.checked_sub(self.recorded)?;
        eta(now.duration_since(self.started?), done_here, left)
    }

    fn text(&self, now: Instant) -> String {
        let mut text = match self.total {
            Some(total) => format!("step {}/{total} {}", self.step.max(self.recorded), bar(self.recorded, total)),
            None => format!("step {}", self.step.max(self.recorded)),
        };
        if let Some(phase) = self.phase.filter(|_| self.line.live) {
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
        self.line.show(self.text(Instant::now()));
    }
}

impl Progress for Display {
    fn planned(&mut self, total_steps: Option<u64>, done: u64) {
        self.total = total_steps;
        self.resumed_at = done;
        self.recorded = done;
        self.started = Some(Instant::now());
        if self.line.live {
            self.draw();
        }
    }

    fn phase(&mut self, step: u64, phase: Phase) {
        self.step = step;
        self.phase = Some(phase);
        // Plain output gets one line per step (at its end); only the live line follows phases.
        if self.line.live {
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

/// The progress of a command that works through a known number of items (`trinity generate`'s prompts, `trinity
/// score`'s rows), on stderr: `generate: 12/40 prompts [######..............]  30% · eta 1m05s · 850 tokens/s`.
/// Plain output gets a line at every tenth of the work, so a log of a long job shows its pace without a line per
/// item.
#[derive(Debug)]
pub(crate) struct Count {
    label: &'static str,
    unit: &'static str,
    total: u64,
    done: u64,
    started: Instant,
    line: Line,
    /// The tenth of the work whose line plain output printed last.
    printed_tenth: u64,
}

impl Count {
    pub(crate) fn start(label: &'static str, unit: &'static str, total: usize) -> Count {
        let count = Count {
            label,
            unit,
            total: total as u64,
            done: 0,
            started: Instant::now(),
            line: Line::on(Stream::Stderr),
            printed_tenth: 0,
        };
        if count.line.live {
            count.line.show(count.text(Instant::now(), None));
        }
        count
    }

    /// `items` more are done; `rate` is a throughput to show (`tokens/s`, say).
    pub(crate) fn advance(&mut self, items: usize, rate: Option<(f64, &str)>) {
        self.done = (self.done + items as u64).min(self.total);
        let tenth = (self.done * 10).checked_div(self.total).unwrap_or(10);
        if self.line.live || tenth > self.printed_tenth {
            self.printed_tenth = tenth;
            self.line.show(self.text(Instant::now(), rate));
        }
    }

    fn text(&self, now: Instant, rate: Option<(f64, &str)>) -> String {
        let mut text =
            format!("{}: {}/{} {} {}", self.label, self.done, self.total, self.unit, bar(self.done, self.total));
        let left = self.total - self.done;
        if let Some(eta) = eta(now.duration_since(self.started), self.done, left).filter(|_| left > 0) {
            let _ = write!(text, " · eta {}", clock(eta));
        }
        if let Some((rate, unit)) = rate.filter(|(rate, _)| rate.is_finite()) {
            let _ = write!(text, " · {rate:.0} {unit}");
        }
        text
    }

    /// Ends the display (a live line gets its newline).
    pub(crate) fn finish(self) {
        end_live_line();
    }
}

/// The progress of a command made of a few long steps (`trinity convert`: read the GGUF file, write the
/// directory), on stderr: the step under way on a terminal, a line per finished step with its time otherwise.
#[derive(Debug)]
pub(crate) struct Phases {
    label: &'static str,
    line: Line,
    current: Option<(String, Instant)>,
}

impl Phases {
    pub(crate) fn start(label: &'static str) -> Phases {
        Phases { label, line: Line::on(Stream::Stderr), current: None }
    }

    /// Ends the step under way, if any, and starts `what`.
    pub(crate) fn begin(&mut self, what: impl Into<String>) {
        self.end_current();
        let what = what.into();
        if self.line.live {
            self.line.show(format!("{}: {what}…", self.label));
        }
        self.current = Some((what, Instant::now()));
    }

    fn end_current(&mut self) {
        if let Some((what, started)) = self.current.take() {
            let seconds = started.elapsed().as_secs_f64();
            self.line.show(format!("{}: {what} ({seconds:.1} s)", self.label));
        }
    }

    /// Ends the last step and the display.
    pub(crate) fn finish(mut self) {
        self.end_current();
        end_live_line();
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
        let mut display = Display { line: Line { stream: Stream::Stdout, live: true }, ..Display::default() };
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
        display.line.live = false;
        display.total = None;
        let text = display.text(start + Duration::from_secs(20));
        assert_eq!(text, "step 15 · reward 0.500 · 1234 tokens/s");
    }

    #[test]
    fn a_count_shows_items_of_total_eta_and_rate() {
        let mut count = Count::start("generate", "prompts", 40);
        count.done = 12;
        let text = count.text(count.started + Duration::from_secs(24), Some((850.4, "tokens/s")));
        assert_eq!(text, "generate: 12/40 prompts [######..............]  30% · eta 56s · 850 tokens/s");
        count.done = 40;
        let text = count.text(count.started + Duration::from_secs(80), None);
        assert_eq!(text, "generate: 40/40 prompts [####################] 100%");
    }

    #[test]
    fn clock_reads_like_a_person_writes() {
        assert_eq!(clock(Duration::from_secs(9)), "9s");
        assert_eq!(clock(Duration::from_secs(245)), "4m05s");
        assert_eq!(clock(Duration::from_secs(3720)), "1h02m");
    }
}
