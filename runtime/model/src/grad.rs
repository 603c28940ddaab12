//! Autograd calls tch has no API for (`csrc/grad.cpp` says why they matter): dropping a parameter's gradient, a
//! backward pass from a tensor with a given gradient, and adding a computed gradient into a parameter's.

use tch::Tensor;

use crate::error::Result;

#[cfg(torch_shim)]
unsafe extern "C" {
    fn trinity_release_grad(tensor: *mut std::ffi::c_void) -> i32;
    fn trinity_backward(root: *mut std::ffi::c_void, grad: *mut std::ffi::c_void) -> i32;
    fn trinity_accumulate_grad(leaf: *mut std::ffi::c_void, grad: *mut std::ffi::c_void) -> i32;
    fn trinity_grad_error() -> *const std::ffi::c_char;
}

/// Drops `tensor`'s gradient (PyTorch's `tensor.grad = None`): the next backward's result becomes the gradient,
/// with no fill before it and no add into it. Built without libtorch's headers (no `LIBTORCH` at build time) it
/// zeroes the gradient instead, which gives the same values at that cost; so does a libtorch error.
pub fn release_grad(tensor: &mut Tensor) {
    #[cfg(torch_shim)]
    {
        // SAFETY: `as_mut_ptr` is tch's `at::Tensor*` for this live tensor, which `&mut` holds for the call; the
        // function only resets that tensor's gradient handle and catches every C++ exception.
        if unsafe { trinity_release_grad(tensor.as_mut_ptr().cast()) } == 0 {
            return;
        }
    }
    tensor.zero_grad();
}

/// PyTorch's `root.backward(grad)`: backpropagates `grad` (`root`'s shape; converted to its dtype) from `root`,
/// accumulating into the gradients of the leaves it depends on (for a leaf itself, into its own), and frees the
/// graph. Built without libtorch's headers it backpropagates `Σ root · grad` from tch's scalar backward, which
/// gives the same gradients at the cost of that product.
pub fn backward_with(root: &Tensor, grad: &Tensor) -> Result<()> {
    let grad = grad.f_to_kind(root.kind())?;
    #[cfg(torch_shim)]
    {
        // SAFETY: both are live tch tensors (`at::Tensor*`) borrowed for the call; the C++ side reads them, runs
        // the autograd engine and catches every C++ exception.
        if unsafe { trinity_backward(root.as_ptr() as *mut _, grad.as_ptr() as *mut _) } == 0 {
            return Ok(());
        }
        Err(shim_error("backward"))
    }
    #[cfg(not(torch_shim))]
    {
        (root * grad).f_sum(tch::Kind::Float)?.f_backward()?;
        Ok(())
    }
}

/// Adds `grad` (`leaf`'s shape; converted to its dtype) into the gradient of `leaf`, a tensor that requires
/// one, or makes it that gradient when there is none, without a copy: what the autograd engine does for a leaf,
/// for a gradient computed by hand. Built without libtorch's headers it goes through [`backward_with`].
pub fn accumulate_grad(leaf: &Tensor, grad: Tensor) -> Result<()> {
    let grad = if grad.kind() == leaf.kind() { grad } else { grad.f_to_kind(leaf.kind())? };
    #[cfg(torch_shim)]
    {
        // SAFETY: both are live tch tensors borrowed for the call; the C++ side checks they match, then either
        // adds into the leaf's gradient or stores a new handle to `grad`'s storage as it, which stays valid after
        // this function drops its own handle.
        if unsafe { trinity_accumulate_grad(leaf.as_ptr() as *mut _, grad.as_ptr() as *mut _) } == 0 {
            return Ok(());
        }
        Err(shim_error("gradient"))
    }
    #[cfg(not(torch_shim))]
    backward_with(leaf, &grad)
}

/// The error of the shim call that just failed on this thread, for `what`.
#[cfg(torch_shim)]
fn shim_error(what: &str) -> crate::error::ModelError {
    // SAFETY: this thread's NUL-terminated message, copied before any other call.
    let message = unsafe { std::ffi::CStr::from_ptr(trinity_grad_error()) }.to_string_lossy().into_owned();
    crate::error::ModelError::InvalidInput(format!("{what}: {message}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn a_released_gradient_is_undefined_and_the_next_backward_replaces_it() {
        let mut w = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        (&w * 2.0).sum(Kind::Float).backward();
        assert_eq!(Vec::<f32>::try_from(w.grad()).unwrap(), [2.0; 3]);
        release_grad(&mut w);
        if cfg!(torch_shim) {
            assert!(!w.grad().defined());
        }
        (&w * 5.0).sum(Kind::Float).backward();
        assert_eq!(Vec::<f32>::try_from(w.grad()).unwrap(), [5.0; 3]);
    }

    /// A given gradient reaches the leaves through the graph (and into a leaf's own gradient, added to what is
    /// there), converted to the root's dtype; a wrong shape is an error, not a crash.
    #[test]
    fn backward_with_a_gradient_accumulates_into_the_leaves() {
        let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).set_requires_grad(true);
        let y = &w * &w;
        backward_with(&y, &Tensor::from_slice(&[1.0f64, 10.0, 100.0])).unwrap();
        assert_eq!(Vec::<f32>::try_from(w.grad()).unwrap(), [2.0, 40.0, 600.0]);
        backward_with(&w, &Tensor::from_slice(&[1.0f32, 1.0, 1.0])).unwrap();
        assert_eq!(Vec::<f32>::try_from(w.grad()).unwrap(), [3.0, 41.0, 601.0]);
        if cfg!(torch_shim) {
            let z = &w * 2.0;
            let err = backward_with(&z, &Tensor::ones([4], (Kind::Float, Device::Cpu))).unwrap_err();
            assert!(err.to_string().contains("backward"), "{err}");
            assert_message_alone(&err.to_string());
        }
    }

    /// A gradient added by hand becomes the leaf's gradient when it has none and adds to it otherwise (also
    /// into one a backward pass left), converted to the leaf's dtype; a wrong shape is an error.
    #[test]
    fn accumulated_gradients_add_up() {
        let mut w = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).set_requires_grad(true);
        release_grad(&mut w);
        accumulate_grad(&w, Tensor::from_slice(&[1.0f64, 2.0, 3.0])).unwrap();
        assert_eq!(Vec::<f32>::try_from(w.grad()).unwrap(), [1.0, 2.0, 3.0]);
        (&w * 10.0).sum(Kind::Float).backward();
        accumulate_grad(&w, Tensor::from_slice(&[0.5f32, 0.5, 0.5])).unwrap();
        assert_eq!(Vec::<f32>::try_from(w.grad()).unwrap(), [11.5, 12.5, 13.5]);
        if cfg!(torch_shim) {
            let err = accumulate_grad(&w, Tensor::ones([2], (Kind::Float, Device::Cpu))).unwrap_err().to_string();
            assert!(err.contains("does not match the tensor [3]"), "{err}");
            assert_message_alone(&err);
        }
    }

    /// libtorch's errors reach the caller as their message, without the C++ backtrace `what()` appends.
    fn assert_message_alone(message: &str) {
        assert!(!message.contains("Exception raised from") && !message.contains("frame #"), "{message}");
    }
}
