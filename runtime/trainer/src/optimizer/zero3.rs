//! ZeRO stage 3 (FSDP's full sharding, `reshard_after_forward: true`): parameters, gradients and AdamW's state
//! are all split over the data-parallel ranks, and a layer's parameters are whole only between the gather before
//! it computes and the free after.
//!
//! **Units.** Each decoder layer (parameters named `model.layers.N.…`) is one unit, and every other parameter
//! (embedding, final norm, head) is one outer unit. A unit's parameters, flattened and concatenated in order, form
//! its flat vector, padded with zeros to `world · ⌈numel/world⌉`; rank r owns chunk r in the compute dtype (the
//! shard the gathers send) and AdamW's fp32 state for it (moments, and a master when the compute dtype is not
//! fp32). The layout depends only on the parameters' names, order, dtypes and sizes, so ranks agree on it without
//! talking. Between passes a rank holds its shards and no whole parameter: the model's parameter tensors are
//! emptied (`set_data` to an empty tensor, as FSDP frees storage) and pointed at a gathered buffer for a pass.
//!
//! The outer unit is gathered at the start of a pass and kept whole until its end, not gathered like a layer: the
//! embedding's and the head's autograd graph outside the recomputed layers keeps them (the embedding's backward
//! and the trainer's chunked head read them after the last layer's backward), and with tied embeddings they are
//! one tensor that both ends of the model use.
//!
//! **A pass** ([`FullShard::pass`]) is one forward, and in a training pass its backward, of the decoder with
//! the layer hook of [`trinity_model::layer_hook`] set:
//! - forward: `before(i, Forward)` waits for layer i's gather (started while layer i−1 computed, or now) and
//!   starts layer i+1's, so a layer's transfer overlaps the previous layer's compute; `after_forward(i)` frees it;
//! - backward (the decoder must recompute its layers, so a forward keeps nothing of a freed layer):
//!   `before(i, Recompute)` tells that layer i+1's backward ended: its gradients (widened to fp32, zeros where
//!   none) are reduce-scattered into the owner's fp32 gradient shard and released, its parameters freed; then layer
//!   i is gathered (prefetched by layer i+1's recomputation) and layer i−1's gather started;
//! - after the pass layer 0's and the outer unit's gradients are reduce-scattered and everything is freed.
//!
//! Gradients of several passes (micro-batches) add up in the shards. A rank with fewer micro-batches than another
//! must still take part in every collective, in the same order: [`FullShard::idle_pass`] issues a pass's
//! collectives without computing, its gradients zeros.
//!
//! **A step** ([`FullShard::step`]) clips by the global norm (each rank's sum of squares of its shards, summed
//! over the ranks) and updates only the kept shards; no gather follows, the next pass gathers the new values.
//! A unit takes the update even when none of its parameters had a gradient anywhere (its gradient is then zeros),
//! which a decoder whose every parameter takes part in the loss never sees.
//!
//! **A frozen model** ([`FullShard::frozen`], the KL reference) is laid out and gathered the same way, with no
//! gradient shards and no optimizer state: it runs only forward-only passes (and their idle ones), so between them
//! a rank holds `1/world` of it.
//!
//! **Outside a pass**: [`FullShard::gather_whole`] makes each unit whole in turn, one unit at a time (for the HF
//! export, a weight sync bucket by bucket, a test); [`FullShard::save`] writes AdamW's one-process state file
//! from rank 0 (world-size independent) and [`FullShard::load`] reads one on any number of ranks.
//!
//! The collectives of Gloo through our binding are asynchronous (c10d's work objects, run on Gloo's threads), so
//! the prefetch does overlap. The hook drives the process group from the thread the autograd engine runs the
//! recomputation on; the group is not used concurrently (the hook's state is behind one lock).

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};

use tch::{Device, Kind, Tensor};
use trinity_collective::{ProcessGroup, ReduceOp, Work};
use trinity_model::layer_hook::{LayerHook, LayerRun, with_layer_hook};

use super::{AdamW, AdamWSettings};
use crate::error::{Result, TrainerError};

fn fail(message: impl Into<String>) -> TrainerError {
    TrainerError::DataParallel(format!("ZeRO stage 3: {}", message.into()))
}

/// The decoder layer a parameter belongs to, from its HF name.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?.split('.').next()?.parse().ok()
}

/// One unit of the layout: a decoder layer's parameters, or the outer ones.
#[derive(Debug)]
struct Unit {
    label: String,
    names: Vec<String>,
    /// Handles sharing the model's parameter tensors.
    vars: Vec<Tensor>,
    shapes: Vec<Vec<i64>>,
    offsets: Vec<i64>,
    numel: i64,
    /// Elements per rank: `⌈numel / world⌉`.
    chunk: i64,
    kind: Kind,
    device: Device,
}

impl Unit {
    fn share(&self) -> Unit {
        Unit {
            label: self.label.clone(),
            names: self.names.clone(),
            vars: self.vars.iter().map(Tensor::shallow_clone).collect(),
            shapes: self.shapes.clone(),
            offsets: self.offsets.clone(),
            numel: self.numel,
            chunk: self.chunk,
            kind: self.kind,
            device: self.device,
        }
    }

    /// Points every parameter at its elements of the gathered flat vector `full`.
    fn attach(&self, full: &Tensor) -> Result<()> {
        for ((var, shape), &offset) in self.vars.iter().zip(&self.shapes).zip(&self.offsets) {
            let n: i64 = shape.iter().product();
            var.shallow_clone().f_set_data(&full.f_narrow(0, offset, n)?.f_view(shape.as_slice())?)?;
        }
        Ok(())
    }

    /// Empties every parameter (its storage goes once nothing else holds the gathered buffer).
    fn release(&self) -> Result<()> {
        for var in &self.vars {
            var.shallow_clone().f_set_data(&Tensor::f_empty([0], (self.kind, self.device))?)?;
        }
        Ok(())
    }

    /// `parts` (one tensor per parameter, any shape with its element count) flattened, as `kind`, padded to
    /// `world` chunks: one buffer, each part converted as it is copied in.
    fn flat(&self, parts: &[Tensor], kind: Kind, world: usize) -> Result<Tensor> {
        let device = parts.first().map_or(self.device, Tensor::device);
        let total = self.chunk * world as i64;
        let flat = Tensor::f_empty([total], (kind, device))?;
        tch::no_grad(|| -> Result<()> {
            for (t, &offset) in parts.iter().zip(&self.offsets) {
                let n = t.numel() as i64;
                flat.f_narrow(0, offset, n)?.f_copy_(&t.f_reshape([-1])?)?;
            }
            if total > self.numel {
                let _ = flat.f_narrow(0, self.numel, total - self.numel)?.f_zero_()?;
            }
            Ok(())
        })?;
        Ok(flat)
    }
}

/// Bytes a rank holds under stage 3 between passes, and at most during one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FullShardMemory {
    /// The rank's parameter shards, in the compute dtype.
    pub parameter_shards: i64,
    /// The rank's fp32 gradient shards (while a mini-batch's gradients are held).
    pub gradient_shards: i64,
    /// AdamW's moments and masters of the shards.
    pub optimizer_state: i64,
    /// The largest three units' whole parameters: what a pass holds at once besides the shards (two layers and a
    /// prefetch, the outer unit), an upper bound.
    pub pass_parameters: i64,
}

/// Where a rank's passes spent their time on collectives, summed since the sharding began: what the prefetch
/// and the in-flight reduce-scatters fail to hide shows as waiting.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PassSeconds {
    /// Waiting for layers' and the outer unit's gathers (after prefetch, the part not overlapped).
    pub gather_wait: f64,
    /// Packing gradients into fp32 flat buffers for the reduce-scatters.
    pub scatter_pack: f64,
    /// Waiting for reduce-scatters to land.
    pub scatter_wait: f64,
}

/// A policy's parameters fully sharded over a process group (see the module docs).
#[derive(Debug)]
pub struct FullShard {
    rank: usize,
    world: usize,
    /// Decoder layers first (unit i is layer i), the outer unit last.
    units: Vec<Unit>,
    /// One parameter per unit: its flat shard in the compute dtype, `shard` set to all of it (frozen: no state).
    optimizer: AdamW,
    /// Per unit: the rank's fp32 gradient shard accumulated over the passes since the last step.
    grads: Vec<Option<Tensor>>,
    /// A frozen model's layout ([`FullShard::frozen`]): forward-only passes, no step.
    frozen: bool,
    /// Whether a pass starts the next layer's gather while a layer computes ([`FullShard::set_prefetch`]).
    prefetch: bool,
    seconds: PassSeconds,
}

impl FullShard {
    /// Turns the gather of the next layer during a layer's computation on (the default) or off (each layer
    /// gathered when it is about to compute), to measure what the overlap saves. Every rank must agree.
    pub fn set_prefetch(&mut self, on: bool) {
        self.prefetch = on;
    }

    /// Shards `params` (the policy's trainable parameters, identical on every rank: broadcast them first) of a
    /// decoder with `layers` layers over `group`, and frees the whole parameters.
    pub fn new(
        params: Vec<(String, Tensor)>,
        layers: usize,
        settings: AdamWSettings,
        offload: bool,
        group: &ProcessGroup,
    ) -> Result<FullShard> {
        let (units, shards) = shard_units(params, layers, group)?;
        let mut optimizer = AdamW::deferred(shards, settings, offload)?;
        tch::no_grad(|| -> Result<()> {
            for p in &mut optimizer.params {
                let home = if offload { Device::Cpu } else { p.var.device() };
                let len = p.var.numel() as i64;
                p.exp_avg = Tensor::f_zeros([len], (Kind::Float, home))?;
                p.exp_avg_sq = Tensor::f_zeros([len], (Kind::Float, home))?;
                p.master = match p.var.kind() {
                    Kind::Float => None,
                    _ => Some(p.var.f_to_kind(Kind::Float)?.f_to_device(home)?),
                };
                p.shard = Some(0..len);
            }
            Ok(())
        })?;
        optimizer.deferred = false;
        Ok(Self::of(group, units, optimizer, false))
    }

    /// Shards a frozen model's `params` (the KL reference's, identical on every rank) the same way, without
    /// gradients or optimizer state: its passes are forward-only, gathered per layer as the policy's are, so a
    /// rank holds `1/world` of it between passes instead of a whole copy.
    pub fn frozen(params: Vec<(String, Tensor)>, layers: usize, group: &ProcessGroup) -> Result<FullShard> {
        let (units, shards) = shard_units(params, layers, group)?;
        let settings = AdamWSettings { betas: [0.9, 0.999], eps: 1e-8, weight_decay: 0.0 };
        // Only a holder of the shards: a frozen layout never materialises, steps, saves or loads a state.
        let optimizer = AdamW::deferred(shards, settings, false)?;
        Ok(Self::of(group, units, optimizer, true))
    }

    fn of(group: &ProcessGroup, units: Vec<Unit>, optimizer: AdamW, frozen: bool) -> FullShard {
        let grads = (0..units.len()).map(|_| None).collect();
        let (rank, world) = (group.rank(), group.world_size());
        FullShard { rank, world, units, optimizer, grads, frozen, prefetch: true, seconds: PassSeconds::default() }
    }

    /// Whether this layout shards a frozen model ([`FullShard::frozen`]).
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    fn trained(&self, what: &str) -> Result<()> {
        match self.frozen {
            true => Err(fail(format!("{what}: the sharded model is frozen (it has no gradients or optimizer state)"))),
            false => Ok(()),
        }
    }

    /// Decoder layers in the layout.
    pub fn layers(&self) -> usize {
        self.units.len() - 1
    }

    /// The AdamW over the rank's shards (one entry a unit).
    pub fn optimizer(&self) -> &AdamW {
        &self.optimizer
    }

    /// Time the passes spent on collectives so far (see [`PassSeconds`]).
    pub fn pass_seconds(&self) -> PassSeconds {
        self.seconds
    }

    /// What this rank holds (see [`FullShardMemory`]).
    pub fn memory(&self) -> FullShardMemory {
        let bytes = |t: &Tensor| (t.numel() * t.kind().elt_size_in_bytes()) as i64;
        let mut whole: Vec<i64> = self.units.iter().map(|u| u.numel * u.kind.elt_size_in_bytes() as i64).collect();
        whole.sort_unstable_by(|a, b| b.cmp(a));
        FullShardMemory {
            parameter_shards: self.optimizer.params.iter().map(|p| bytes(&p.var)).sum(),
            gradient_shards: self.grads.iter().flatten().map(bytes).sum(),
            optimizer_state: 4 * self.optimizer.state_elements(),
            pass_parameters: whole.iter().take(3).sum(),
        }
    }

    /// Runs `f`, one forward of the decoder (and in a training pass, `train`, its backward: the decoder must
    /// recompute its layers, and no graph may outlive the pass) with the layers gathered around their computations
    /// (see the module docs); a forward-only pass runs `f` without autograd. Every rank runs the same passes in the
    /// same order; one with nothing to compute runs [`FullShard::idle_pass`].
    pub fn pass<R>(&mut self, group: &ProcessGroup, train: bool, f: impl FnOnce() -> R) -> Result<R> {
        if train {
            self.trained("a training pass")?;
        }
        let hook = Arc::new(Hook(Mutex::new(self.engine(group, train))));
        let opened = hook.with(|e| e.gather(e.outer()));
        let out = match opened {
            // A forward-only pass keeps no graph: one kept past the pass would read freed parameters.
            Ok(()) if !train => Some(with_layer_hook(hook.clone(), || tch::no_grad(f))),
            Ok(()) => Some(with_layer_hook(hook.clone(), f)),
            Err(e) => {
                self.close(&hook);
                return Err(e);
            }
        };
        let finished = hook.with(Engine::finish);
        self.close(&hook);
        finished?;
        out.ok_or_else(|| fail("the pass did not run"))
    }

    /// A pass's collectives without its computation, for a rank with fewer micro-batches than another: the layers
    /// are gathered and freed as a forward (and in a training pass, `train`, its backward) would, and zero
    /// gradients are reduced.
    pub fn idle_pass(&mut self, group: &ProcessGroup, train: bool) -> Result<()> {
        if train {
            self.trained("a training pass")?;
        }
        let hook = Hook(Mutex::new(self.engine(group, train)));
        let layers = self.layers();
        let run = || -> Result<()> {
            hook.with(|e| e.gather(e.outer()))?;
            for i in 0..layers {
                hook.with(|e| e.before(i, LayerRun::Forward))?;
                hook.with(|e| e.after_forward(i))?;
            }
            if train {
                for i in (0..layers).rev() {
                    hook.with(|e| e.before(i, LayerRun::Recompute))?;
                }
            }
            hook.with(Engine::finish)
        };
        let result = run();
        self.close(&hook);
        result
    }

    fn engine(&mut self, group: &ProcessGroup, train: bool) -> Engine {
        let n = self.units.len();
        Engine {
            group: group as *const ProcessGroup,
            world: self.world,
            units: self.units.iter().map(Unit::share).collect(),
            shards: self.optimizer.params.iter().map(|p| p.var.shallow_clone()).collect(),
            whole: vec![false; n],
            gathering: VecDeque::new(),
            scattering: None,
            grads: std::mem::take(&mut self.grads),
            forwards: vec![0; n],
            recomputes: vec![0; n],
            train,
            prefetch: self.prefetch,
            seconds: self.seconds,
        }
    }

    /// Ends a pass whatever happened: waits for the collectives still in flight, frees every unit, takes the
    /// gradient shards back, and closes the hook (a graph that outlives the pass and calls it gets an error).
    fn close(&mut self, hook: &Hook) {
        let mut guard = hook.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let e = &mut *guard;
        e.drain();
        for (unit, whole) in e.units.iter().zip(&mut e.whole) {
            if std::mem::take(whole)
                && let Err(err) = unit.release()
            {
                tracing::error!("ZeRO stage 3: freeing {} failed: {err}", unit.label);
            }
        }
        self.grads = std::mem::take(&mut e.grads);
        self.grads.resize_with(self.units.len(), || None);
        self.seconds = e.seconds;
        e.group = std::ptr::null();
    }

    /// One optimizer step from the gradient shards of the passes since the last: clipped to `max_norm` by the
    /// global norm and applied with learning rate `lr` unless the norm is not finite. Returns the norm.
    pub fn step(&mut self, group: &ProcessGroup, max_norm: f64, lr: f64) -> Result<f64> {
        self.trained("an optimizer step")?;
        for (p, g) in self.optimizer.params.iter_mut().zip(&mut self.grads) {
            p.shard_grad = g.take();
        }
        let mut squares = Tensor::from_slice(&[self.optimizer.grad_sum_of_squares()?]);
        group.allreduce(&mut squares, ReduceOp::Sum)?;
        let norm = squares.f_double_value(&[0])?.sqrt();
        self.optimizer.clip_to(norm, max_norm)?;
        if norm.is_finite() {
            self.optimizer.step(lr)?;
        }
        for p in &mut self.optimizer.params {
            p.shard_grad = None;
        }
        Ok(norm)
    }

    /// Makes each unit whole in turn (a collective: every rank calls it, outside a pass) and calls `f` with its
    /// parameters' names and whole values, which are freed again after: at most one unit is whole at a time.
    pub fn gather_whole(
        &self,
        group: &ProcessGroup,
        mut f: impl FnMut(&[(String, Tensor)]) -> Result<()>,
    ) -> Result<()> {
        for (unit, p) in self.units.iter().zip(&self.optimizer.params) {
            let full = Tensor::f_empty([unit.chunk * self.world as i64], (unit.kind, unit.device))?;
            group.allgather_flat_async(&p.var, &full)?.wait()?;
            unit.attach(&full)?;
            let named: Vec<(String, Tensor)> =
                unit.names.iter().cloned().zip(unit.vars.iter().map(Tensor::shallow_clone)).collect();
            let result = f(&named);
            unit.release()?;
            result?;
        }
        Ok(())
    }

    /// The whole parameters' names, dtypes and shapes, in the order [`FullShard::gather_whole`] makes them whole.
    pub fn layout(&self) -> Vec<trinity_model::TensorSpec> {
        let units = self.units.iter();
        units
            .flat_map(|u| {
                u.names.iter().zip(&u.shapes).map(|(name, shape)| trinity_model::TensorSpec {
                    name: name.clone(),
                    kind: u.kind,
                    shape: shape.clone(),
                })
            })
            .collect()
    }

    /// Writes AdamW's state in [`AdamW::save`]'s one-process format from rank 0, gathering it unit by unit (a
    /// collective: every rank calls it). Any world size loads it.
    pub fn save(&self, group: &ProcessGroup, path: &Path) -> Result<()> {
        self.trained("saving the optimizer state")?;
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        for (unit, p) in self.units.iter().zip(&self.optimizer.params) {
            let mut parts = vec![("exp_avg", &p.exp_avg), ("exp_avg_sq", &p.exp_avg_sq)];
            if let Some(m) = &p.master {
                parts.push(("master", m));
            }
            for (key, shard) in parts {
                let full = Tensor::f_empty([unit.chunk * self.world as i64], (Kind::Float, shard.device()))?;
                group.allgather_flat_async(shard, &full)?.wait()?;
                if self.rank != 0 {
                    continue;
                }
                for ((name, shape), &offset) in unit.names.iter().zip(&unit.shapes).zip(&unit.offsets) {
                    let n: i64 = shape.iter().product();
                    let t = full.f_narrow(0, offset, n)?.f_view(shape.as_slice())?.f_to_device(Device::Cpu)?.copy();
                    tensors.push((format!("{key}/{name}"), t));
                }
            }
        }
        if self.rank == 0 {
            tensors.push(("step".to_owned(), Tensor::from_slice(&[self.optimizer.step])));
            trinity_model::write_safetensors(path, &tensors)?;
        }
        Ok(())
    }

    /// Restores a state written by [`AdamW::save`] (or [`FullShard::save`], on any world size) for the same
    /// parameters: every rank reads the file and keeps its chunks; a mixed-precision parameter's shard is set from
    /// its saved master (an fp32 parameter's values are the model's, loaded with its weights).
    pub fn load(&mut self, path: &Path) -> Result<()> {
        self.trained("loading an optimizer state")?;
        let bad = |problem: String| TrainerError::OptimizerState { path: path.to_path_buf(), problem };
        let mut saved: HashMap<String, Tensor> = Tensor::read_safetensors(path)?.into_iter().collect();
        let step = saved.remove("step").ok_or_else(|| bad("no `step` entry".into()))?.f_int64_value(&[0])?;
        let world = self.world;
        let rank = self.rank as i64;
        tch::no_grad(|| -> Result<()> {
            for (unit, p) in self.units.iter().zip(&mut self.optimizer.params) {
                let mut chunk_of = |key: &str| -> Result<Tensor> {
                    let mut parts = Vec::with_capacity(unit.names.len());
                    for (name, shape) in unit.names.iter().zip(&unit.shapes) {
                        let entry = format!("{key}/{name}");
                        let t = saved.remove(&entry).ok_or_else(|| bad(format!("no entry `{entry}`")))?;
                        if t.size() != *shape {
                            return Err(bad(format!("`{entry}` has shape {:?}, the parameter {shape:?}", t.size())));
                        }
                        parts.push(t);
                    }
                    Ok(unit.flat(&parts, Kind::Float, world)?.f_narrow(0, rank * unit.chunk, unit.chunk)?.copy())
                };
                let (avg, avg_sq) = (chunk_of("exp_avg")?, chunk_of("exp_avg_sq")?);
                p.exp_avg.f_copy_(&avg)?;
                p.exp_avg_sq.f_copy_(&avg_sq)?;
                if let Some(master) = &mut p.master {
                    let m = chunk_of("master")?;
                    master.f_copy_(&m)?;
                    p.var.f_copy_(&m)?;
                }
            }
            Ok(())
        })?;
        if let Some(extra) = saved.keys().next() {
            return Err(bad(format!("entry `{extra}` matches no parameter")));
        }
        self.optimizer.step = step;
        Ok(())
    }
}

/// Each unit's label and the rank's flat shard of it.
type NamedShards = Vec<(String, Tensor)>;

/// The layout of `params` over `group` (decoder layers first, the outer unit last) and the rank's shard of each
/// unit; the whole parameters are freed.
fn shard_units(params: Vec<(String, Tensor)>, layers: usize, group: &ProcessGroup) -> Result<(Vec<Unit>, NamedShards)> {
    let (rank, world) = (group.rank(), group.world_size());
    let mut members: Vec<Vec<(String, Tensor)>> = (0..=layers).map(|_| Vec::new()).collect();
    for (name, t) in params {
        let unit = layer_of(&name).filter(|&i| i < layers).unwrap_or(layers);
        members[unit].push((name, t));
    }
    let mut units = Vec::with_capacity(layers + 1);
    for (i, params) in members.into_iter().enumerate() {
        let label = if i < layers { format!("model.layers.{i}") } else { "outer".to_owned() };
        let Some((_, first)) = params.first() else {
            return Err(fail(format!("unit {label} has no parameter to shard (is this a LoRA policy's adapters?)")));
        };
        let (kind, device) = (first.kind(), first.device());
        if let Some((name, t)) = params.iter().find(|(_, t)| t.kind() != kind || t.device() != device) {
            return Err(fail(format!(
                "{name} is {:?} on {:?}, the rest of {label} {kind:?} on {device:?}: a unit has one dtype and device",
                t.kind(),
                t.device()
            )));
        }
        let mut offsets = Vec::with_capacity(params.len());
        let mut numel = 0i64;
        for (_, t) in &params {
            offsets.push(numel);
            numel += t.numel() as i64;
        }
        units.push(Unit {
            label,
            shapes: params.iter().map(|(_, t)| t.size()).collect(),
            names: params.iter().map(|(n, _)| n.clone()).collect(),
            vars: params.into_iter().map(|(_, t)| t).collect(),
            offsets,
            numel,
            chunk: (numel + world as i64 - 1) / world as i64,
            kind,
            device,
        });
    }
    let mut shards = Vec::with_capacity(units.len());
    tch::no_grad(|| -> Result<()> {
        for unit in &units {
            let flat = unit.flat(&unit.vars, unit.kind, world)?;
            shards.push((unit.label.clone(), flat.f_narrow(0, rank as i64 * unit.chunk, unit.chunk)?.copy()));
            unit.release()?;
        }
        Ok(())
    })?;
    Ok((units, shards))
}

/// The layer hook of one pass: the engine behind a lock, so the thread the autograd engine recomputes on takes
/// its turn with the process group.
struct Hook(Mutex<Engine>);

impl Hook {
    fn with<R>(&self, f: impl FnOnce(&mut Engine) -> Result<R>) -> Result<R> {
        let mut e = self.0.lock().map_err(|_| fail("a pass panicked while holding the layer hook"))?;
        if e.group.is_null() {
            return Err(fail("a layer ran after its pass ended (a graph kept past the pass's backward?)"));
        }
        f(&mut e)
    }
}

impl LayerHook for Hook {
    fn before(&self, index: usize, run: LayerRun) -> trinity_model::Result<()> {
        self.with(|e| e.before(index, run)).map_err(model_error)
    }

    fn after_forward(&self, index: usize) -> trinity_model::Result<()> {
        self.with(|e| e.after_forward(index)).map_err(model_error)
    }
}

fn model_error(e: TrainerError) -> trinity_model::ModelError {
    trinity_model::ModelError::InvalidInput(e.to_string())
}

/// A pass's state: which units are whole, the collectives in flight, the gradient shards.
struct Engine {
    /// The pass's process group, borrowed by [`FullShard::pass`] for the pass; null once it ended.
    group: *const ProcessGroup,
    world: usize,
    units: Vec<Unit>,
    /// Per unit: the rank's shard (the optimizer's tensor, shared).
    shards: Vec<Tensor>,
    whole: Vec<bool>,
    /// Gathers in flight: the unit and its flat buffer.
    gathering: VecDeque<(usize, Work<'static>, Tensor)>,
    /// The reduce-scatter in flight: the unit and the shard it fills.
    scattering: Option<(usize, Work<'static>, Tensor)>,
    grads: Vec<Option<Tensor>>,
    forwards: Vec<u32>,
    recomputes: Vec<u32>,
    train: bool,
    prefetch: bool,
    seconds: PassSeconds,
}

// SAFETY: the engine is used behind the hook's lock, one thread at a time; its group pointer is dereferenced only
// while the pass that set it borrows the group (`FullShard::pass` / `idle_pass` null it before returning), and
// its works borrow that group likewise and are waited or dropped before it is nulled.
unsafe impl Send for Engine {}

impl Engine {
    fn outer(&self) -> usize {
        self.units.len() - 1
    }

    fn layers(&self) -> usize {
        self.units.len() - 1
    }

    fn group(&self) -> Result<&'static ProcessGroup> {
        // SAFETY: non-null only while the pass borrows the group (see `unsafe impl Send`); the `'static` borrow
        // never escapes the engine, whose works are waited before the pointer is cleared.
        unsafe { self.group.as_ref() }.ok_or_else(|| fail("the pass has ended"))
    }

    fn start_gather(&mut self, u: usize) -> Result<()> {
        if self.whole[u] || self.gathering.iter().any(|(g, _, _)| *g == u) {
            return Ok(());
        }
        let unit = &self.units[u];
        let full = Tensor::f_empty([unit.chunk * self.world as i64], (unit.kind, unit.device))?;
        let work = self.group()?.allgather_flat_async(&self.shards[u], &full)?;
        self.gathering.push_back((u, work, full));
        Ok(())
    }

    fn gather(&mut self, u: usize) -> Result<()> {
        self.start_gather(u)?;
        if self.whole[u] {
            return Ok(());
        }
        let at = self.gathering.iter().position(|(g, _, _)| *g == u).ok_or_else(|| fail("a gather went missing"))?;
        let (_, work, full) = self.gathering.remove(at).ok_or_else(|| fail("a gather went missing"))?;
        let waited = std::time::Instant::now();
        work.wait()?;
        self.seconds.gather_wait += waited.elapsed().as_secs_f64();
        self.units[u].attach(&full)?;
        self.whole[u] = true;
        Ok(())
    }

    fn free(&mut self, u: usize) -> Result<()> {
        if std::mem::take(&mut self.whole[u]) {
            self.units[u].release()?;
        }
        Ok(())
    }

    /// Starts the reduce-scatter of unit `u`'s gradients and releases them; the one before it lands now, so two
    /// are in flight at most.
    fn scatter(&mut self, u: usize) -> Result<()> {
        let packing = std::time::Instant::now();
        let unit = &self.units[u];
        let grads: Vec<Tensor> = unit
            .vars
            .iter()
            .zip(&unit.shapes)
            .map(|(v, shape)| {
                let g = v.grad();
                if g.defined() { Ok(g) } else { Ok(Tensor::f_zeros(shape.as_slice(), (Kind::Float, unit.device))?) }
            })
            .collect::<Result<_>>()?;
        let input = unit.flat(&grads, Kind::Float, self.world)?;
        drop(grads);
        for var in &self.units[u].vars {
            trinity_model::release_grad(&mut var.shallow_clone());
        }
        let out = Tensor::f_empty([self.units[u].chunk], (Kind::Float, self.units[u].device))?;
        self.seconds.scatter_pack += packing.elapsed().as_secs_f64();
        let work = self.group()?.reduce_scatter_flat_async(&input, &out, ReduceOp::Sum)?;
        if let Some(previous) = self.scattering.replace((u, work, out)) {
            self.land(previous)?;
        }
        Ok(())
    }

    fn land(&mut self, (u, work, out): (usize, Work<'static>, Tensor)) -> Result<()> {
        let waited = std::time::Instant::now();
        work.wait()?;
        self.seconds.scatter_wait += waited.elapsed().as_secs_f64();
        match &mut self.grads[u] {
            Some(g) => {
                let _ = g.f_add_(&out)?;
            }
            slot => *slot = Some(out),
        }
        Ok(())
    }

    fn before(&mut self, i: usize, run: LayerRun) -> Result<()> {
        let layers = self.layers();
        if i >= layers {
            return Err(fail(format!("layer {i} is not in the layout ({layers} layers)")));
        }
        match run {
            LayerRun::Forward => {
                self.forwards[i] += 1;
                self.gather(i)?;
                if self.prefetch && i + 1 < layers {
                    self.start_gather(i + 1)?;
                }
            }
            LayerRun::Kept => {
                return Err(fail(format!(
                    "layer {i}'s forward is recorded by autograd without recomputation, so its graph would keep the \
                     parameters this stage frees after it: stage 3 trains with activation recomputation on"
                )));
            }
            LayerRun::Recompute => {
                self.recomputes[i] += 1;
                if i + 1 < layers && self.whole[i + 1] {
                    // Layer i+1's backward ended before layer i's recomputation began.
                    self.scatter(i + 1)?;
                    self.free(i + 1)?;
                }
                self.gather(i)?;
                if self.prefetch && i > 0 {
                    self.start_gather(i - 1)?;
                }
            }
        }
        Ok(())
    }

    fn after_forward(&mut self, i: usize) -> Result<()> {
        self.free(i)
    }

    /// The end of a pass: the last layers' and the outer unit's gradients reduced (training), every layer heard
    /// once (and recomputed once in training) or an error.
    fn finish(&mut self) -> Result<()> {
        let layers = self.layers();
        let wrong = (0..layers).find(|&i| self.forwards[i] != 1 || self.recomputes[i] != u32::from(self.train));
        if let Some(i) = wrong {
            return Err(fail(format!(
                "layer {i} ran {} forward(s) and {} recomputation(s) in a {} pass, which must run one forward{}: {}",
                self.forwards[i],
                self.recomputes[i],
                if self.train { "training" } else { "forward-only" },
                if self.train { " and its backward" } else { "" },
                if self.train && self.recomputes[i] == 0 {
                    "stage 3 trains with activation recomputation on"
                } else {
                    "the ranks would fall out of step"
                }
            )));
        }
        if self.train {
            for i in (0..layers).rev() {
                if self.whole[i] {
                    self.scatter(i)?;
                    self.free(i)?;
                }
            }
            let outer = self.outer();
            self.scatter(outer)?;
        }
        if let Some(last) = self.scattering.take() {
            self.land(last)?;
        }
        Ok(())
    }

    /// Waits for whatever is still in flight (after an error), so nothing borrows the group past the pass.
    fn drain(&mut self) {
        for (_, work, _) in self.gathering.drain(..) {
            if let Err(e) = work.wait() {
                tracing::error!("ZeRO stage 3: a gather failed: {e}");
            }
        }
        if let Some(last) = self.scattering.take()
            && let Err(e) = self.land(last)
        {
            tracing::error!("ZeRO stage 3: a gradient reduce-scatter failed: {e}");
        }
    }
}

mod whole;
pub use whole::pass_bytes;

#[cfg(test)]
mod tests;
