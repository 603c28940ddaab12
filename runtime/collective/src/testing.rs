//! Helpers for tests that run several ranks as processes on loopback (feature `test-support`).
//!
//! A test binary starts copies of itself, each running one test by name (`--exact`) with environment variables
//! that say which rank it is; that test returns at once when the variables are absent, so an ordinary test run
//! passes through it. [`run_ranks`] waits for all of them with a deadline and kills the rest when it passes.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What one rank process did.
#[derive(Debug)]
pub struct Outcome {
    /// The rank's index in the list given to [`run_ranks`].
    pub index: usize,
    /// `None` when it was killed at the deadline.
    pub status: Option<ExitStatus>,
    /// Standard output and error, interleaved by stream (stdout first).
    pub output: String,
    /// When it ended, counted from the start of all ranks.
    pub elapsed: Duration,
}

impl Outcome {
    /// Whether the process exited with status 0.
    pub fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Starts one copy of the current test binary per entry of `ranks`, each running only the test `test_name`, with
/// the entry's environment variables (plus `OMP_NUM_THREADS=1`), and waits up to `deadline` for all of them.
pub fn run_ranks(test_name: &str, ranks: &[Vec<(String, String)>], deadline: Duration) -> Vec<Outcome> {
    let exe = std::env::current_exe().expect("the test binary's path");
    let start = Instant::now();
    let mut children: Vec<Option<Child>> = ranks
        .iter()
        .map(|env| {
            let mut command = Command::new(&exe);
            command
                .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
                .env("OMP_NUM_THREADS", "1")
                .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            Some(command.spawn().expect("start a rank process"))
        })
        .collect();
    let mut outcomes: Vec<Option<Outcome>> = (0..ranks.len()).map(|_| None).collect();
    while outcomes.iter().any(Option::is_none) {
        let overdue = start.elapsed() > deadline;
        for (index, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            let status = match child.try_wait().expect("poll a rank process") {
                Some(status) => Some(status),
                None if overdue => {
                    let _ = child.kill();
                    let _ = child.wait();
                    None
                }
                None => continue,
            };
            let mut output = String::new();
            if let Some(mut out) = child.stdout.take() {
                let _ = out.read_to_string(&mut output);
            }
            if let Some(mut err) = child.stderr.take() {
                let _ = err.read_to_string(&mut output);
            }
            outcomes[index] = Some(Outcome { index, status, output, elapsed: start.elapsed() });
            *slot = None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    outcomes.into_iter().flatten().collect()
}

/// Panics with every rank's output unless all of them succeeded.
pub fn assert_all_succeeded(outcomes: &[Outcome]) {
    if outcomes.iter().all(Outcome::succeeded) {
        return;
    }
    let report: Vec<String> = outcomes
        .iter()
        .map(|o| {
            format!("--- rank process {} ({:?}, {:.1} s):\n{}", o.index, o.status, o.elapsed.as_secs_f64(), o.output)
        })
        .collect();
    panic!("a rank process failed:\n{}", report.join("\n"));
}

/// An environment entry.
pub fn var(key: &str, value: impl ToString) -> (String, String) {
    (key.to_owned(), value.to_string())
}
