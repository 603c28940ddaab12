//! Dropping a parameter's gradient, which tch has no call for (`csrc/grad.cpp` says why it matters).

use tch::Tensor;

#[cfg(torch_shim)]
unsafe extern "C" {
    fn trinity_release_grad(tensor: *mut std::ffi::c_void) -> i32;
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
}
