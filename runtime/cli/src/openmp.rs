//! How libtorch's OpenMP threads wait: passively, unless the user said otherwise.
//!
//! libtorch's CPU kernels run on a GNU OpenMP team. Between parallel regions a team thread spins, by default, for
//! about 300,000 iterations before it sleeps. That is the right choice on a machine with a core per thread and
//! nothing else to run; it is the wrong one as soon as anything else wants a core: another process, a compiler,
//! or trinity's own trainer beside its engine. A spinning thread then holds a core the thread it waits for needs,
//! every region waits for its slowest member, and throughput falls far below the process's share of the machine.
//! Measured on this project's 2-core machine (`trinity generate`, SmolLM2-135M, 24 prompts × 64 tokens):
//! with one competing busy process the run took 3.9× its idle time with spinning threads and 1.8× with passive
//! ones; under a load average of 6 it took 324 s against 46 s. Idle, passive waiting costs a few per cent.
//!
//! libgomp reads `OMP_WAIT_POLICY` once, in a constructor that runs when the library is loaded, before `main`.
//! Setting the variable from `main` is therefore too late for this process: the binary sets it and re-executes
//! itself, once, at start, before any thread exists. A user who sets `OMP_WAIT_POLICY` (for example `active` for
//! a benchmark on an idle machine) or `GOMP_SPINCOUNT` keeps their choice and no re-execution happens.

use std::ffi::OsString;

/// The variable libgomp reads, and the value trinity wants unless the user chose.
const WAIT_POLICY: &str = "OMP_WAIT_POLICY";
const PASSIVE: &str = "passive";
/// libgomp's own spin count; a user who sets it has chosen how threads wait.
const SPIN_COUNT: &str = "GOMP_SPINCOUNT";

/// Whether the process must set the wait policy and re-execute: only when the user set neither variable.
fn needs_passive(get: impl Fn(&str) -> Option<OsString>) -> bool {
    get(WAIT_POLICY).is_none() && get(SPIN_COUNT).is_none()
}

/// Re-executes the binary with `OMP_WAIT_POLICY=passive` when the user set no OpenMP wait variable (see the module
/// docs). Returns only when no re-execution was needed, or when it failed; a failure is reported on stderr and the
/// process goes on with libgomp's default.
///
/// Must be called first thing in `main`, before any thread exists: it changes the process environment.
pub(crate) fn wait_passively() {
    if !needs_passive(|name| std::env::var_os(name)) {
        return;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(error) => {
                eprintln!(
                    "note: cannot find trinity's own executable to set {WAIT_POLICY}={PASSIVE} ({error}); OpenMP threads spin while waiting"
                );
                return;
            }
        };
        let mut args = std::env::args_os();
        let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
        // `exec` only returns on failure.
        let error = std::process::Command::new(&exe).arg0(arg0).args(args).env(WAIT_POLICY, PASSIVE).exec();
        eprintln!(
            "note: could not re-execute {} with {WAIT_POLICY}={PASSIVE} ({error}); OpenMP threads spin while waiting",
            exe.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| OsString::from(v))
    }

    #[test]
    fn passive_only_when_the_user_chose_nothing() {
        assert!(needs_passive(env(&[])));
        assert!(needs_passive(env(&[("OMP_NUM_THREADS", "2")])));
        assert!(!needs_passive(env(&[("OMP_WAIT_POLICY", "active")])));
        assert!(!needs_passive(env(&[("OMP_WAIT_POLICY", "passive")])));
        assert!(!needs_passive(env(&[("GOMP_SPINCOUNT", "10000")])));
    }
}
