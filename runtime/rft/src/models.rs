//! Loading models for the explorer's engine and the trainer, and the libtorch thread discipline both follow.
//!
//! Exploring and training alternate in mode `both`, each on a libtorch thread pool: the engine's on its own
//! thread, the trainer's on a thread that lives for one train step ([`on_pool`]; loading too). The calling thread
//! (buffer, checkpoints) stays single-threaded, so that while the engine decodes its pool is the only one alive:
//! with more pool threads than CPUs libgomp stops spinning between parallel regions and every region of a decode
//! step wakes its workers through the kernel (measured by `trinity generate`: a quarter of decode throughput).

use std::path::Path;

use tch::Kind;
use trinity_config::Config;
use trinity_model::{ChatTemplate, LoadedModel};

use crate::error::RftError;

/// Runs `work` on a thread of its own with `threads` libtorch threads, and waits for it. The thread's OpenMP pool
/// ends with it, so between calls only the engine's pool is alive. A panic in `work` is re-raised here.
pub(crate) fn on_pool<T: Send>(threads: usize, work: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        let handle = scope.spawn(move || {
            tch::set_num_threads(i32::try_from(threads).unwrap_or(i32::MAX));
            work()
        });
        handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Loads `path` on a libtorch pool of `threads` threads.
pub(crate) fn load(path: &Path, kind: Kind, device: tch::Device, threads: usize) -> Result<LoadedModel, RftError> {
    on_pool(threads, || trinity_model::load_model(path, kind, device)).map_err(|e| model_error(path, e))
}

/// The chat template a run renders with: `model.chat_template_path` or `model.custom_chat_template` when set,
/// else the model's own (taken out of `model`).
pub(crate) fn chat_template(config: &Config, model: &mut LoadedModel) -> Result<Option<ChatTemplate>, RftError> {
    let path = Path::new(&config.model.model_path);
    let (bos, eos) = (model.tokenizer.bos_token(), model.tokenizer.eos_token());
    if let Some(file) = &config.model.chat_template_path {
        return ChatTemplate::from_file(Path::new(file), bos, eos).map(Some).map_err(|e| model_error(path, e));
    }
    match &config.model.custom_chat_template {
        Some(source) => ChatTemplate::new(source, bos, eos).map(Some).map_err(|e| model_error(path, e)),
        None => Ok(model.chat_template.take()),
    }
}

/// The policy's parameter dtype: bf16 parameters make the trainer run mixed precision (bf16 compute, fp32 masters
/// in the optimizer); `auto` picks it where bf16 is fast.
pub(crate) fn trainer_kind(dtype: &str, device: tch::Device) -> Kind {
    match dtype {
        "float32" | "fp32" => Kind::Float,
        "bfloat16" | "bf16" => Kind::BFloat16,
        _ if trinity_model::fast_bf16(device) => Kind::BFloat16,
        _ => Kind::Float,
    }
}

/// The rollout engine's weight dtype. `bfloat16` (Trinity-RFT's default, sized for GPUs) and `auto` are bf16
/// where the device computes bf16 natively; elsewhere (a CPU without AVX512-BF16 or AMX) libtorch emulates bf16
/// far slower than fp32, so the engine keeps fp32 weights, as the trainer's `auto` precision does, and says so.
pub(crate) fn engine_kind(dtype: &str, device: tch::Device) -> Kind {
    match dtype {
        "float32" | "fp32" => Kind::Float,
        "float16" | "fp16" => Kind::Half,
        _ if trinity_model::fast_bf16(device) => Kind::BFloat16,
        _ => {
            tracing::info!(
                "explorer.rollout_model.dtype `{dtype}`: this CPU has no native bf16, so rollouts run with fp32 weights"
            );
            Kind::Float
        }
    }
}

/// The KV cache's memory budget on a CPU: a quarter of the memory available at start, as Trinity-RFT caps a
/// colocated engine's `gpu_memory_utilization` at 0.25, because the trainer shares the same memory. Without it a
/// long `max_model_len` (11264 in mix_math) times `runner_per_model × repeat_times` slots asked for more than the
/// machine has; with it the engine runs fewer sequences at once. On CUDA the engine allocates every slot.
pub(crate) fn cpu_kv_budget(device: tch::Device) -> Option<u64> {
    if device != tch::Device::Cpu {
        return None;
    }
    trinity_trainer::micro_batch::available_memory().map(|bytes| bytes / 4)
}

/// The device every model of the run goes on (CUDA when there is one).
pub(crate) fn device(model_path: &Path) -> Result<tch::Device, RftError> {
    let device = trinity_model::select_device(trinity_model::DeviceRequest::Auto)
        .map_err(|source| model_error(model_path, source))?;
    if device == tch::Device::Cpu {
        tracing::info!("no CUDA device: running on the CPU");
    }
    Ok(device)
}

/// The device of a data-parallel rank: its own GPU, `cuda:LOCAL_RANK` (as under torchrun), or the CPU; a local rank
/// past the GPUs this process sees is an error naming `LOCAL_RANK`.
pub(crate) fn device_for_rank(model_path: &Path, env: &trinity_collective::DistEnv) -> Result<tch::Device, RftError> {
    let auto = device(model_path)?;
    let visible = if auto.is_cuda() { usize::try_from(tch::Cuda::device_count()).unwrap_or(0) } else { 0 };
    Ok(env.rank_device(auto, visible)?)
}

pub(crate) fn model_error(path: &Path, source: trinity_model::ModelError) -> RftError {
    RftError::Model { path: path.display().to_string(), source }
}
