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
//! later is pure cost.
//!
//! One arena for every thread (`narenas:1`), because of how jemalloc and a train step's threads meet. Each train
//! step runs on a thread of its own with a fresh OpenMP team (`trinity_rft`'s `on_pool`), and they all exit at the
//! end of the step. jemalloc hands new threads arenas in turn by default, so every step's memory went back to an
//! arena the next step's threads did not use, and resident memory grew by ~250 MB a step (the quickstart: 2.5 GB
//! after its first step, 12.3 GB after its 40th). Per-CPU arenas (`percpu_arena:percpu`, this binary's choice
//! until 2026-11-25) stopped the growth, but met the second trap: when a thread exits, jemalloc purges its arena
//! completely if no other thread is bound to it, whatever the decay settings say, and the end of a step's pool
//! often left a per-CPU arena without threads, so the next step faulted its ~1 GB of activations and gradients
//! back in. One arena is never left without threads (the main thread is bound to it for the process's life), and
//! its memory serves every step whichever CPU a thread runs on. Measured on `cargo xtask bench grpo`'s trinity
//! bf16 run (6 steps, 2 cores of a Xeon with AMX, idle):
//! - per-CPU arenas as they were: 6.7–8.4 s of system time, 1.44–1.47 M minor faults, 5.7–5.8 GB peak resident;
//! - per-CPU arenas with a parked thread bound to each (one way out of the purge): 3.3–3.6 s, 1.19–1.31 M,
//!   4.7–5.2 GB, 19.8–20.5 s wall;
//! - one arena: 2.8–3.1 s, 0.98–1.08 M, 3.9–4.3 GB, 19.6–20.2 s (three runs; three more with the one arena set
//!   through `MALLOC_CONF` on the build with parked threads, interleaved with that build's own: 2.9–3.4 s,
//!   1.08–1.15 M, 4.3–4.5 GB, 19.8–20.2 s).
//!
//! The fp32 run (interleaved, two each) was within this VM's noise either way: 33.0–38.0 s with parked threads,
//! 34.1–36.3 s with one arena.
//!
//! Lock contention on the one arena did not show in these runs: threads take small blocks from their own caches
//! (tcache) without the lock.
//!
//! Freed memory is reused whatever the size of the free extent it sits in (`lg_extent_max_active_fit:20`, where
//! jemalloc's default 6 refuses to split a free extent more than 64 times the request). A step frees its
//! activations as large coalesced extents, and the next step asks for pieces of a few hundred KiB (per-layer
//! projections, attention probabilities); refused those extents, jemalloc mapped new memory for them every step,
//! so resident memory grew by one step's worth (~155 MB on the GRPO bench) each step while the bytes allocated
//! stayed the same, and every new page was a fault: on the GRPO bench's bf16 config (2 cores of a Xeon with AMX)
//! jemalloc's dirty pages went 450 → 1,400 MB over 6 steps, 16 steps ended at 5.8 GB resident, and page clearing
//! took as many of the trainer's samples as its matmuls. With the splits allowed the dirty pages stay at 453 MB
//! through 16 steps, which end at 3.5 GB resident, and the train step is a steady 1.0–1.1 s.
//!
//! `MALLOC_CONF` in the environment still overrides these settings, as jemalloc documents.

/// The allocator for Rust's own allocations; naming it also makes the linker keep jemalloc's `malloc` symbols.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's compiled-in options, read once when the allocator starts (before `main`): see the module docs.
/// jemalloc declares this symbol weak, so this definition replaces its empty default. C reads it as a
/// `const char *`: a thin pointer to NUL-terminated bytes, which `&u8` is (a `&CStr` would not be).
#[unsafe(no_mangle)]
#[allow(non_upper_case_globals)]
static malloc_conf: &u8 = &b"dirty_decay_ms:-1,muzzy_decay_ms:-1,narenas:1,lg_extent_max_active_fit:20\0"[0];
