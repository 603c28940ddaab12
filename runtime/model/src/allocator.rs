//! Process-wide tuning of glibc's allocator for tensor workloads.
//!
//! libtorch allocates CPU tensors with `posix_memalign`. glibc serves blocks above its mmap threshold (128 KiB
//! at start, adapting upwards only after frees) with fresh `mmap` calls and returns them to the kernel on free,
//! so a decode step that allocates a few MiB of activations and logits pays page faults and kernel page zeroing
//! every step — measured as the largest single cost of loading a model and a visible share of each decode step.
//! Raising the mmap threshold to its maximum (32 MiB on 64-bit) and not trimming the heap keeps freed blocks in
//! the process for reuse. Only the binary should call this: it changes allocator policy for the whole process.

/// Keeps freed memory of up to 32 MiB per block in the process for reuse (see the module docs). Returns whether
/// glibc accepted both settings; elsewhere it does nothing and returns false.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const MAX_MMAP_THRESHOLD: libc::c_int = 32 << 20;
        // SAFETY: mallopt only changes glibc's allocator parameters; it is called with documented parameter
        // numbers and in-range values, and is safe to call at any time (glibc takes its own lock).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MAX_MMAP_THRESHOLD) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
