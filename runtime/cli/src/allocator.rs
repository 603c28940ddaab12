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
