//! Process-wide tuning of glibc's allocator for tensor workloads.
//!
//! libtorch allocates CPU tensors with `posix_memalign`. glibc serves blocks above its mmap threshold (128 KiB
//! at start, adapting upwards only after frees) with fresh `mmap` calls and returns them to the kernel on free,
//! so a decode step that allocates a few MiB of activations and logits pays page faults and kernel page zeroing
//! every step — measured as the largest single cost of loading a model and a visible share of each decode step.
//! So the binary serves every block from the heap and never gives freed memory back while it runs:
//! - no `mmap` for big blocks (`M_MMAP_MAX` 0): raising the threshold is not enough, glibc caps it at 32 MiB,
//!   and a train step allocates logits chunks, activations and optimizer temporaries of 100–200 MiB; measured
//!   on the GRPO bench, page zeroing and faults were about a sixth of all samples;
//! - one arena (`M_ARENA_MAX` 1): a thread's own arena is a set of 64 MiB heaps that cannot hold such blocks,
//!   so glibc falls back to `mmap` there whatever the settings; the engine and the per-step trainer threads
//!   would pay the faults again;
//! - no trimming (`M_TRIM_THRESHOLD` max): freed blocks stay for the next step.
//!
//! The cost is that the resident size stays at its peak until exit, which is what a run that repeats the same
//! steps reaches anyway. Only the binary should call this, first thing in `main`, before any thread exists: it
//! changes allocator policy for the whole process.

/// Keeps freed memory in the process for reuse (see the module docs). Returns whether glibc accepted every
/// setting; elsewhere it does nothing and returns false.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes glibc's allocator parameters; it is called with documented parameter
        // numbers and in-range values, and is safe to call at any time (glibc takes its own lock).
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1) == 1
                && libc::mallopt(libc::M_MMAP_MAX, 0) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
