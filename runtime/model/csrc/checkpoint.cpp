// Activation recomputation ("gradient checkpointing") of one decoder layer, as an autograd function whose forward
// and recomputation are a Rust closure (`src/checkpoint.rs`).
//
// Why: the backward of a layer needs what its forward computed: the normed inputs, q/k/v, the attention weights,
// the MLP's gate, up and product. Kept for every layer, that is ~1.2 MB a token for SmolLM2-135M in fp32
// (measured, see `micro_batch::kept_activations_token_cap`), so Trinity-RFT's token budgets (16384 tokens a
// micro-batch) ask a CPU machine for tens of GB. Recomputed, a layer keeps only its input (`hidden` values a token)
// until the backward reaches it, and then runs its forward again with autograd: one more forward of the layers for
// a fraction of the memory, as PyTorch's reentrant `torch.utils.checkpoint` does and veRL's
// `enable_gradient_checkpointing` asks.
//
// The forward runs with autograd off and saves the input and the random generator's state; the backward restores
// that state (so a LoRA dropout draws the same mask), runs the closure again with autograd on a detached copy of the
// input, and backpropagates the incoming gradient through it: the parameters' gradients accumulate as that
// backward reaches them, and the input's gradient is handed on to the layer below.
//
// As with PyTorch's `preserve_rng_state`, the replay assumes nothing else draws from the generator while a layer
// runs; during training here the only draw is LoRA's dropout itself (the engine samples with a generator of its
// own, not libtorch's).
//
// The closure is owned here, in a capsule the autograd graph holds: it lives exactly as long as something can still
// call it, and its drop function runs when the graph is freed (after the backward, or when the graph is dropped
// unused).

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstddef>
#include <exception>
#include <mutex>
#include <string>
#include <utility>

#include "error_message.h"

extern "C" {
// Runs the segment on `x` (a handle the callee takes over) in `mode` (see `Mode`), storing a new handle the caller
// owns in `out`. Returns 0, or -1 with a NUL-terminated message of at most `error_len` bytes in `error`.
typedef int (*trinity_segment_run)(void* state, at::Tensor* x, int mode, at::Tensor** out, char* error,
                                   size_t error_len);
// Frees the segment's state.
typedef void (*trinity_segment_drop)(void* state);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

thread_local std::string last_error;

// How the closure runs, so it can choose what it records: the same numerics in the first forward as in the
// recomputation (attention's training path, LoRA's dropout), though only the second has autograd on.
enum Mode : int {
  kPlain = 0,      // autograd as the caller has it: not recomputed
  kFirst = 1,      // the checkpoint's forward, autograd off: behave as if recording
  kRecompute = 2,  // the backward's recomputation, autograd on
};

struct Segment : torch::CustomClassHolder {
  Segment(void* state, trinity_segment_run run, trinity_segment_drop drop) : state(state), run(run), drop(drop) {}
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment() override { drop(state); }

  at::Tensor call(const at::Tensor& x, Mode mode) const {
    char error[1024] = {0};
    at::Tensor* out = nullptr;
    int status = run(state, new at::Tensor(x), mode, &out, error, sizeof error);
    TORCH_CHECK(status == 0 && out != nullptr, error);
    at::Tensor y = std::move(*out);
    delete out;
    return y;
  }

  void* state;
  trinity_segment_run run;
  trinity_segment_drop drop;
  // The generator's state when the forward ran (undefined when its device has none).
  at::Tensor rng_state;
};

// The default generator of `device`, locked while `f` runs with it.
template <typename F>
void with_generator(const at::Device& device, F&& f) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  f(gen);
}

struct Checkpoint : public Function<Checkpoint> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<Segment> segment) {
    with_generator(x.device(), [&](at::Generator& gen) { segment->rng_state = gen.get_state(); });
    at::Tensor y = segment->call(x, kFirst);
    ctx->save_for_backward({x});
    ctx->saved_data["segment"] = c10::IValue::make_capsule(std::move(segment));
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto segment = c10::static_intrusive_pointer_cast<Segment>(ctx->saved_data["segment"].toCapsule());
    at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Tensor y;
    {
      at::AutoGradMode grad(true);
      at::Tensor now;
      with_generator(x.device(), [&](at::Generator& gen) {
        now = gen.get_state();
        gen.set_state(segment->rng_state);
      });
      try {
        y = segment->call(x, kRecompute);
      } catch (...) {
        with_generator(x.device(), [&](at::Generator& gen) { gen.set_state(now); });
        throw;
      }
      with_generator(x.device(), [&](at::Generator& gen) { gen.set_state(now); });
    }
    torch::autograd::backward({y}, {grads[0]});
    return {x.grad(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

const char* trinity_checkpoint_error() { return last_error.c_str(); }

// Whether autograd records on this thread (tch has no query for it).
int trinity_grad_mode_enabled() { return at::GradMode::is_enabled() ? 1 : 0; }

// Runs the segment `state` on `x`: recomputed in the backward when autograd records, as it is otherwise. Takes
// `state` over in every case (its `drop` runs once nothing can call it). Stores a new handle in `out`; returns 0,
// or -1 with the message in `trinity_checkpoint_error`.
int trinity_checkpoint(at::Tensor* x, void* state, trinity_segment_run run, trinity_segment_drop drop,
                       at::Tensor** out) {
  c10::intrusive_ptr<Segment> segment;
  try {
    segment = c10::make_intrusive<Segment>(state, run, drop);
  } catch (const std::exception& e) {
    drop(state);
    last_error = error_message(e);
    return -1;
  }
  try {
    if (!at::GradMode::is_enabled()) {
      *out = new at::Tensor(segment->call(*x, kPlain));
      return 0;
    }
    TORCH_CHECK(x->requires_grad(),
                "a recomputed segment's input must require grad, or nothing inside it would get one");
    *out = new at::Tensor(Checkpoint::apply(*x, std::move(segment)));
    return 0;
  } catch (const std::exception& e) {
    last_error = error_message(e);
    return -1;
  }
}

}  // extern "C"
