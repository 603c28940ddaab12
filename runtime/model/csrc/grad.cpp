// Autograd access that tch does not expose: dropping a tensor's gradient (`tensor.grad = None` in PyTorch).
//
// Why: tch's zero_grad fills the gradient with zeros and keeps it, so the next backward adds its result into
// those zeros (AccumulateGrad's in-place add) instead of taking the result as the gradient: a fill and an add over
// every parameter per optimizer step, ~0.1 s of a SmolLM2 train step on 2 cores. PyTorch's own zero_grad has set
// gradients to None by default since 2.0, and veRL's optimizer steps use it so.

#include <ATen/core/Tensor.h>

#include <exception>

// t: a tch tensor handle (torch-sys's `C_tensor` is an `at::Tensor*`). Returns 0, or -1 on a libtorch error.
extern "C" int trinity_release_grad(at::Tensor* t) {
  try {
    t->mutable_grad().reset();
    return 0;
  } catch (const std::exception&) {
    return -1;
  }
}
