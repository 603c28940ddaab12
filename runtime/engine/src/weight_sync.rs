//! In-place weight syncs: copying a trainer's tensors into the engine's decoder by HF name, whole
//! ([`crate::Engine::sync_weights`]) or part by part ([`crate::Engine::weight_sink`]).

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::SyncSender;

use tch::Tensor;
use tokio::sync::oneshot;
use trinity_model::{Decoder, ModelError};

use crate::error::{EngineError, Result};

/// A weight sync in progress on the scheduler thread: what has been copied so far, so that the end can say
/// whether every parameter was covered.
pub(crate) struct NamedCopy<'a> {
    decoder: &'a mut Decoder,
    vars: HashMap<String, Tensor>,
    copied: HashSet<String>,
}

impl<'a> NamedCopy<'a> {
    pub(crate) fn new(decoder: &'a mut Decoder) -> NamedCopy<'a> {
        let vars = decoder.var_store().variables();
        NamedCopy { decoder, vars, copied: HashSet::new() }
    }

    /// Copies `weights` into the variables of the same names, in place, without gradients, converting dtype and
    /// device as it copies.
    pub(crate) fn part(&mut self, weights: Vec<(String, Tensor)>) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for (name, source) in weights {
                let target = self
                    .vars
                    .get_mut(&name)
                    .ok_or_else(|| ModelError::MissingTensor { tensor: format!("{name} (engine)") })?;
                if target.size() != source.size() {
                    return Err(ModelError::ShapeMismatch {
                        tensor: name,
                        expected: target.size(),
                        found: source.size(),
                    }
                    .into());
                }
                target.f_copy_(&source)?;
                self.copied.insert(name);
            }
            Ok(())
        })
    }

    /// Checks that every variable was copied and lets the decoder refresh what it derives from its weights
    /// (packed fast-path copies).
    pub(crate) fn finish(self) -> Result<()> {
        if let Some(name) = self.vars.keys().find(|name| !self.copied.contains(*name)) {
            return Err(ModelError::MissingTensor {
                tensor: format!("{name} (weight sync covered {} of {} parameters)", self.copied.len(), self.vars.len()),
            }
            .into());
        }
        self.decoder.weights_changed()?;
        Ok(())
    }
}

/// The caller's end of [`crate::Engine::weight_sink`]: hand it the weights part by part, then
/// [`WeightSink::finish`]. Dropping it unfinished ends the sync with whatever was copied (the engine then holds
/// a mix of versions: finish, or sync again).
#[derive(Debug)]
pub struct WeightSink {
    pub(crate) parts: SyncSender<Vec<(String, Tensor)>>,
    pub(crate) done: oneshot::Receiver<Result<()>>,
}

impl WeightSink {
    /// Hands the engine `part` (HF names; any dtype or device) and returns once the engine has taken it, while
    /// it copies: the tensors must stay unchanged until the next `send` or `finish` returns. A blocking call;
    /// the scheduler takes the part between decode steps. Errors of a part come from [`WeightSink::finish`].
    pub fn send(&self, part: Vec<(String, Tensor)>) -> Result<()> {
        self.parts.send(part).map_err(|_| EngineError::Stopped)
    }

    /// Ends the sync: every parameter must have come in some part. Returns the first error of any part.
    pub async fn finish(self) -> Result<()> {
        let WeightSink { parts, done } = self;
        drop(parts);
        done.await.map_err(|_| EngineError::Stopped)?
    }
}
