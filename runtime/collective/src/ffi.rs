//! The C ABI of csrc/collective.cpp. Every function that can fail returns a null pointer on success or an error
//! string allocated by the shim, which [`take_error`] turns into a Rust string and frees.

use std::ffi::{CStr, c_char};

use torch_sys::C_tensor;

/// `c10::intrusive_ptr<c10d::Store>` plus the TCPStore's port.
#[repr(C)]
pub(crate) struct RawStore {
    _private: [u8; 0],
}

/// A Gloo backend (and an NCCL one with the `nccl` feature).
#[repr(C)]
pub(crate) struct RawGroup {
    _private: [u8; 0],
}

/// A `c10d::Work` with the tensors it uses.
#[repr(C)]
pub(crate) struct RawWork {
    _private: [u8; 0],
}

pub(crate) type Error = *mut c_char;

unsafe extern "C" {
    pub(crate) fn trinity_collective_free_error(error: *mut c_char);
    pub(crate) fn trinity_collective_free_bytes(bytes: *mut u8);

    pub(crate) fn trinity_store_tcp(
        host: *const c_char,
        port: u16,
        is_server: bool,
        num_workers: i64,
        timeout_ms: i64,
        out: *mut *mut RawStore,
    ) -> Error;
    pub(crate) fn trinity_store_prefix(base: *mut RawStore, prefix: *const c_char, out: *mut *mut RawStore) -> Error;
    pub(crate) fn trinity_store_free(store: *mut RawStore);
    pub(crate) fn trinity_store_port(store: *const RawStore) -> u16;
    pub(crate) fn trinity_store_set_timeout(store: *mut RawStore, timeout_ms: i64) -> Error;
    pub(crate) fn trinity_store_set(store: *mut RawStore, key: *const c_char, data: *const u8, len: usize) -> Error;
    pub(crate) fn trinity_store_get(
        store: *mut RawStore,
        key: *const c_char,
        data: *mut *mut u8,
        len: *mut usize,
    ) -> Error;
    pub(crate) fn trinity_store_add(store: *mut RawStore, key: *const c_char, delta: i64, out: *mut i64) -> Error;
    pub(crate) fn trinity_store_compare_set(
        store: *mut RawStore,
        key: *const c_char,
        expected: *const u8,
        expected_len: usize,
        desired: *const u8,
        desired_len: usize,
        data: *mut *mut u8,
        len: *mut usize,
    ) -> Error;
    pub(crate) fn trinity_store_check(
        store: *mut RawStore,
        keys: *const *const c_char,
        n: usize,
        out: *mut bool,
    ) -> Error;
    pub(crate) fn trinity_store_wait(
        store: *mut RawStore,
        keys: *const *const c_char,
        n: usize,
        timeout_ms: i64,
    ) -> Error;
    pub(crate) fn trinity_store_delete(store: *mut RawStore, key: *const c_char, out: *mut bool) -> Error;

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn trinity_group_new(
        store: *mut RawStore,
        rank: i32,
        size: i32,
        timeout_ms: i64,
        device_kind: i32,
        device_name: *const c_char,
        threads: i32,
        nccl: bool,
        out: *mut *mut RawGroup,
    ) -> Error;
    pub(crate) fn trinity_group_free(group: *mut RawGroup);
    pub(crate) fn trinity_group_has_nccl(group: *const RawGroup) -> bool;
    pub(crate) fn trinity_group_broadcast(
        group: *mut RawGroup,
        tensor: *const C_tensor,
        root: i32,
        timeout_ms: i64,
        out: *mut *mut RawWork,
    ) -> Error;
    pub(crate) fn trinity_group_allreduce(
        group: *mut RawGroup,
        tensor: *const C_tensor,
        op: i32,
        timeout_ms: i64,
        out: *mut *mut RawWork,
    ) -> Error;
    pub(crate) fn trinity_group_allgather(
        group: *mut RawGroup,
        input: *const C_tensor,
        outputs: *const *const C_tensor,
        n: usize,
        timeout_ms: i64,
        out: *mut *mut RawWork,
    ) -> Error;
    pub(crate) fn trinity_group_reduce_scatter_flat(
        group: *mut RawGroup,
        output: *const C_tensor,
        input: *const C_tensor,
        op: i32,
        timeout_ms: i64,
        out: *mut *mut RawWork,
    ) -> Error;
    pub(crate) fn trinity_group_allgather_flat(
        group: *mut RawGroup,
        output: *const C_tensor,
        input: *const C_tensor,
        timeout_ms: i64,
        out: *mut *mut RawWork,
    ) -> Error;
    pub(crate) fn trinity_group_barrier(group: *mut RawGroup, timeout_ms: i64, out: *mut *mut RawWork) -> Error;
    pub(crate) fn trinity_work_wait(work: *mut RawWork, timeout_ms: i64) -> Error;
    pub(crate) fn trinity_work_is_completed(work: *mut RawWork) -> bool;
    pub(crate) fn trinity_work_free(work: *mut RawWork);
}

/// Converts the shim's return value: `Ok` for null, else the message (the string is freed).
pub(crate) fn take_error(error: Error) -> Result<(), String> {
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null return is a NUL-terminated string the shim allocated with malloc and handed over; it is
    // read once here and freed by the shim's own `free`.
    let message = unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned();
    // SAFETY: see above; the pointer is not used after this.
    unsafe { trinity_collective_free_error(error) };
    Err(message)
}

/// Copies a byte buffer the shim allocated into a Vec and frees it.
///
/// # Safety
/// `data` must be a malloc'd buffer of at least `len` bytes from the shim, not used afterwards.
pub(crate) unsafe fn take_bytes(data: *mut u8, len: usize) -> Vec<u8> {
    if data.is_null() {
        return Vec::new();
    }
    // SAFETY: the caller guarantees `data` holds `len` readable bytes.
    let out = unsafe { std::slice::from_raw_parts(data, len) }.to_vec();
    // SAFETY: the buffer came from the shim's malloc and is freed exactly once.
    unsafe { trinity_collective_free_bytes(data) };
    out
}

/// The longest timeout handed to c10d: a week. `std::condition_variable::wait_for` adds the timeout to the clock's
/// current time, so a huge value would overflow into the past and time out at once.
const MAX_TIMEOUT_MS: i64 = 7 * 24 * 3600 * 1000;

/// Milliseconds for the shim, between 1 (c10d reads 0 as "no timeout" in places) and a week.
pub(crate) fn millis(timeout: std::time::Duration) -> i64 {
    i64::try_from(timeout.as_millis()).unwrap_or(MAX_TIMEOUT_MS).clamp(1, MAX_TIMEOUT_MS)
}
