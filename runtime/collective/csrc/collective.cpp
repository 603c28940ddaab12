// C ABI over c10d's TCPStore, PrefixStore and ProcessGroupGloo (and ProcessGroupNCCL with TRINITY_NCCL), for the
// Rust crate trinity-collective.
//
// Conventions, relied on by src/ffi.rs:
// - Every function returns NULL on success or a heap string (malloc) describing the failure, which the caller
//   frees with trinity_collective_free_error. No C++ exception crosses this boundary: each body runs inside
//   `guard`, which turns std::exception (c10::Error derives from it) and anything else into that string.
// - Handles are opaque heap objects created here and freed by their *_free function; a NULL handle is an error,
//   never a crash.
// - Tensors arrive as `const at::Tensor*` (tch's C_tensor). The shim copies the handle, which shares storage with
//   the caller's tensor, so a collective writes into the caller's memory and keeps it alive until the work ends.
// - Only c10d types are named (never gloo's), so Debian's gloo headers need only agree with the wheel's gloo on
//   what ProcessGroupGloo.hpp itself declares.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef TRINITY_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace {

char* copy_message(const std::string& message) {
  char* out = static_cast<char*>(std::malloc(message.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, message.c_str(), message.size() + 1);
  }
  return out;
}

// c10::Error's what() carries a C++ backtrace after the message; the first line is what a user needs.
std::string first_lines(const char* what) {
  std::string text(what == nullptr ? "unknown error" : what);
  auto cut = text.find("\nException raised from");
  if (cut != std::string::npos) {
    text.resize(cut);
  }
  return text;
}

template <typename F>
char* guard(F&& body) {
  try {
    body();
    return nullptr;
  } catch (const c10::Error& e) {
    return copy_message(first_lines(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return copy_message(first_lines(e.what()));
  } catch (...) {
    return copy_message("unknown C++ exception");
  }
}

void require(bool ok, const char* what) {
  if (!ok) {
    throw std::invalid_argument(what);
  }
}

std::chrono::milliseconds millis(int64_t ms) {
  return std::chrono::milliseconds(ms);
}

// op: 0 = sum, 1 = max, 2 = min, 3 = product.
c10d::ReduceOp reduce_op(int op) {
  switch (op) {
    case 0:
      return c10d::ReduceOp::SUM;
    case 1:
      return c10d::ReduceOp::MAX;
    case 2:
      return c10d::ReduceOp::MIN;
    case 3:
      return c10d::ReduceOp::PRODUCT;
    default:
      throw std::invalid_argument("unknown reduce op");
  }
}

}  // namespace

struct TrinityStore {
  c10::intrusive_ptr<c10d::Store> store;
  // Set for a TCPStore (the port it listens on or connects to).
  uint16_t port = 0;
};

// One group, one backend per device type: what c10d::ProcessGroup does with setBackend(CPU, gloo) and
// setBackend(CUDA, nccl), without going through the dispatcher's c10d ops. Both backends meet on the same store
// (under "gloo/" and "nccl/") with the same ranks, and each keeps its own order of collectives, which every rank
// issues in the same order.
struct TrinityGroup {
  c10::intrusive_ptr<c10d::Backend> gloo;
  // CUDA tensors go to NCCL when the group has it (feature `nccl`); CPU tensors always to Gloo.
  c10::intrusive_ptr<c10d::Backend> nccl;
  std::chrono::milliseconds timeout;

  c10d::Backend& backend_for(const at::Tensor& t) {
    if (t.is_cuda() && nccl) {
      return *nccl;
    }
    return *gloo;
  }
};

struct TrinityWork {
  c10::intrusive_ptr<c10d::Work> work;
  // The tensors the work reads or writes, kept alive until it is freed.
  std::vector<at::Tensor> inputs;
  std::vector<std::vector<at::Tensor>> outputs;
};

extern "C" {

void trinity_collective_free_error(char* error) {
  std::free(error);
}

void trinity_collective_free_bytes(uint8_t* bytes) {
  std::free(bytes);
}

// --- stores ---------------------------------------------------------------------------------------------------

char* trinity_store_tcp(const char* host, uint16_t port, bool is_server, int64_t num_workers, int64_t timeout_ms,
                        TrinityStore** out) {
  return guard([&] {
    require(host != nullptr && out != nullptr, "null argument");
    c10d::TCPStoreOptions options;
    options.port = port;
    options.isServer = is_server;
    if (num_workers > 0) {
      options.numWorkers = static_cast<std::size_t>(num_workers);
    }
    // Workers join the store by themselves; rendezvous (with its own timeout and error) happens above it.
    options.waitWorkers = false;
    options.timeout = millis(timeout_ms);
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host), options);
    auto handle = std::make_unique<TrinityStore>();
    handle->port = tcp->getPort();
    handle->store = tcp;
    *out = handle.release();
  });
}

char* trinity_store_prefix(TrinityStore* base, const char* prefix, TrinityStore** out) {
  return guard([&] {
    require(base != nullptr && prefix != nullptr && out != nullptr, "null argument");
    auto handle = std::make_unique<TrinityStore>();
    handle->store = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), base->store);
    handle->port = base->port;
    *out = handle.release();
  });
}

void trinity_store_free(TrinityStore* store) {
  delete store;
}

uint16_t trinity_store_port(const TrinityStore* store) {
  return store == nullptr ? 0 : store->port;
}

char* trinity_store_set_timeout(TrinityStore* store, int64_t timeout_ms) {
  return guard([&] {
    require(store != nullptr, "null store");
    store->store->setTimeout(millis(timeout_ms));
  });
}

char* trinity_store_set(TrinityStore* store, const char* key, const uint8_t* data, size_t len) {
  return guard([&] {
    require(store != nullptr && key != nullptr && (data != nullptr || len == 0), "null argument");
    std::vector<uint8_t> value(data, data + len);
    store->store->set(std::string(key), value);
  });
}

// Blocks until the key exists (up to the store's timeout). The value is malloc'd; free it with
// trinity_collective_free_bytes.
char* trinity_store_get(TrinityStore* store, const char* key, uint8_t** data, size_t* len) {
  return guard([&] {
    require(store != nullptr && key != nullptr && data != nullptr && len != nullptr, "null argument");
    auto value = store->store->get(std::string(key));
    *len = value.size();
    *data = static_cast<uint8_t*>(std::malloc(value.empty() ? 1 : value.size()));
    require(*data != nullptr, "out of memory");
    if (!value.empty()) {
      std::memcpy(*data, value.data(), value.size());
    }
  });
}

char* trinity_store_add(TrinityStore* store, const char* key, int64_t delta, int64_t* out) {
  return guard([&] {
    require(store != nullptr && key != nullptr && out != nullptr, "null argument");
    *out = store->store->add(std::string(key), delta);
  });
}

char* trinity_store_compare_set(TrinityStore* store, const char* key, const uint8_t* expected, size_t expected_len,
                                const uint8_t* desired, size_t desired_len, uint8_t** data, size_t* len) {
  return guard([&] {
    require(store != nullptr && key != nullptr && data != nullptr && len != nullptr, "null argument");
    require((expected != nullptr || expected_len == 0) && (desired != nullptr || desired_len == 0), "null value");
    std::vector<uint8_t> e(expected, expected + expected_len);
    std::vector<uint8_t> d(desired, desired + desired_len);
    auto value = store->store->compareSet(std::string(key), e, d);
    *len = value.size();
    *data = static_cast<uint8_t*>(std::malloc(value.empty() ? 1 : value.size()));
    require(*data != nullptr, "out of memory");
    if (!value.empty()) {
      std::memcpy(*data, value.data(), value.size());
    }
  });
}

char* trinity_store_check(TrinityStore* store, const char* const* keys, size_t n, bool* out) {
  return guard([&] {
    require(store != nullptr && (keys != nullptr || n == 0) && out != nullptr, "null argument");
    std::vector<std::string> names(keys, keys + n);
    *out = store->store->check(names);
  });
}

char* trinity_store_wait(TrinityStore* store, const char* const* keys, size_t n, int64_t timeout_ms) {
  return guard([&] {
    require(store != nullptr && (keys != nullptr || n == 0), "null argument");
    std::vector<std::string> names(keys, keys + n);
    store->store->wait(names, millis(timeout_ms));
  });
}

char* trinity_store_delete(TrinityStore* store, const char* key, bool* out) {
  return guard([&] {
    require(store != nullptr && key != nullptr && out != nullptr, "null argument");
    *out = store->store->deleteKey(std::string(key));
  });
}

// --- process groups -------------------------------------------------------------------------------------------

// device_kind: 0 = the address of `device_name` (a host name or IP), 1 = the network interface `device_name`,
// 2 = this machine's host name, falling back to loopback (Gloo's default).
char* trinity_group_new(TrinityStore* store, int rank, int size, int64_t timeout_ms, int device_kind,
                        const char* device_name, int threads, bool nccl, TrinityGroup** out) {
  return guard([&] {
    require(store != nullptr && out != nullptr, "null argument");
    auto options = c10d::ProcessGroupGloo::Options::create(millis(timeout_ms));
    std::string name(device_name == nullptr ? "" : device_name);
    switch (device_kind) {
      case 0:
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(name));
        break;
      case 1:
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
        break;
      default:
        options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
        break;
    }
    if (threads > 0) {
      options->threads = threads;
    }
    auto handle = std::make_unique<TrinityGroup>();
    handle->timeout = millis(timeout_ms);
    auto gloo_store = c10::make_intrusive<c10d::PrefixStore>("gloo/", store->store);
    handle->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(gloo_store, rank, size, options);
    if (nccl) {
#ifdef TRINITY_NCCL
      // Checked here rather than left to ProcessGroupNCCL, so that a machine without a GPU (or without the driver)
      // gets one clear message on every rank.
      if (c10::cuda::device_count() == 0) {
        throw std::runtime_error(
            "NCCL needs a CUDA device and this process sees none (no GPU, no NVIDIA driver, or CUDA_VISIBLE_DEVICES "
            "hides them); leave NCCL off to use Gloo, which serves CUDA tensors through host memory");
      }
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = millis(timeout_ms);
      auto nccl_store = c10::make_intrusive<c10d::PrefixStore>("nccl/", store->store);
      handle->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(nccl_store, rank, size, nccl_options);
#else
      throw std::invalid_argument("NCCL requested but trinity-collective was built without the `nccl` feature");
#endif
    }
    *out = handle.release();
  });
}

void trinity_group_free(TrinityGroup* group) {
  delete group;
}

bool trinity_group_has_nccl(const TrinityGroup* group) {
  return group != nullptr && static_cast<bool>(group->nccl);
}

char* trinity_group_broadcast(TrinityGroup* group, const at::Tensor* tensor, int root, int64_t timeout_ms,
                              TrinityWork** out) {
  return guard([&] {
    require(group != nullptr && tensor != nullptr && out != nullptr, "null argument");
    auto work = std::make_unique<TrinityWork>();
    work->inputs.push_back(tensor->detach());
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.rootTensor = 0;
    options.timeout = millis(timeout_ms);
    work->work = group->backend_for(*tensor).broadcast(work->inputs, options);
    *out = work.release();
  });
}

char* trinity_group_allreduce(TrinityGroup* group, const at::Tensor* tensor, int op, int64_t timeout_ms,
                              TrinityWork** out) {
  return guard([&] {
    require(group != nullptr && tensor != nullptr && out != nullptr, "null argument");
    auto work = std::make_unique<TrinityWork>();
    work->inputs.push_back(tensor->detach());
    c10d::AllreduceOptions options;
    options.reduceOp = reduce_op(op);
    options.timeout = millis(timeout_ms);
    work->work = group->backend_for(*tensor).allreduce(work->inputs, options);
    *out = work.release();
  });
}

// `outputs` holds one tensor per rank, each shaped like `input`.
char* trinity_group_allgather(TrinityGroup* group, const at::Tensor* input, const at::Tensor* const* outputs,
                              size_t n, int64_t timeout_ms, TrinityWork** out) {
  return guard([&] {
    require(group != nullptr && input != nullptr && outputs != nullptr && out != nullptr, "null argument");
    auto work = std::make_unique<TrinityWork>();
    work->inputs.push_back(input->detach());
    std::vector<at::Tensor> gathered;
    gathered.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      require(outputs[i] != nullptr, "null output tensor");
      gathered.push_back(outputs[i]->detach());
    }
    work->outputs.push_back(std::move(gathered));
    c10d::AllgatherOptions options;
    options.timeout = millis(timeout_ms);
    work->work = group->backend_for(*input).allgather(work->outputs, work->inputs, options);
    *out = work.release();
  });
}

// Flat reduce-scatter (c10d's `_reduce_scatter_base`, torch's `reduce_scatter_tensor`): `input` holds `size`
// equal chunks, rank r's `output` (one chunk's numel, same dtype) receives the reduction of every rank's chunk r.
char* trinity_group_reduce_scatter_flat(TrinityGroup* group, const at::Tensor* output, const at::Tensor* input,
                                        int op, int64_t timeout_ms, TrinityWork** out) {
  return guard([&] {
    require(group != nullptr && input != nullptr && output != nullptr && out != nullptr, "null argument");
    auto work = std::make_unique<TrinityWork>();
    work->inputs.push_back(input->detach());
    work->outputs.push_back({output->detach()});
    c10d::ReduceScatterOptions options;
    options.reduceOp = reduce_op(op);
    options.timeout = millis(timeout_ms);
    work->work = group->backend_for(*input)._reduce_scatter_base(work->outputs[0][0], work->inputs[0], options);
    *out = work.release();
  });
}

// Flat all-gather (c10d's `_allgather_base`, torch's `all_gather_into_tensor`): `output` (`size` times `input`'s
// numel, same dtype) receives every rank's `input` in rank order.
char* trinity_group_allgather_flat(TrinityGroup* group, const at::Tensor* output, const at::Tensor* input,
                                   int64_t timeout_ms, TrinityWork** out) {
  return guard([&] {
    require(group != nullptr && input != nullptr && output != nullptr && out != nullptr, "null argument");
    auto work = std::make_unique<TrinityWork>();
    work->inputs.push_back(input->detach());
    work->outputs.push_back({output->detach()});
    c10d::AllgatherOptions options;
    options.timeout = millis(timeout_ms);
    work->work = group->backend_for(*input)._allgather_base(work->outputs[0][0], work->inputs[0], options);
    *out = work.release();
  });
}

char* trinity_group_barrier(TrinityGroup* group, int64_t timeout_ms, TrinityWork** out) {
  return guard([&] {
    require(group != nullptr && out != nullptr, "null argument");
    auto work = std::make_unique<TrinityWork>();
    c10d::BarrierOptions options;
    options.timeout = millis(timeout_ms);
    work->work = group->gloo->barrier(options);
    *out = work.release();
  });
}

// Waits for the work up to `timeout_ms`; a work that failed or did not finish in time is an error.
char* trinity_work_wait(TrinityWork* work, int64_t timeout_ms) {
  return guard([&] {
    require(work != nullptr && work->work, "null work");
    work->work->wait(millis(timeout_ms));
  });
}

bool trinity_work_is_completed(TrinityWork* work) {
  if (work == nullptr || !work->work) {
    return true;
  }
  try {
    return work->work->isCompleted();
  } catch (...) {
    return true;
  }
}

void trinity_work_free(TrinityWork* work) {
  delete work;
}

}  // extern "C"
