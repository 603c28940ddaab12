//! `trinity studio` end to end: a tiny-model run writes a run directory, the studio serves it, and headless
//! Chromium (Debian's, driven by playwright-core from npm; both installed by `cargo xtask setup`) opens the run on
//! its reward and eval accuracy curves, draws two curves picked by hand, pages through and filters the rollouts, shows the task that failed, validates a config with
//! two mistakes (each marked at its line) and completes values, lists the plugins, and watches a run that is still
//! writing (its step in the runs table and its chart grow without a reload) until it is deleted under the page,
//! taking a screenshot of each page (kept under the target directory; the paths are printed). It also plays the
//! attacks the studio must refuse: a page from another origin (a second server on another loopback port) that
//! tries to save over a config with a form and with `fetch`, which must leave the file unchanged while the
//! studio's own page can still save it, and a DNS-rebound name for the studio's address, which must be refused.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::support::{grpo_run_config, stderr, tiny_model_dir, trinity};

/// Kills the studio when the test ends, however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A page on another origin that tries every way a site the user visits could send the studio a save without
/// reading the answer: a `text/plain` form (whose body is JSON), `no-cors` fetches, and a CORS fetch of JSON (which
/// needs a preflight the studio never grants). `__STUDIO__` is the studio's URL, `__TARGET__` the file to overwrite.
/// The outcome of each fetch lands in `body[data-done]`.
const OTHER_SITE_PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>another site</title></head>
<body>
<iframe name="sink"></iframe>
<form id="form" method="POST" enctype="text/plain" target="sink" action="__STUDIO__api/config/save">
<input type="hidden" name='{"path": "__TARGET__", "text": "project: pwned by a form\n", "pad": "' value='"}'>
</form>
<script>
const body = JSON.stringify({ path: "__TARGET__", text: "project: pwned by fetch\n" });
const results = {};
async function attempt(name, path, init) {
  try { const r = await fetch("__STUDIO__" + path, init); results[name] = `${r.type} ${r.status}`; }
  catch (error) { results[name] = `failed: ${error.name}`; }
}
(async () => {
  const simple = { method: "POST", mode: "no-cors", headers: { "Content-Type": "text/plain" }, body };
  await attempt("no-cors text/plain save", "api/config/save", simple);
  await attempt("no-cors text/plain validate", "api/config/validate", simple);
  await attempt("no-cors json save", "api/config/save",
    { method: "POST", mode: "no-cors", headers: { "Content-Type": "application/json" }, body });
  await attempt("cors json save", "api/config/save",
    { method: "POST", headers: { "Content-Type": "application/json" }, body });
  await Promise.race([
    new Promise((resolve) => {
      document.querySelector("iframe").addEventListener("load", resolve, { once: true });
      document.getElementById("form").submit();
    }),
    new Promise((resolve) => setTimeout(resolve, 5000)),
  ]);
  results["text/plain form save"] = "submitted";
  document.body.dataset.done = JSON.stringify(results);
})();
</script>
</body></html>
"#;

/// Another origin: a one-page HTTP server on its own loopback port, stopped when dropped.
struct OtherSite {
    url: String,
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl OtherSite {
    /// Serves `page` for every request (the browser also asks for a favicon) on a free port of 127.0.0.1.
    fn serve(page: String) -> OtherSite {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        let address = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let mut reader = BufReader::new(&stream);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n",
                    page.len()
                );
                let _ = (&stream).write_all(head.as_bytes()).and_then(|()| (&stream).write_all(page.as_bytes()));
            }
        });
        OtherSite { url: format!("http://{address}/"), address, stop, thread: Some(thread) }
    }
}

impl Drop for OtherSite {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.address);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn deps_dir() -> PathBuf {
    std::env::var_os("TRINITY_DEPS_DIR").map_or_else(|| crate::support::workspace_root().join(".deps"), PathBuf::from)
}

/// Starts `trinity studio` over `root` on a free port and returns it with the address it printed.
fn start_studio(dir: &Path, root: &str) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_trinity"))
        .current_dir(dir)
        .args(["studio", "--root", root, "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("trinity studio starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let server = Server(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("the studio prints its address");
    let url = line
        .strip_prefix("studio: ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("unexpected first line from trinity studio: {line:?}"))
        .to_owned();
    (server, url)
}

#[test]
fn the_studio_shows_a_real_run_in_chromium() {
    let chromium = Path::new("/usr/bin/chromium");
    let playwright = deps_dir().join("npm/node_modules/playwright-core");
    assert!(
        chromium.exists() && playwright.is_dir(),
        "this test drives Debian's chromium with playwright-core from npm; run `cargo xtask setup` to install them \
         ({} and {})",
        chromium.display(),
        playwright.display()
    );
    let dir = tempfile::tempdir().unwrap();
    // Row 3 (the second task of step 2) has no prompt: its workflow fails, the run goes on, and the studio shows it.
    let rows: String = (0..6)
        .map(|i| match i {
            3 => format!("{{\"question\": \"ab{i}\", \"response\": \"{i}\"}}\n"),
            _ => format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n"),
        })
        .collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    // A held-out taskset evaluated once, after the last step (not before the first, which would add a step 0), so
    // that the run has an eval accuracy for the Curves page to open on.
    std::fs::write(dir.path().join("eval.jsonl"), "{\"prompt\": \"ab\", \"response\": \"1\"}\n").unwrap();
    let config = format!(
        "{}    eval_tasksets:\n      - name: held-out\n        path: eval.jsonl\n    \
         default_workflow_type: simple_workflow\n    default_reward_fn_type: math_reward\n\
         explorer:\n  eval_on_startup: false\nmonitor:\n  monitor_type: jsonl\n",
        grpo_run_config(&tiny_model_dir(), 40)
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));

    // What the page must show, from the files the run wrote.
    let job = dir.path().join("ckpt/p/n");
    let record = std::fs::read_to_string(job.join("status/trinity.json")).unwrap();
    assert!(record.contains("\"status\": \"finished\""), "{record}");
    let last = std::fs::read_to_string(job.join("monitor/metrics.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(last.lines().last().unwrap()).unwrap();
    assert_eq!(last["step"], 3, "{last}");
    assert!(last["eval/held-out/accuracy"].is_number(), "evaluated after the last step: {last}");
    let experiences = std::fs::read_to_string(job.join("experiences.jsonl")).unwrap();
    let rewards: Vec<f64> = experiences
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["reward"].as_f64().unwrap())
        .collect();
    let reward_min = rewards.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let above_min = rewards.iter().filter(|r| **r >= reward_min).count();
    let failed = std::fs::read_to_string(job.join("failed_tasks.jsonl")).unwrap();
    let failed: Vec<serde_json::Value> = failed.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!((failed[0]["step"].as_u64(), failed[0]["index"].as_u64()), (Some(2), Some(3)), "{failed:?}");
    assert_eq!(failed[0]["row"]["question"], "ab3");

    // The config another site tries to overwrite, and the studio's own page then saves.
    let target = dir.path().join("target.yaml");
    let original = "project: mine\n";
    std::fs::write(&target, original).unwrap();
    let (server, url) = start_studio(dir.path(), "ckpt");
    let other_site = OtherSite::serve(OTHER_SITE_PAGE.replace("__STUDIO__", &url).replace("__TARGET__", "target.yaml"));
    let saved = "project: saved by the studio's page\n";
    // A run still writing: its record names a live `trinity` process (the studio itself) and the browser drive
    // appends steps 4 and 5 to its metrics while the page is open, then deletes the run.
    let live = dir.path().join("ckpt/p/live");
    std::fs::create_dir_all(live.join("monitor")).unwrap();
    std::fs::create_dir_all(live.join("status")).unwrap();
    let metrics = std::fs::read_to_string(job.join("monitor/metrics.jsonl")).unwrap();
    std::fs::write(live.join("monitor/metrics.jsonl"), metrics).unwrap();
    std::fs::write(live.join("monitor/plan.json"), r#"{"total_steps": 5}"#).unwrap();
    let running = serde_json::json!({
        "role": "trinity", "status": "running", "pid": server.0.id(), "config": "config.yaml", "project": "p",
        "group": "", "name": "live", "mode": "both", "model_path": "", "started_at": 1,
    });
    std::fs::write(live.join("status/trinity.json"), running.to_string()).unwrap();
    let shots = Path::new(env!("CARGO_BIN_EXE_trinity")).parent().unwrap().join("studio-e2e");
    std::fs::create_dir_all(&shots).unwrap();
    let want = serde_json::json!({
        "url": url, "run": "p/n", "chromium": chromium, "userDataDir": dir.path().join("chromium-profile"),
        "shots": shots, "metrics": ["rollout/reward_mean", "train/pg_loss"], "points": 3,
        "preselected": { "metrics": ["rollout/reward_mean", "eval/held-out/accuracy"], "points": [3, 1] },
        "experiences": rewards.len(), "rewardMin": reward_min, "aboveMin": above_min,
        "failed": { "task": failed[0]["task"], "step": 2, "error": "no prompt field `prompt`" },
        "otherSite": {
            "url": other_site.url, "target": target, "path": "target.yaml", "original": original, "saved": saved,
            "rebound": url.replace("127.0.0.1", "rebind.test"),
        },
        "live": {
            "run": "p/live", "dir": live, "metrics": live.join("monitor/metrics.jsonl"), "metric": "rollout/reward_mean",
            "lines": ["{\"step\": 4, \"rollout/reward_mean\": 0.5}\n", "{\"step\": 5, \"rollout/reward_mean\": 0.75}\n"],
        },
    });
    let mut driver = Command::new("node")
        .arg(crate::support::fixture("studio/drive.cjs"))
        .arg(want.to_string())
        .env("TRINITY_PLAYWRIGHT_CORE", &playwright)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node runs (installed by `cargo xtask setup`)");
    // The whole drive takes a few seconds; a hung browser must not hang the test suite.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while driver.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = driver.kill();
            panic!("the browser drive did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let output = driver.wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    print!("{printed}");
    assert!(output.status.success(), "{}{}", printed, String::from_utf8_lossy(&output.stderr));
    for page in ["runs", "curves", "rollouts", "failed", "config", "plugins", "live"] {
        assert!(shots.join(format!("{page}.png")).is_file(), "screenshot of {page}");
    }
    drop(other_site);
    // The other site's attempts left it alone (the drive checked right after them); the studio's page saved it.
    assert_eq!(std::fs::read_to_string(&target).unwrap(), saved);
}
