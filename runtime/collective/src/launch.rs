//! `trinity launch`: torchrun's static launch for users without torchrun. Starts `nproc_per_node` copies of a
//! command on this node, each with torchrun's environment ([`crate::env`]), and supervises them:
//!
//! - Global ranks are `node_rank · nproc_per_node + local_rank`; `WORLD_SIZE = nnodes · nproc_per_node`. Every
//!   node runs the same launch with its own `--node-rank` and the same master address and port.
//! - Children run in a process group of their own, so a terminal's Ctrl-C reaches them once, forwarded by the
//!   launcher (SIGINT, SIGTERM and SIGHUP are forwarded); each child also gets SIGKILL when the launcher dies.
//! - When one child fails (non-zero status or a signal), the others get SIGTERM and, after a grace period,
//!   SIGKILL; the launch then fails naming the first rank that failed. A forwarded signal gets the same grace.
//! - `OMP_NUM_THREADS`, when the caller did not set it and more than one process runs here, becomes this machine's
//!   CPUs divided among them (torchrun sets 1), so the processes do not oversubscribe the cores.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use crate::env::DistEnv;
use crate::error::{CollectiveError, Result};

/// torchrun's default master port.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// What to launch and where this node sits in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOptions {
    /// Processes on this node (`--nproc-per-node`).
    pub nproc_per_node: usize,
    /// Nodes in the job (`--nnodes`).
    pub nnodes: usize,
    /// This node's index (`--node-rank`).
    pub node_rank: usize,
    /// Where global rank 0 hosts the store (`--master-addr`).
    pub master_addr: String,
    /// Its port (`--master-port`); 0 on a single node picks a free port.
    pub master_port: u16,
    /// How long children get between SIGTERM and SIGKILL.
    pub grace: Duration,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions {
            nproc_per_node: 1,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: DEFAULT_MASTER_PORT,
            grace: Duration::from_secs(30),
        }
    }
}

/// The signal the launcher received and has not forwarded yet (0: none).
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn record_signal(signal: libc::c_int) {
    PENDING_SIGNAL.store(signal, Ordering::SeqCst);
}

const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Installs [`record_signal`] for the forwarded signals and restores the previous handlers when dropped.
struct SignalForwarding {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl SignalForwarding {
    fn install() -> Result<Self> {
        PENDING_SIGNAL.store(0, Ordering::SeqCst);
        let mut previous = Vec::new();
        for signal in FORWARDED {
            // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler only stores into an
            // atomic, which is async-signal-safe; `old` receives the previous disposition.
            let result = unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = record_signal as *const () as libc::sighandler_t;
                libc::sigemptyset(&mut action.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                let rc = libc::sigaction(signal, &action, &mut old);
                (rc, old)
            };
            if result.0 != 0 {
                return Err(CollectiveError::Io {
                    what: format!("install a handler for signal {signal}"),
                    source: std::io::Error::last_os_error(),
                });
            }
            previous.push((signal, result.1));
        }
        Ok(SignalForwarding { previous })
    }
}

impl Drop for SignalForwarding {
    fn drop(&mut self) {
        for (signal, old) in &self.previous {
            // SAFETY: restores a disposition sigaction returned earlier for the same signal.
            unsafe { libc::sigaction(*signal, old, std::ptr::null_mut()) };
        }
    }
}

fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|source| CollectiveError::Io { what: "find a free port".into(), source })?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|source| CollectiveError::Io { what: "find a free port".into(), source })
}

/// The environment of each local process, in local-rank order.
pub fn process_envs(options: &LaunchOptions) -> Result<Vec<DistEnv>> {
    let (n, nodes) = (options.nproc_per_node, options.nnodes);
    if n == 0 || nodes == 0 {
        return Err(CollectiveError::Launch("--nproc-per-node and --nnodes must be at least 1".into()));
    }
    if options.node_rank >= nodes {
        return Err(CollectiveError::Launch(format!(
            "--node-rank {} is not below --nnodes {nodes}",
            options.node_rank
        )));
    }
    if options.master_port == 0 && nodes > 1 {
        return Err(CollectiveError::Launch("a job of several nodes needs an explicit --master-port".into()));
    }
    let port = if options.master_port == 0 { free_port()? } else { options.master_port };
    Ok((0..n)
        .map(|local_rank| DistEnv {
            world_size: n * nodes,
            rank: options.node_rank * n + local_rank,
            local_rank,
            local_world_size: Some(n),
            node_rank: Some(options.node_rank),
            master_addr: options.master_addr.clone(),
            master_port: port,
        })
        .collect())
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => format!("ended with {status}"),
    }
}

fn signal_all(children: &[(DistEnv, Child)], done: &[bool], signal: libc::c_int) {
    for ((_, child), &finished) in children.iter().zip(done) {
        if !finished {
            // SAFETY: kill(2) on the pid of a child we have not reaped yet (so the pid is still ours).
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        }
    }
}

/// Runs `program args…` as this node's processes of the job and waits for them; fails when any fails.
pub fn launch(options: &LaunchOptions, program: &OsString, args: &[OsString]) -> Result<()> {
    let envs = process_envs(options)?;
    let threads = (envs.len() > 1 && std::env::var_os("OMP_NUM_THREADS").is_none()).then(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cpus / envs.len()).max(1)
    });
    let forwarding = SignalForwarding::install()?;
    // SAFETY: getpid is always safe to call.
    let launcher = unsafe { libc::getpid() };
    let mut children = Vec::with_capacity(envs.len());
    for env in envs {
        let mut command = Command::new(program);
        command.args(args).envs(env.to_vars());
        if let Some(t) = threads {
            command.env("OMP_NUM_THREADS", t.to_string());
        }
        command.process_group(0);
        // SAFETY: runs in the forked child before exec and calls only async-signal-safe functions (prctl,
        // getppid, _exit); it allocates nothing.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The launcher may have died between fork and prctl.
                if libc::getppid() != launcher {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let child = match command.spawn() {
            Ok(child) => child,
            Err(source) => {
                let done = vec![false; children.len()];
                signal_all(&children, &done, libc::SIGKILL);
                for (_, c) in &mut children {
                    let _ = Child::wait(c);
                }
                return Err(CollectiveError::Io { what: format!("start {program:?} as rank {}", env.rank), source });
            }
        };
        children.push((env, child));
    }
    let outcome = supervise(&mut children, options.grace);
    drop(forwarding);
    outcome
}

/// Waits for every child; on the first failure or a received signal, stops the rest (SIGTERM or the signal, then
/// SIGKILL after `grace`).
fn supervise(children: &mut [(DistEnv, Child)], grace: Duration) -> Result<()> {
    let mut done = vec![false; children.len()];
    let mut first_failure: Option<String> = None;
    let mut interrupted: Option<i32> = None;
    let mut stopping_since: Option<Instant> = None;
    let mut killed = false;
    while done.iter().any(|d| !d) {
        let signal = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
        if signal != 0 {
            signal_all(children, &done, signal);
            interrupted.get_or_insert(signal);
            stopping_since.get_or_insert_with(Instant::now);
        }
        for (i, (env, child)) in children.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            let status = child
                .try_wait()
                .map_err(|source| CollectiveError::Io { what: format!("wait for rank {}", env.rank), source })?;
            let Some(status) = status else { continue };
            done[i] = true;
            if !status.success() && first_failure.is_none() && stopping_since.is_none() {
                first_failure = Some(format!("rank {} (pid {}) {}", env.rank, child.id(), describe(status)));
            }
        }
        if first_failure.is_some() && stopping_since.is_none() {
            signal_all(children, &done, libc::SIGTERM);
            stopping_since = Some(Instant::now());
        }
        if let Some(since) = stopping_since
            && !killed
            && since.elapsed() >= grace
        {
            signal_all(children, &done, libc::SIGKILL);
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(failure) = first_failure {
        return Err(CollectiveError::Launch(format!("{failure}; the other processes were stopped")));
    }
    if let Some(signal) = interrupted {
        return Err(CollectiveError::Launch(format!("interrupted by signal {signal}, forwarded to every process")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> (OsString, Vec<OsString>) {
        ("sh".into(), vec!["-c".into(), script.into()])
    }

    /// Launches share the process-wide signal handlers: one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn quick() -> LaunchOptions {
        LaunchOptions { nproc_per_node: 3, master_port: 0, grace: Duration::from_secs(2), ..Default::default() }
    }

    #[test]
    fn ranks_of_a_node_follow_torchrun() {
        let options = LaunchOptions { nproc_per_node: 2, nnodes: 3, node_rank: 1, ..Default::default() };
        let envs = process_envs(&options).unwrap();
        assert_eq!(
            envs.iter().map(|e| (e.rank, e.local_rank, e.world_size)).collect::<Vec<_>>(),
            [(2, 0, 6), (3, 1, 6)]
        );
        assert!(process_envs(&LaunchOptions { node_rank: 3, nnodes: 3, ..options.clone() }).is_err());
        assert!(process_envs(&LaunchOptions { master_port: 0, ..options }).is_err());
    }

    #[test]
    fn every_child_sees_its_environment() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let script = format!(
            "echo \"$WORLD_SIZE $RANK $LOCAL_RANK $MASTER_ADDR $LOCAL_WORLD_SIZE\" > {}/$RANK",
            dir.path().display()
        );
        let (program, args) = sh(&script);
        launch(&quick(), &program, &args).unwrap();
        for rank in 0..3 {
            let line = std::fs::read_to_string(dir.path().join(rank.to_string())).unwrap();
            assert_eq!(line.trim(), format!("3 {rank} {rank} 127.0.0.1 3"));
        }
    }

    #[test]
    fn a_failing_child_stops_the_others_and_fails_the_launch() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let start = Instant::now();
        let (program, args) = sh("if [ \"$RANK\" = 1 ]; then exit 7; fi; sleep 60");
        let err = launch(&quick(), &program, &args).unwrap_err().to_string();
        assert!(err.contains("rank 1") && err.contains("status 7"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(20), "{:?}", start.elapsed());
    }

    #[test]
    fn a_child_that_ignores_sigterm_is_killed_after_the_grace_period() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        // Rank 0 fails only once the others ignore SIGTERM: a SIGTERM that came before their `trap` would end
        // them at once (seen on a fast machine, where rank 0 exited before the others' shells had started).
        let script = format!(
            "trap '' TERM; touch {d}/ready.$RANK; if [ \"$RANK\" = 0 ]; then \
             while [ ! -e {d}/ready.1 ] || [ ! -e {d}/ready.2 ]; do sleep 0.01; done; exit 1; fi; sleep 60"
        );
        let start = Instant::now();
        let (program, args) = sh(&script);
        let err = launch(&quick(), &program, &args).unwrap_err().to_string();
        assert!(err.contains("rank 0"), "{err}");
        let took = start.elapsed();
        assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(20), "{took:?}");
    }

    #[test]
    fn a_signal_to_the_launcher_reaches_every_child() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        let script =
            format!("trap 'echo got > {d}/got.$RANK; kill $!; exit 0' INT; sleep 60 & touch {d}/ready.$RANK; wait");
        let path = dir.path().to_owned();
        let sender = std::thread::spawn(move || {
            // Only once every child is up (and so the launcher's handler installed) is the signal sent.
            while (0..3).any(|r| !path.join(format!("ready.{r}")).exists()) {
                std::thread::sleep(Duration::from_millis(20));
            }
            // SAFETY: sends SIGINT to this process, whose handler (installed by `launch`) records it.
            unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
        });
        let (program, args) = sh(&script);
        let err = launch(&quick(), &program, &args).unwrap_err().to_string();
        sender.join().unwrap();
        assert!(err.contains("interrupted by signal 2"), "{err}");
        for rank in 0..3 {
            assert!(dir.path().join(format!("got.{rank}")).exists(), "rank {rank} did not get SIGINT");
        }
    }
}
