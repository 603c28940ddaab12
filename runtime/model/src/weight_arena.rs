//! Memory in 2 MiB pages for the generation engine's packed weights ([`crate::packed`]).
//!
//! Why: a decode step at small batch is a stream over every packed weight, once per token: 270 MB for SmolLM2 in
//! bf16, 540 MB in fp32. In the 4 KiB pages `malloc` hands out that is 66,000 pages a token in bf16, and each page
//! costs an address translation that the TLB (a few thousand entries) cannot keep from one token to the next, so
//! the stream pays a page-table walk every 4 KiB. In Linux's transparent huge pages the same bytes are 135 pages.
//! Measured with `trinity generate` (SmolLM2-135M, batch 1, 256 new tokens, 2 threads of an EPYC Zen 4 with THP
//! in `madvise` mode, six pairs of processes run in turns against the build before): bf16 90–100 tok/s before,
//! 103–136 here, ahead in all six pairs (medians 96.5 → 108); fp32 medians 54.5 → 57.5. At batch 16 bf16 gained
//! too (678–799 → 741–868 tok/s over three pairs); batch 64 and whole `trinity run`s were unchanged within noise.
//! llama.cpp streams its weights from the GGUF file it maps, which the page cache may already hold in huge pages.
//!
//! Only the packed weights go here. Huge pages for every allocation (jemalloc's `thp:always`) made whole `trinity
//! run`s 3.5–4 s slower, with 160–200 MB more resident memory: activations and logits are allocated and freed
//! every step, and each fresh huge page is a fault that clears 2 MiB and may compact memory first. The packed
//! weights are written once and then rewritten in place on every weight sync
//! ([`crate::packed::PackedLinear::repack`]), so they fault once.
//!
//! Buffers are carved one after another out of chunks mapped for the purpose (2 MiB-aligned, `MADV_HUGEPAGE`),
//! so a model of many small projections (SmolLM2's are 0.7–3.5 MB) still fills whole huge pages. Each buffer
//! holds its chunk; the chunk is unmapped when its last buffer goes. Where the kernel gives no huge pages (THP
//! `never`, or `madvise` refused) the chunk is ordinary memory and everything works the same; off Linux there are
//! no chunks and the packed weights are ordinary tensors.

use std::sync::Arc;

/// Bytes of a huge page: chunks start on this boundary and are sized in multiples of it.
#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;

/// The smallest chunk mapped (address space only: pages are backed when a buffer is written).
#[cfg(target_os = "linux")]
const MIN_CHUNK: usize = 64 << 20;

/// Alignment of every buffer within a chunk: a cache line, as libtorch aligns its CPU tensors.
const ALIGN: usize = 64;

/// Where a model's packed weights are allocated: the chunk being filled and how much of it is taken.
#[derive(Default)]
pub(crate) struct WeightArena {
    current: Option<(Arc<Chunk>, usize)>,
}

/// `bytes` of zeroed memory in a chunk of a [`WeightArena`]; the memory stays mapped while this lives.
#[derive(Debug)]
pub(crate) struct Buffer {
    chunk: Arc<Chunk>,
    offset: usize,
}

impl Buffer {
    /// The first byte (aligned to 64 bytes), valid for the requested length while `self` lives.
    pub(crate) fn ptr(&self) -> *mut u8 {
        // SAFETY: `offset` plus the requested length lies within the chunk's mapping (checked in `alloc`).
        unsafe { self.chunk.base.add(self.offset) }
    }
}

impl WeightArena {
    /// A buffer of `bytes`, or `None` where no chunk can be mapped (off Linux, or `mmap` failed), so the caller
    /// allocates ordinary memory instead.
    pub(crate) fn alloc(&mut self, bytes: usize) -> Option<Buffer> {
        if let Some((chunk, used)) = &mut self.current {
            let offset = used.next_multiple_of(ALIGN);
            if offset.checked_add(bytes).is_some_and(|end| end <= chunk.len) {
                *used = offset + bytes;
                return Some(Buffer { chunk: Arc::clone(chunk), offset });
            }
        }
        let chunk = Arc::new(Chunk::map(bytes)?);
        self.current = Some((Arc::clone(&chunk), bytes));
        Some(Buffer { chunk, offset: 0 })
    }
}

/// An anonymous private mapping of `len` bytes starting on a huge-page boundary.
#[derive(Debug)]
pub(crate) struct Chunk {
    base: *mut u8,
    len: usize,
}

// SAFETY: a `Chunk` owns its mapping exclusively and only hands out its address; the packed weights written there
// are synchronised by the `&`/`&mut` borrows of the `PackedLinear`s that own the buffers, as any tensor's are.
unsafe impl Send for Chunk {}
// SAFETY: as above: `Chunk` itself has no interior mutability.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// Maps at least `bytes` (at least [`MIN_CHUNK`]) and asks for huge pages on it.
    #[cfg(target_os = "linux")]
    fn map(bytes: usize) -> Option<Chunk> {
        let len = bytes.max(MIN_CHUNK).checked_next_multiple_of(HUGE_PAGE)?;
        // One huge page more than needed, so that a boundary lies within the first one; the ends are unmapped.
        let span = len.checked_add(HUGE_PAGE)?;
        // SAFETY: a fresh anonymous private mapping: no file, no fixed address, nothing else refers to it.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let start = raw as usize;
        let base = start.next_multiple_of(HUGE_PAGE);
        let (head, tail) = (base - start, start + span - (base + len));
        // SAFETY: both ranges lie inside the mapping just made and outside [base, base + len), which is kept;
        // page-aligned, since `start` is (mmap) and so are `base` and `len` (multiples of 2 MiB).
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((base + len) as *mut libc::c_void, tail);
            }
            // A hint: refused (THP off, an old kernel), the chunk is ordinary 4 KiB pages and works the same.
            libc::madvise(base as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        Some(Chunk { base: base as *mut u8, len })
    }

    #[cfg(not(target_os = "linux"))]
    fn map(_bytes: usize) -> Option<Chunk> {
        None
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: the mapping `map` made and kept; every `Buffer` in it held an `Arc` to this chunk, so none is
        // left to use it.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Buffers follow one another in a chunk, aligned, until one does not fit; that one starts a new chunk, and
    /// every chunk starts on a huge-page boundary.
    #[test]
    fn buffers_fill_a_chunk_then_start_the_next() {
        let mut arena = WeightArena::default();
        let a = arena.alloc(1000).unwrap();
        let b = arena.alloc(MIN_CHUNK / 2).unwrap();
        assert!(Arc::ptr_eq(&a.chunk, &b.chunk));
        assert_eq!(a.ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(b.ptr() as usize - a.ptr() as usize, 1024, "the next 64-byte boundary after 1000 bytes");
        let c = arena.alloc(MIN_CHUNK / 2).unwrap();
        assert!(!Arc::ptr_eq(&b.chunk, &c.chunk), "the rest of the first chunk is too small");
        assert_eq!(c.ptr() as usize % HUGE_PAGE, 0);
        let big = arena.alloc(MIN_CHUNK + 1).unwrap();
        assert_eq!(big.chunk.len, MIN_CHUNK + HUGE_PAGE, "a larger buffer gets a chunk of its own size");
        // The memory is usable end to end: written, then read back.
        // SAFETY: `big` spans MIN_CHUNK + 1 bytes from its pointer and lives until the end of the test.
        let bytes = unsafe { std::slice::from_raw_parts_mut(big.ptr(), MIN_CHUNK + 1) };
        assert!(bytes.iter().all(|&x| x == 0), "fresh anonymous memory is zero");
        bytes.fill(7);
        assert_eq!(bytes[MIN_CHUNK], 7);
    }
}
