//! The process's `malloc`: jemalloc, for every allocation in the process, libtorch's tensors included.
//!
//! libtorch allocates CPU tensors with `posix_memalign` and frees them when the last handle drops, so a train
//! step allocates and frees thousands of blocks from a few KiB to a few hundred MiB (activations, gradients,
//! logit slabs, optimizer temporaries), from the trainer thread, libtorch's OpenMP team and the engine's thread
//! at once. glibc's allocator serves that badly in both of its configurations: by default it hands blocks over
//! 32 MiB back to the kernel on free, so each step pays page faults and kernel page zeroing again; kept in one
//! arena with `mmap` and trimming off (what this binary did before), the three kinds of threads contend for that
//! arena's lock and sleep on it. Measured on the quickstart's first 4 steps (2 cores of a Xeon with AMX, idle):
//! 12.7–14.1 s a train step with glibc so configured, 10.0–11.7 s with jemalloc 5.3 (these options) preloaded
//! into the same binary, 9.6–10.6 s with gperftools' tcmalloc, 11.4–14.4 s with mimalloc; explore time the same.
//! `perf` had put a fifth of the trainer's samples in the kernel (page clearing, futex waits) and a tenth in
//! glibc's `_int_malloc`. jemalloc builds from source with the crate; tcmalloc would need a system library.
//!
//! The binary links jemalloc with unprefixed symbols (`malloc`, `free`, `posix_memalign`, …) that the dynamic
//! linker binds for the shared libraries too, libtorch and libgomp included, so there is one allocator in the
//! process. Freed pages are kept for reuse (`dirty_decay_ms:-1`, `muzzy_decay_ms:-1`): a run repeats the same
//! steps and reaches its peak resident size anyway, so giving pages back only to fault them in again a step
//! later is pure cost. Arenas are per CPU (`percpu_arena:percpu`), not per thread: each train step runs on a
//! thread of its own with a fresh OpenMP team, and jemalloc's default hands new threads arenas in turn, so every
//! step's memory came back to an arena the next step's threads did not use and, never purged, resident memory
//! grew by ~250 MB a step (the quickstart: 2.5 GB after its first step, 12.3 GB after its 40th; a longer run would
//! exhaust the machine). Per CPU, the first 12 steps settle at 4.8 GB (one arena for all threads: 5.4 GB) with the
//! same step times. `MALLOC_CONF` in the environment still overrides these settings, as jemalloc documents.

/// The allocator for Rust's own allocations; naming it also makes the linker keep jemalloc's `malloc` symbols.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's compiled-in options, read once when the allocator starts (before `main`): see the module docs.
/// jemalloc declares this symbol weak, so this definition replaces its empty default. C reads it as a
/// `const char *`: a thin pointer to NUL-terminated bytes, which `&u8` is (a `&CStr` would not be).
#[unsafe(no_mangle)]
#[allow(non_upper_case_globals)]
static malloc_conf: &u8 = &b"dirty_decay_ms:-1,muzzy_decay_ms:-1,percpu_arena:percpu\0"[0];

/// Binds one parked thread to each per-CPU arena this process can run on, for the process's life.
///
/// Why: when a thread exits, jemalloc (`tcache_destroy`) purges its arena down to nothing if no other thread is
/// bound to it, whatever the decay settings say: every dirty page goes back to the kernel (`MADV_DONTNEED`). A
/// train step runs on a thread of its own with a fresh OpenMP team ([`trinity_rft`]'s `on_pool`), and when that
/// team exits between steps the arenas it used are often left without threads, so the next step faults its
/// ~1 GB of activations and gradients back in, each page zeroed by the kernel. A thread that stays bound to an
/// arena, asleep, keeps that purge from ever running. Measured on `cargo xtask bench grpo`'s trinity bf16 run
/// (6 steps, 2 cores of a Xeon with AMX, idle): system time 6.7–8.4 s → 4.1–4.8 s, minor faults 1.44–1.47 M →
/// 1.15–1.28 M, peak resident 5.7–5.8 GB → 4.4–5.1 GB.
///
/// A per-CPU arena is the one of the CPU a thread allocates on, so each keeper is pinned to its CPU for its
/// first allocation (which binds it) and then parks. CPUs outside the process's affinity mask get none: no
/// thread of this process allocates there.
pub(crate) fn keep_arenas_bound() {
    // SAFETY: `sched_getaffinity` writes at most `size_of::<cpu_set_t>()` bytes into the zeroed set.
    let allowed = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return;
        }
        set
    };
    // SAFETY: `CPU_ISSET` reads one bit of the set, `cpu` being below `CPU_SETSIZE`.
    let usable = |cpu: usize| unsafe { libc::CPU_ISSET(cpu, &allowed) };
    for cpu in (0..libc::CPU_SETSIZE as usize).filter(|&cpu| usable(cpu)) {
        let (bound, wait) = std::sync::mpsc::channel::<()>();
        let keeper =
            std::thread::Builder::new().name(format!("arena-keeper-{cpu}")).stack_size(64 * 1024).spawn(move || {
                // SAFETY: the set is zeroed, then one CPU bit is set; the call only reads it.
                unsafe {
                    let mut one: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut one);
                    libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &one);
                }
                // The first allocation binds this thread to the arena of the CPU it runs on.
                drop(std::hint::black_box(vec![0u8; 64]));
                let _ = bound.send(());
                loop {
                    std::thread::park();
                }
            });
        if keeper.is_ok() {
            let _ = wait.recv();
        }
    }
}
