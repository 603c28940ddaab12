//! Stage 3 outside a pass: the whole model for a moment (an HF export), a state restored from the file rank 0
//! reads (a resumed run's other ranks may not see the run directory), and the bytes a pass holds whole.

use std::collections::HashMap;
use std::path::Path;

use tch::{Kind, Tensor};
use trinity_collective::ProcessGroup;

use super::{FullShard, fail, layer_of};
use crate::error::{Result, TrainerError};

/// The keys of AdamW's one-process state file a parameter has: its moments, and its master in mixed precision.
fn state_keys(masters: bool) -> &'static [&'static str] {
    if masters { &["exp_avg", "exp_avg_sq", "master"] } else { &["exp_avg", "exp_avg_sq"] }
}

impl FullShard {
    /// Makes every unit whole in the model's own parameter tensors (a collective: every rank calls it, outside a
    /// pass), runs `f` and frees them again. The model is then whole once, in its own tensors, for as long as `f`
    /// runs: what reads a [`trinity_model::Decoder`] as a whole (an HF export) reads it unchanged.
    pub fn whole<R>(&self, group: &ProcessGroup, f: impl FnOnce() -> R) -> Result<R> {
        let mut gathered = 0;
        let mut gather = || -> Result<()> {
            for (unit, p) in self.units.iter().zip(&self.optimizer.params) {
                let full = Tensor::f_empty([unit.chunk * self.world as i64], (unit.kind, unit.device))?;
                group.allgather_flat_async(&p.var, &full)?.wait()?;
                unit.attach(&full)?;
                gathered += 1;
            }
            Ok(())
        };
        let out = gather().map(|()| f());
        for unit in &self.units[..gathered] {
            unit.release()?;
        }
        out
    }

    /// Restores a state in [`super::AdamW::save`]'s one-process format that rank 0 reads from `path` (the other
    /// ranks pass `None`, or a path they ignore): rank 0 checks every entry first and tells the others whether it
    /// could, then sends each unit's flat moments (and masters) in turn, of which every rank keeps its chunk. A
    /// collective; at most one unit's state is whole at a time, and only while it is sent.
    pub fn load_from_rank_zero(&mut self, group: &ProcessGroup, path: Option<&Path>) -> Result<()> {
        let mut read = None;
        let mut problem = String::new();
        if self.rank == 0 {
            match path.map(|p| self.read_state(p)) {
                Some(Ok(state)) => read = Some(state),
                Some(Err(e)) => problem = e.to_string(),
                None => problem = "rank 0 was given no optimizer state file".to_owned(),
            }
        }
        let verdict = group.broadcast_bytes(problem.as_bytes(), 0)?;
        if !verdict.is_empty() {
            return Err(fail(format!(
                "rank 0 could not load the optimizer state: {}",
                String::from_utf8_lossy(&verdict)
            )));
        }
        let (mut saved, step) = read.unwrap_or_default();
        let mut steps = Tensor::from_slice(&[step]);
        group.broadcast(&mut steps, 0)?;
        let (world, rank) = (self.world, self.rank as i64);
        tch::no_grad(|| -> Result<()> {
            for (unit, p) in self.units.iter().zip(&mut self.optimizer.params) {
                for &key in state_keys(p.master.is_some()) {
                    let device = p.exp_avg.device();
                    let mut flat = match self.rank {
                        0 => {
                            let parts = unit
                                .names
                                .iter()
                                .map(|name| {
                                    saved.remove(&format!("{key}/{name}")).ok_or_else(|| fail("an entry vanished"))
                                })
                                .collect::<Result<Vec<Tensor>>>()?;
                            unit.flat(&parts, Kind::Float, world)?.f_to_device(device)?
                        }
                        _ => Tensor::f_empty([unit.chunk * world as i64], (Kind::Float, device))?,
                    };
                    group.broadcast(&mut flat, 0)?;
                    let chunk = flat.f_narrow(0, rank * unit.chunk, unit.chunk)?;
                    match key {
                        "exp_avg" => p.exp_avg.f_copy_(&chunk)?,
                        "exp_avg_sq" => p.exp_avg_sq.f_copy_(&chunk)?,
                        _ => {
                            if let Some(master) = &mut p.master {
                                master.f_copy_(&chunk)?;
                            }
                            p.var.f_copy_(&chunk)?;
                        }
                    }
                }
            }
            Ok(())
        })?;
        self.optimizer.step = steps.f_int64_value(&[0])?;
        Ok(())
    }

    /// Rank 0's read of a state file for [`FullShard::load_from_rank_zero`]: every entry this layout needs, with
    /// its parameter's shape, and nothing else; the step count.
    fn read_state(&self, path: &Path) -> Result<(HashMap<String, Tensor>, i64)> {
        let bad = |problem: String| TrainerError::OptimizerState { path: path.to_path_buf(), problem };
        let mut saved: HashMap<String, Tensor> = Tensor::read_safetensors(path)?.into_iter().collect();
        let step = saved.remove("step").ok_or_else(|| bad("no `step` entry".into()))?.f_int64_value(&[0])?;
        let mut wanted = 0;
        for (unit, p) in self.units.iter().zip(&self.optimizer.params) {
            for key in state_keys(p.master.is_some()) {
                for (name, shape) in unit.names.iter().zip(&unit.shapes) {
                    let entry = format!("{key}/{name}");
                    let t = saved.get(&entry).ok_or_else(|| bad(format!("no entry `{entry}`")))?;
                    if t.size() != *shape {
                        return Err(bad(format!("`{entry}` has shape {:?}, the parameter {shape:?}", t.size())));
                    }
                    wanted += 1;
                }
            }
        }
        if saved.len() > wanted
            && let Some(extra) = saved.keys().find(|k| {
                let name = k.split_once('/').map_or(k.as_str(), |(_, n)| n);
                !self.units.iter().any(|u| u.names.iter().any(|n| n == name))
            })
        {
            return Err(bad(format!("entry `{extra}` matches no parameter")));
        }
        Ok((saved, step))
    }
}

/// The bytes of the whole parameters a pass holds at most besides the shards: the three largest units (the outer
/// unit, a layer and the next one's prefetch), from the parameters' names as [`FullShard::new`] cuts them.
pub fn pass_bytes<'a>(params: impl IntoIterator<Item = (&'a str, &'a Tensor)>, layers: usize) -> u64 {
    let mut units = vec![0u64; layers + 1];
    for (name, t) in params {
        let unit = layer_of(name).filter(|&i| i < layers).unwrap_or(layers);
        units[unit] += (t.numel() * t.kind().elt_size_in_bytes()) as u64;
    }
    units.sort_unstable_by(|a, b| b.cmp(a));
    units.iter().take(3).sum()
}
