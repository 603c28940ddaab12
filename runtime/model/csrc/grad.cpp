// Autograd access that tch does not expose: dropping a tensor's gradient (`tensor.grad = None` in PyTorch), a
// backward pass from a non-scalar root with a given gradient (`tensor.backward(gradient)`), and adding a computed
// gradient into a leaf's.
//
// Why the first: tch's zero_grad fills the gradient with zeros and keeps it, so the next backward adds its result
// into those zeros (AccumulateGrad's in-place add) instead of taking the result as the gradient: a fill and an add
// over every parameter per optimizer step, ~0.1 s of a SmolLM2 train step on 2 cores. PyTorch's own zero_grad has
// set gradients to None by default since 2.0, and veRL's optimizer steps use it so.
//
// Why the second: tch's backward starts from a scalar, so handing a computed gradient `g` to a tensor `x` meant
// building `(x * g).sum()` first. For the output head's weight gradient (which the trainer forms by hand) that
// was a dot product over the whole `[vocab, hidden]` weight: libtorch's bf16 `dot` is a scalar single-threaded
// loop, 236 ms of a 1.7 s SmolLM2 train step (8 x 164 tokens, 2 cores), for a value nobody reads. Handing that
// gradient to the leaf through the engine (`w.backward(g)`) copies it when the leaf has none yet, because the
// caller still holds `g` (86 ms for SmolLM2's 56 MB bf16 head); the third call takes it as it is.

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "error_message.h"

namespace {
thread_local std::string last_error;
}

// t: a tch tensor handle (torch-sys's `C_tensor` is an `at::Tensor*`). Returns 0, or -1 on a libtorch error.
extern "C" int trinity_release_grad(at::Tensor* t) {
  try {
    t->mutable_grad().reset();
    return 0;
  } catch (const std::exception&) {
    return -1;
  }
}

// Backpropagates `grad` (same shape and dtype as `root`) from `root`, accumulating into the leaves' gradients
// and freeing the graph. Returns 0, or -1 with the message in `trinity_grad_error` on this thread.
extern "C" int trinity_backward(at::Tensor* root, at::Tensor* grad) {
  try {
    root->backward(*grad);
    return 0;
  } catch (const std::exception& e) {
    last_error = error_message(e);
    return -1;
  }
}

// Adds `grad` into the leaf's gradient, or makes it the gradient when there is none (sharing its storage: the
// caller gives its handle up), as autograd's AccumulateGrad does when it may steal. Returns 0, or -1 with the
// message in `trinity_grad_error`.
extern "C" int trinity_accumulate_grad(at::Tensor* leaf, at::Tensor* grad) {
  try {
    TORCH_CHECK(leaf->sizes() == grad->sizes() && leaf->scalar_type() == grad->scalar_type() &&
                    leaf->device() == grad->device(),
                "gradient ", grad->sizes(), " ", grad->scalar_type(), " does not match the tensor ", leaf->sizes(), " ",
                leaf->scalar_type());
    at::Tensor& current = leaf->mutable_grad();
    if (current.defined())
      current.add_(*grad);
    else
      current = *grad;
    return 0;
  } catch (const std::exception& e) {
    last_error = error_message(e);
    return -1;
  }
}

extern "C" const char* trinity_grad_error() { return last_error.c_str(); }
