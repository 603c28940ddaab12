//! Activation recomputation of decoder layers (`csrc/checkpoint.cpp` says why and how): [`segment`] runs a layer
//! so that its backward recomputes it from its input instead of keeping what its forward computed.
//!
//! The layer runs twice, first with autograd off and then, in the backward, with it on. Code inside it that
//! chooses by whether it is being recorded (attention's bf16 training path, LoRA's dropout) asks [`recording`],
//! which answers yes in both runs, so the two compute the same thing; the random generator's state is restored
//! between them, so a dropout draws the same mask.

use std::cell::Cell;

use tch::Tensor;

use crate::error::{ModelError, Result};

/// A layer's computation from its input, owning what it reads (shallow copies of the weights), because the
/// autograd graph calls it again in the backward, after the forward that built it has returned.
type Run = dyn Fn(&Tensor) -> Result<Tensor> + Send;

#[cfg(torch_shim)]
mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    pub(super) type RunFn =
        unsafe extern "C" fn(*mut c_void, *mut c_void, c_int, *mut *mut c_void, *mut c_char, usize) -> c_int;
    pub(super) type DropFn = unsafe extern "C" fn(*mut c_void);

    unsafe extern "C" {
        pub(super) fn trinity_checkpoint(
            x: *mut c_void,
            state: *mut c_void,
            run: RunFn,
            drop: DropFn,
            out: *mut *mut c_void,
        ) -> c_int;
        pub(super) fn trinity_checkpoint_error() -> *const c_char;
        pub(super) fn trinity_grad_mode_enabled() -> c_int;
    }
}

/// `csrc/checkpoint.cpp`'s `Mode::kFirst`: the checkpoint's forward, with autograd off.
#[cfg(torch_shim)]
const FIRST_RUN: i32 = 1;
/// `Mode::kRecompute`: the backward's recomputation.
#[cfg(all(torch_shim, test))]
const RECOMPUTATION: i32 = 2;

thread_local! {
    /// Whether this thread is inside a checkpoint's first run.
    static FIRST: Cell<bool> = const { Cell::new(false) };
    /// Recomputations run on this thread, for tests to see that recomputation happened.
    #[cfg(test)]
    static RECOMPUTED: Cell<usize> = const { Cell::new(0) };
}

/// How many recomputations ran on this thread (tests).
#[cfg(test)]
pub(crate) fn recomputed() -> usize {
    RECOMPUTED.get()
}

/// Whether recomputation can run in this build: it needs libtorch's headers at build time (`LIBTORCH` set).
pub(crate) const AVAILABLE: bool = cfg!(torch_shim);

/// Why recomputation is refused in a build where it is not [`AVAILABLE`].
pub(crate) const UNAVAILABLE: &str =
    "activation recomputation needs trinity built against libtorch's headers (LIBTORCH set at build time)";

/// Whether computing on `t` is part of a forward that a backward will use: `t` requires grad, or this is the
/// first run of a recomputed layer (autograd off, but its recomputation will record).
pub(crate) fn recording(t: &Tensor) -> bool {
    t.requires_grad() || FIRST.get()
}

/// Whether this thread is inside a recomputed layer's first run (autograd off; its recomputation comes in the
/// backward).
pub(crate) fn in_first_run() -> bool {
    FIRST.get()
}

/// Whether autograd records on this thread.
pub(crate) fn grad_mode_enabled() -> bool {
    #[cfg(torch_shim)]
    {
        // SAFETY: reads a thread-local flag of libtorch.
        unsafe { ffi::trinity_grad_mode_enabled() != 0 }
    }
    #[cfg(not(torch_shim))]
    {
        // Without the shim: autograd records when a fresh leaf that requires grad passes it on.
        let leaf = Tensor::from(0f32).set_requires_grad(true);
        (&leaf * 1.0).requires_grad()
    }
}

/// `run(x)`, keeping only `x` for the backward and recomputing the rest there when autograd records (then `x` must
/// require grad); plainly `run(x)` otherwise.
pub(crate) fn segment(x: &Tensor, run: Box<Run>) -> Result<Tensor> {
    #[cfg(torch_shim)]
    {
        let state = Box::into_raw(Box::new(run)).cast();
        let mut out = std::ptr::null_mut();
        // SAFETY: `x` is a live tch tensor (`at::Tensor*`), read for the call. `state` is a leaked `Box<Box<Run>>`
        // that the C++ side owns from here on, calls through `run_segment` and frees through `drop_segment` exactly
        // once, in every case. On success `out` is a new handle nothing else owns.
        let status =
            unsafe { ffi::trinity_checkpoint(x.as_ptr() as *mut _, state, run_segment, drop_segment, &mut out) };
        if status == 0 && !out.is_null() {
            // SAFETY: see above.
            return Ok(unsafe { Tensor::from_ptr(out.cast()) });
        }
        // SAFETY: this thread's NUL-terminated message, copied at once.
        let message = unsafe { std::ffi::CStr::from_ptr(ffi::trinity_checkpoint_error()) };
        Err(ModelError::InvalidInput(format!("recomputed layer: {}", message.to_string_lossy())))
    }
    #[cfg(not(torch_shim))]
    {
        let _ = (x, run);
        Err(ModelError::InvalidInput(UNAVAILABLE.into()))
    }
}

/// Marks this thread as inside a checkpoint's first run until dropped.
struct FirstRun(bool);

impl FirstRun {
    fn enter(first: bool) -> Self {
        FirstRun(FIRST.replace(first))
    }
}

impl Drop for FirstRun {
    fn drop(&mut self) {
        FIRST.set(self.0);
    }
}

/// The C++ side's call into a segment: runs it on `x` (a handle this takes over) and hands back the result as a
/// handle, or writes the error (a panic included: it must not unwind into C++).
#[cfg(torch_shim)]
unsafe extern "C" fn run_segment(
    state: *mut std::ffi::c_void,
    x: *mut std::ffi::c_void,
    mode: std::ffi::c_int,
    out: *mut *mut std::ffi::c_void,
    error: *mut std::ffi::c_char,
    error_len: usize,
) -> std::ffi::c_int {
    // SAFETY: `state` is the `Box<Box<Run>>` `segment` leaked, alive until `drop_segment`; `x` a handle given to us.
    let (run, x) = unsafe { (&*(state as *const Box<Run>), Tensor::from_ptr(x.cast())) };
    #[cfg(test)]
    if mode == RECOMPUTATION {
        RECOMPUTED.set(RECOMPUTED.get() + 1);
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _first = FirstRun::enter(mode == FIRST_RUN);
        run(&x)
    }));
    let message = match result {
        Ok(Ok(mut y)) => {
            // SAFETY: `out` is the caller's slot; the handle moves to it, so `y` must not free it.
            unsafe { *out = y.as_mut_ptr().cast() };
            std::mem::forget(y);
            return 0;
        }
        Ok(Err(e)) => e.to_string(),
        Err(panic) => match panic.downcast_ref::<&str>() {
            Some(s) => format!("panicked: {s}"),
            None => match panic.downcast_ref::<String>() {
                Some(s) => format!("panicked: {s}"),
                None => "panicked".to_owned(),
            },
        },
    };
    let bytes = message.as_bytes();
    let n = bytes.len().min(error_len.saturating_sub(1));
    if error_len > 0 {
        // SAFETY: `error` has room for `error_len` bytes, and `n + 1 <= error_len`.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), error.cast(), n);
            *error.add(n) = 0;
        }
    }
    -1
}

#[cfg(torch_shim)]
unsafe extern "C" fn drop_segment(state: *mut std::ffi::c_void) {
    // SAFETY: the C++ side calls this once, with the pointer `segment` leaked.
    drop(unsafe { Box::from_raw(state as *mut Box<Run>) });
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::*;

    fn layer(w: &Tensor) -> Box<Run> {
        let w = w.shallow_clone();
        Box::new(move |x: &Tensor| Ok(x.f_matmul(&w)?.f_tanh()?.f_matmul(&w)?))
    }

    /// The same gradients as the plain forward, into the parameter and through the input.
    #[test]
    #[cfg(torch_shim)]
    fn recomputed_segment_gives_the_plain_gradients() {
        tch::manual_seed(0);
        let mut w = Tensor::randn([4, 4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let mut x0 = Tensor::randn([3, 4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let g = Tensor::randn([3, 4], (Kind::Float, Device::Cpu));
        let plain = layer(&w)(&(&x0 * 2.0)).unwrap();
        (&plain * &g).sum(Kind::Float).backward();
        let (want_w, want_x) = (w.grad().copy(), x0.grad().copy());
        w.zero_grad();
        x0.zero_grad();
        let y = segment(&(&x0 * 2.0), layer(&w)).unwrap();
        assert!(y.requires_grad());
        assert_eq!(f64::try_from((&y - &plain).abs().max()).unwrap(), 0.0);
        (&y * &g).sum(Kind::Float).backward();
        assert!(f64::try_from((w.grad() - want_w).abs().max()).unwrap() < 1e-6);
        assert!(f64::try_from((x0.grad() - want_x).abs().max()).unwrap() < 1e-6);
    }

    #[test]
    #[cfg(torch_shim)]
    fn errors_and_panics_inside_come_back_as_errors() {
        let x = Tensor::ones([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let err =
            segment(&x, Box::new(|_: &Tensor| Err(ModelError::InvalidInput("no such thing".into())))).unwrap_err();
        assert!(err.to_string().contains("no such thing"), "{err}");
        let err = segment(&x, Box::new(|_: &Tensor| panic!("boom"))).unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
        // Under no_grad the segment runs plainly: nothing is kept, nothing needs a gradient.
        let y = tch::no_grad(|| {
            segment(&Tensor::ones([2], (Kind::Float, Device::Cpu)), layer(&Tensor::eye(2, (Kind::Float, Device::Cpu))))
        })
        .unwrap();
        assert!(!y.requires_grad());
    }

    #[test]
    #[cfg(not(torch_shim))]
    fn without_the_shim_recomputation_is_refused() {
        let x = Tensor::ones([2], (Kind::Float, Device::Cpu));
        let err = segment(&x, layer(&Tensor::eye(2, (Kind::Float, Device::Cpu)))).unwrap_err();
        assert!(err.to_string().contains("LIBTORCH"), "{err}");
    }
}
