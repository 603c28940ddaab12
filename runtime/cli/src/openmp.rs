//! How libtorch's OpenMP threads wait between parallel regions: they spin briefly, then sleep, unless the user said
//! otherwise.
//!
//! libtorch's CPU kernels run on a GNU OpenMP team. A decode step forks it ~150 times and a train step thousands of
//! times, each region a few to a few hundred microseconds. How a team thread waits for the next region decides two
//! things. Sleeping at once (`OMP_WAIT_POLICY=passive`) makes every region wake its workers through the kernel, which
//! is slow on the virtual machines measured here; spinning long (libgomp's default, about 300,000 iterations) holds a
//! core that another thread or process needs, and every region then waits for its slowest member. This binary sets
//! `GOMP_SPINCOUNT=3000` (about 30 µs by libgomp's estimate of 100,000 spins a millisecond): long enough to bridge the
//! gap between back-to-back regions, short enough that a competitor loses little.
//!
//! Measured on 2 cores of a Xeon with AMX (SmolLM2-135M, bf16, `trinity generate --threads 2`), passive against 3000
//! spins:
//! - idle, one sequence at a time: 45–46 → 84–87 tokens/s; 24 sequences: 342 → 408 tokens/s;
//! - beside one busy process: one sequence 37.7 → 27.2 tokens/s, 24 sequences 224 → 203;
//! - the quickstart's first 6 steps (`trinity run`, explorer and trainer): 39.3–40.0 → 35.3 s idle, and its
//!   first 4 beside a busy process 38.3 → 40.4 s (30,000 spins: 61.6 s).
//!
//! Earlier, on another of this project's 2-core machines, libgomp's default spinning had taken 3.9× its idle time
//! beside one busy process (passive: 1.8×) and 324 s against 46 s at a load average of 6: the reason not to spin
//! long.
//!
//! libgomp reads its variables once, in a constructor that runs when the library is loaded, before `main`. Setting one
//! from `main` is therefore too late for this process: the binary sets it and re-executes itself, once, at start,
//! before any thread exists. A user who sets `OMP_WAIT_POLICY` (`active` for a benchmark on a dedicated machine,
//! `passive` on a crowded one) or `GOMP_SPINCOUNT` keeps their choice and no re-execution happens. Child processes
//! (`trinity launch` ranks, agent programs) inherit the setting.

use std::ffi::OsString;

/// libgomp's wait policy; a user who sets it has chosen how threads wait.
const WAIT_POLICY: &str = "OMP_WAIT_POLICY";
/// libgomp's spin count, and the value trinity sets unless the user chose (see the module docs).
const SPIN_COUNT: &str = "GOMP_SPINCOUNT";
const BRIEF_SPIN: &str = "3000";

/// Whether the process must set the spin count and re-execute: only when the user set neither variable.
fn needs_spin_count(get: impl Fn(&str) -> Option<OsString>) -> bool {
    get(WAIT_POLICY).is_none() && get(SPIN_COUNT).is_none()
}

/// Re-executes the binary with `GOMP_SPINCOUNT=3000` when the user set no OpenMP wait variable (see the module
/// docs). Returns only when no re-execution was needed, or when it failed; a failure is reported on stderr and the
/// process goes on with libgomp's default.
///
/// Must be called first thing in `main`, before any thread exists: it changes the process environment.
pub(crate) fn wait_briefly() {
    if !needs_spin_count(|name| std::env::var_os(name)) {
        return;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(error) => {
                eprintln!(
                    "note: cannot find trinity's own executable to set {SPIN_COUNT}={BRIEF_SPIN} ({error}); OpenMP threads wait as libgomp defaults"
                );
                return;
            }
        };
        let mut args = std::env::args_os();
        let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
        // `exec` only returns on failure.
        let error = std::process::Command::new(&exe).arg0(arg0).args(args).env(SPIN_COUNT, BRIEF_SPIN).exec();
        eprintln!(
            "note: could not re-execute {} with {SPIN_COUNT}={BRIEF_SPIN} ({error}); OpenMP threads wait as libgomp defaults",
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
    fn the_spin_count_is_set_only_when_the_user_chose_nothing() {
        assert!(needs_spin_count(env(&[])));
        assert!(needs_spin_count(env(&[("OMP_NUM_THREADS", "2")])));
        assert!(!needs_spin_count(env(&[("OMP_WAIT_POLICY", "active")])));
        assert!(!needs_spin_count(env(&[("OMP_WAIT_POLICY", "passive")])));
        assert!(!needs_spin_count(env(&[("GOMP_SPINCOUNT", "10000")])));
    }
}
