//! Worker processes: spawning, the JSON-lines pipes, the idle pool, and the import check.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex, Weak};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use trinity_explorer::RolloutModel;

use crate::calls::Sessions;
use crate::error::PyWorkflowError;

/// The worker's Python side, passed to the interpreter with `-c` so that nothing is written to disk: the model
/// wrapper, then the protocol loop (which starts at the end of `worker.py`).
const WORKER_SCRIPT: &str = concat!(include_str!("../python/model.py"), include_str!("../python/worker.py"));

/// One worker process and its pipes.
pub(crate) struct Worker {
    /// Killed when dropped (`kill_on_drop`): a worker leaves the pool only by being reused or killed.
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    pid: u32,
    /// The rollout model it served; a worker is reused only for the same model (one run), because its pipes
    /// belong to that run's runtime.
    model: Weak<RolloutModel>,
    /// The OpenAI sessions of its model wrappers; the worker's own lives as long as it does.
    sessions: Arc<Sessions>,
}

impl Worker {
    /// Starts a worker whose stderr lines go to the log under `workflow`.
    pub(crate) fn spawn(interpreter: &Path, workflow: &str, model: &Arc<RolloutModel>) -> std::io::Result<Worker> {
        let mut child = Command::new(interpreter)
            .args(["-u", "-c", WORKER_SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().unwrap_or_default();
        let missing = |what| std::io::Error::other(format!("the worker's {what} pipe was not opened"));
        let stdin = child.stdin.take().ok_or_else(|| missing("stdin"))?;
        let stdout = BufReader::new(child.stdout.take().ok_or_else(|| missing("stdout"))?).lines();
        if let Some(stderr) = child.stderr.take() {
            let workflow = workflow.to_owned();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(target: "python_workflow", "python worker {pid} ({workflow}): {line}");
                }
            });
        }
        tracing::debug!("started python worker {pid} with {}", interpreter.display());
        Ok(Worker { child, stdin, stdout, pid, model: Arc::downgrade(model), sessions: Arc::default() })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    pub(crate) fn sessions(&self) -> Arc<Sessions> {
        Arc::clone(&self.sessions)
    }

    pub(crate) async fn send(&mut self, message: &Value) -> std::io::Result<()> {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await?;
        self.stdin.flush().await
    }

    /// The next message; `Ok(None)` when the worker closed its stdout (it exited).
    pub(crate) async fn receive(&mut self) -> std::io::Result<Option<Value>> {
        match self.stdout.next_line().await? {
            None => Ok(None),
            Some(line) => serde_json::from_str(&line).map(Some).map_err(|error| {
                std::io::Error::other(format!("the worker wrote a line that is not JSON ({error}): {line:?}"))
            }),
        }
    }

    /// How the worker ended, once it closed its pipes.
    pub(crate) async fn exit_status(&mut self) -> String {
        match tokio::time::timeout(std::time::Duration::from_secs(5), self.child.wait()).await {
            Ok(Ok(status)) => status.to_string(),
            Ok(Err(error)) => format!("unknown ({error})"),
            Err(_) => "still running after closing its output".to_owned(),
        }
    }
}

/// Idle workers, most recently used last.
static IDLE: Mutex<Vec<Worker>> = Mutex::new(Vec::new());

/// An idle worker of this run, else a new one.
pub(crate) fn checkout(interpreter: &Path, workflow: &str, model: &Arc<RolloutModel>) -> std::io::Result<Worker> {
    let mut idle = IDLE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    // Workers of an earlier run (its model is gone or another) are dropped, which kills them.
    idle.retain(|worker| worker.model.upgrade().is_some_and(|m| Arc::ptr_eq(&m, model)));
    match idle.pop() {
        Some(worker) => Ok(worker),
        None => {
            drop(idle);
            Worker::spawn(interpreter, workflow, model)
        }
    }
}

/// Puts a worker that ended its task cleanly back for the next task.
pub(crate) fn check_in(worker: Worker) {
    IDLE.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(worker);
}

/// Runs the worker's import check of `workflow` (see [`crate::check`]).
pub(crate) fn check(interpreter: &Path, workflow: &str) -> Result<(), PyWorkflowError> {
    let output = std::process::Command::new(interpreter)
        .args(["-u", "-c", WORKER_SCRIPT, "--check", workflow])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| PyWorkflowError::Interpreter {
            workflow: workflow.to_owned(),
            interpreter: interpreter.to_owned(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    for line in stderr.lines() {
        tracing::info!(target: "python_workflow", "python check ({workflow}): {line}");
    }
    let answer: Value = stdout.lines().next().and_then(|line| serde_json::from_str(line).ok()).ok_or_else(|| {
        PyWorkflowError::Check {
            workflow: workflow.to_owned(),
            interpreter: interpreter.to_owned(),
            answer: format!("{}{}", stdout.trim(), stderr.trim()),
        }
    })?;
    if answer["ok"].as_bool() == Some(true) {
        return Ok(());
    }
    let import = answer["import"].as_str().unwrap_or(workflow).to_owned();
    Err(PyWorkflowError::Import {
        workflow: workflow.to_owned(),
        interpreter: interpreter.to_owned(),
        pip: pip_line(&import),
        import,
        detail: answer["error"].as_str().unwrap_or_default().to_owned(),
    })
}

/// The `pip install` line for a missing module: Trinity-RFT's package for `trinity`, else the module's top
/// level name (the distribution name of most environment packages: alfworld, agentscope, gymnasium).
fn pip_line(import: &str) -> String {
    let top = import.split('.').next().unwrap_or(import);
    match top {
        "trinity" => "pip install trinity-rft==0.6.0".to_owned(),
        other => format!("pip install {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pip_line_names_trinity_rft_for_the_trinity_package() {
        assert_eq!(pip_line("trinity.common"), "pip install trinity-rft==0.6.0");
        assert_eq!(pip_line("gymnasium"), "pip install gymnasium");
    }
}
