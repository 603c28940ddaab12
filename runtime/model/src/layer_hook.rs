//! Calls around each decoder layer of the training forwards ([`crate::Decoder::forward_hidden`] and its
//! shared-prompt form), for fully sharded data parallel (ZeRO stage 3, FSDP's full sharding): a rank holds only
//! its shard of each layer's parameters, gathers a layer's whole parameters just before the layer computes and
//! frees them right after, so at most a layer or two are whole at any time.
//!
//! A layer computes once in a forward, and once more in the backward when its activations are recomputed
//! ([`crate::Decoder::set_recompute_activations`]); the hook hears both, told apart by [`LayerRun`]. Freeing a
//! layer's parameters after its forward is only sound when that forward kept nothing of them for the backward,
//! that is when the forward ran without autograd or recomputes its layers: a kept forward's autograd graph holds
//! the parameters it multiplied by. A recomputed layer's backward follows its recomputation at once and reads the
//! parameters the recomputation gathered; a hook learns that it has ended when the next layer down starts its
//! recomputation (autograd runs the segments from the last layer to the first, each to its end), or when the
//! caller's backward returns.
//!
//! The hook is set per thread with [`with_layer_hook`] around the forward, and each layer's computation takes a
//! handle to it, so the recomputation sees it too, whichever thread libtorch runs the backward on.

use std::cell::RefCell;
use std::sync::Arc;

use tch::Tensor;

use crate::checkpoint;
use crate::error::Result;

/// Which computation of a layer a hook is told about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerRun {
    /// The forward (with or without autograd; when recomputed, its first run, which keeps nothing).
    Forward,
    /// The backward's recomputation of a recomputed layer; the layer's own backward follows it.
    Recompute,
    /// A forward that autograd records and does not recompute: its graph keeps the layer's parameters for the
    /// backward, so a hook must not free them after it (a fully sharded trainer refuses it).
    Kept,
}

/// What runs around each layer of a training forward.
pub trait LayerHook: Send + Sync {
    /// Before layer `index` computes: its parameters must be whole when this returns.
    fn before(&self, index: usize, run: LayerRun) -> Result<()>;
    /// After layer `index`'s forward computed its output (not after a recomputation: the layer's backward, which
    /// still reads the parameters, follows it; after a [`LayerRun::Kept`] forward too, whose graph still reads
    /// them).
    fn after_forward(&self, index: usize) -> Result<()>;
}

thread_local! {
    static HOOK: RefCell<Option<Arc<dyn LayerHook>>> = const { RefCell::new(None) };
}

/// Runs `f` with `hook` called around every layer of the training forwards it runs on this thread (and their
/// recomputations, wherever they run). The previous hook, if any, is restored after.
pub fn with_layer_hook<R>(hook: Arc<dyn LayerHook>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<dyn LayerHook>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            HOOK.with(|h| *h.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(HOOK.with(|h| h.borrow_mut().replace(hook)));
    f()
}

/// The hook set on this thread.
pub(crate) fn current() -> Option<Arc<dyn LayerHook>> {
    HOOK.with(|h| h.borrow().clone())
}

/// `run` for layer `index` with `hook` around it. `recompute`: whether the forward recomputes the layer, so that
/// a call outside the checkpoint's first run is the backward's recomputation.
pub(crate) fn hooked(
    hook: Option<Arc<dyn LayerHook>>,
    index: usize,
    recompute: bool,
    run: impl Fn(&Tensor) -> Result<Tensor> + Send + 'static,
) -> impl Fn(&Tensor) -> Result<Tensor> + Send + 'static {
    move |x: &Tensor| {
        let Some(hook) = &hook else { return run(x) };
        let phase = match (recompute, checkpoint::in_first_run()) {
            (true, false) => LayerRun::Recompute,
            (false, _) if checkpoint::grad_mode_enabled() => LayerRun::Kept,
            _ => LayerRun::Forward,
        };
        hook.before(index, phase)?;
        let y = run(x)?;
        if phase != LayerRun::Recompute {
            hook.after_forward(index)?;
        }
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tch::{Device, Kind, Tensor};

    use super::*;
    use crate::config::{Family, ModelConfig};
    use crate::decoder::Decoder;
    use crate::weights::RandomWeights;

    /// What full sharding does with a layer's parameters, on one process: each layer's parameters are emptied
    /// after its forward and put back from a copy (the gather) before it computes again; a layer recomputed in the
    /// backward is emptied once the next layer down starts its recomputation.
    struct FreeingHook {
        /// Per layer: its parameters (handles sharing the model's tensors) and their whole values.
        layers: Mutex<Vec<Vec<(Tensor, Tensor)>>>,
        count: usize,
        events: Mutex<Vec<(usize, LayerRun)>>,
    }

    impl FreeingHook {
        fn set(&self, index: usize, whole: bool) -> Result<()> {
            for (var, value) in &self.layers.lock().unwrap()[index] {
                let data =
                    if whole { value.shallow_clone() } else { Tensor::f_empty([0], (value.kind(), value.device()))? };
                var.shallow_clone().f_set_data(&data)?;
            }
            Ok(())
        }

        fn whole(&self, index: usize) -> bool {
            self.layers.lock().unwrap()[index].iter().all(|(var, value)| var.size() == value.size())
        }
    }

    impl LayerHook for FreeingHook {
        fn before(&self, index: usize, run: LayerRun) -> Result<()> {
            self.events.lock().unwrap().push((index, run));
            if run == LayerRun::Recompute && index + 1 < self.count {
                // The layer above finished its backward before this recomputation started.
                assert!(self.whole(index + 1), "layer {} was freed before its backward", index + 1);
                self.set(index + 1, false)?;
            }
            self.set(index, true)
        }

        fn after_forward(&self, index: usize) -> Result<()> {
            self.set(index, false)
        }
    }

    fn loss(m: &Decoder) -> Tensor {
        let ids = Tensor::from_slice(&[0i64, 0, 3, 1, 4, 1, 5, 9, 2, 6, 5, 3]).view([2, 6]);
        let mask = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]).view([2, 6]);
        let h = m.forward_hidden(&ids, Some(&mask)).unwrap();
        let w = Tensor::arange(h.numel() as i64, (Kind::Float, Device::Cpu)).view(h.size().as_slice());
        (h * (w * 0.37).sin()).sum(Kind::Float)
    }

    fn gradients(m: &Decoder) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = m
            .named_parameters()
            .unwrap()
            .into_iter()
            .map(|(name, mut v)| {
                let g = v.grad().copy();
                v.zero_grad();
                (name, g)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// A layer's parameters emptied between its computations change nothing: the recomputed layers gather them back
    /// and give the plain gradients, the hook hears every forward in order and every recomputation from the top,
    /// and between the forward and the backward no layer holds its parameters.
    #[test]
    #[cfg(torch_shim)]
    fn layers_freed_after_their_forward_and_gathered_for_their_recomputation_give_the_same_gradients() {
        tch::manual_seed(0);
        let mut m =
            Decoder::load(ModelConfig::tiny(Family::Qwen2), &mut RandomWeights, Kind::Float, Device::Cpu).unwrap();
        m.set_recompute_activations(true).unwrap();
        let want_loss = loss(&m);
        want_loss.backward();
        let want = gradients(&m);
        let layers = m.config().num_hidden_layers as usize;
        let params = m.named_parameters().unwrap();
        let layer_params: Vec<Vec<(Tensor, Tensor)>> = (0..layers)
            .map(|i| {
                let prefix = format!("model.layers.{i}.");
                params
                    .iter()
                    .filter(|(n, _)| n.starts_with(&prefix))
                    .map(|(_, t)| (t.shallow_clone(), t.copy()))
                    .collect()
            })
            .collect();
        assert!(layer_params.iter().all(|l| l.len() >= 9), "every layer's parameters");
        let hook =
            Arc::new(FreeingHook { layers: Mutex::new(layer_params), count: layers, events: Mutex::new(Vec::new()) });
        let got_loss = with_layer_hook(hook.clone(), || loss(&m));
        let freed = hook.layers.lock().unwrap().iter().all(|l| l.iter().all(|(v, _)| v.numel() == 0));
        assert!(freed, "freed after the forward");
        got_loss.backward();
        assert!(
            !hook.whole(layers - 1) && hook.whole(0),
            "the top layers freed in the backward, the first still whole"
        );
        for i in 0..layers {
            hook.set(i, true).unwrap();
        }
        assert_eq!(want_loss.double_value(&[]), got_loss.double_value(&[]));
        for ((name, w), (_, g)) in want.iter().zip(&gradients(&m)) {
            let diff = (w - g).abs().max().double_value(&[]);
            assert!(diff <= 1e-6 * w.abs().max().double_value(&[]).max(1e-6), "gradient of {name}: {diff}");
        }
        let events = hook.events.lock().unwrap().clone();
        let mut expected: Vec<(usize, LayerRun)> = (0..layers).map(|i| (i, LayerRun::Forward)).collect();
        expected.extend((0..layers).rev().map(|i| (i, LayerRun::Recompute)));
        assert_eq!(events, expected);
    }

    /// Without autograd a layer computes once, as a forward, and may be freed right after.
    #[test]
    fn a_forward_without_autograd_calls_each_layer_once() {
        let mut m =
            Decoder::load(ModelConfig::tiny(Family::Llama), &mut RandomWeights, Kind::Float, Device::Cpu).unwrap();
        m.set_recompute_activations(checkpoint::AVAILABLE).unwrap();
        struct Count(Mutex<Vec<(usize, LayerRun, bool)>>);
        impl LayerHook for Count {
            fn before(&self, index: usize, run: LayerRun) -> Result<()> {
                self.0.lock().unwrap().push((index, run, false));
                Ok(())
            }
            fn after_forward(&self, index: usize) -> Result<()> {
                self.0.lock().unwrap().push((index, LayerRun::Forward, true));
                Ok(())
            }
        }
        let count = Arc::new(Count(Mutex::new(Vec::new())));
        let want = tch::no_grad(|| loss(&m));
        let got = with_layer_hook(count.clone(), || tch::no_grad(|| loss(&m)));
        assert_eq!(want.double_value(&[]), got.double_value(&[]));
        let layers = m.config().num_hidden_layers as usize;
        let expected: Vec<(usize, LayerRun, bool)> =
            (0..layers).flat_map(|i| [(i, LayerRun::Forward, false), (i, LayerRun::Forward, true)]).collect();
        assert_eq!(*count.0.lock().unwrap(), expected);
        // The hook is gone once `with_layer_hook` returns.
        assert!(current().is_none());
    }

    /// A forward that autograd records and does not recompute is told apart from one that keeps nothing: its
    /// graph holds the layers' parameters until the backward.
    #[test]
    fn a_recorded_forward_without_recomputation_is_kept() {
        let m = Decoder::load(ModelConfig::tiny(Family::Llama), &mut RandomWeights, Kind::Float, Device::Cpu).unwrap();
        struct Runs(Mutex<Vec<LayerRun>>);
        impl LayerHook for Runs {
            fn before(&self, _: usize, run: LayerRun) -> Result<()> {
                self.0.lock().unwrap().push(run);
                Ok(())
            }
            fn after_forward(&self, _: usize) -> Result<()> {
                Ok(())
            }
        }
        let runs = Arc::new(Runs(Mutex::new(Vec::new())));
        let _ = with_layer_hook(runs.clone(), || loss(&m));
        let layers = m.config().num_hidden_layers as usize;
        assert_eq!(*runs.0.lock().unwrap(), vec![LayerRun::Kept; layers]);
    }
}
