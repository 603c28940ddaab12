//! A training dataset read whole at start-up and served in file order, pass after pass: the rows of SFT and DPO
//! in mode `train`, and `mix`'s expert rows.
//!
//! Every dataset row becomes one *item* of training rows (one for SFT, a chosen/rejected pair for DPO), tokenized
//! once at start-up, where a malformed row fails naming the file, the row and the config key; a step takes whole
//! items. The position (items served) is saved with checkpoints, so a resumed run continues where it stopped.

use std::path::PathBuf;

use trinity_buffer::Row;
use trinity_config::buffer::ExperienceBufferConfig;
use trinity_trainer::TrainRow;

use crate::error::RftError;

/// The tokenized items of one dataset and the position of the next one to serve.
#[derive(Debug)]
pub struct DatasetRows {
    name: String,
    key: &'static str,
    items: Vec<Vec<TrainRow>>,
    total_epochs: u32,
    /// Items served so far over all passes.
    served: usize,
}

impl DatasetRows {
    /// Reads every row of `buffer` (a `file` buffer) and turns each into an item with `format_row`; rows are cut at
    /// `max_model_len` tokens (a row whose prompt alone reaches it is an error). Errors name `key`.
    pub(crate) fn load(
        buffer: &ExperienceBufferConfig,
        key: &'static str,
        total_epochs: u32,
        max_model_len: usize,
        format_row: impl Fn(&Row) -> Result<Vec<TrainRow>, String>,
    ) -> Result<DatasetRows, RftError> {
        let path = PathBuf::from(buffer.path.as_deref().unwrap_or_default());
        let raw = trinity_buffer::read_rows(&path, buffer.subset_name.as_deref(), &buffer.split)?;
        let mut items = Vec::with_capacity(raw.len());
        let mut cut = 0usize;
        for (index, row) in raw.iter().enumerate() {
            let bad = |message: String| RftError::Setting {
                key,
                message: format!("{} ({}), row {index}: {message}", buffer.name, path.display()),
            };
            let mut item = format_row(row).map_err(bad)?;
            for train_row in &mut item {
                if train_row.prompt_length >= max_model_len {
                    return Err(bad(format!(
                        "its prompt has {} tokens, model.max_model_len is {max_model_len}",
                        train_row.prompt_length
                    )));
                }
                if train_row.tokens.len() > max_model_len {
                    train_row.tokens.truncate(max_model_len);
                    train_row.action_mask.truncate(max_model_len - train_row.prompt_length);
                    cut += 1;
                }
            }
            items.push(item);
        }
        if items.is_empty() {
            return Err(RftError::Setting {
                key,
                message: format!("{} ({}) has no rows", buffer.name, path.display()),
            });
        }
        if cut > 0 {
            tracing::warn!(
                "{}: {cut} rows of {} cut at model.max_model_len ({max_model_len})",
                buffer.name,
                items.len()
            );
        }
        Ok(DatasetRows { name: buffer.name.clone(), key, items, total_epochs: total_epochs.max(1), served: 0 })
    }

    /// Dataset rows (items) in one pass.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Items left to serve over all passes.
    pub fn remaining(&self) -> usize {
        self.items.len() * self.total_epochs as usize - self.served
    }

    /// Items served so far (saved with checkpoints, restored with [`DatasetRows::skip_to`]).
    pub fn served(&self) -> usize {
        self.served
    }

    /// Serves at least `epochs` passes (a run with more steps than `total_epochs` passes hold, which Trinity-RFT's
    /// reader cycles for).
    pub fn extend_epochs(&mut self, epochs: u32) {
        self.total_epochs = self.total_epochs.max(epochs);
    }

    /// Continues after `served` items (a resumed run).
    pub fn skip_to(&mut self, served: usize) {
        self.served = served.min(self.items.len() * self.total_epochs as usize);
    }

    /// The rows of the next `n` items in file order, wrapping into the next pass; an error when fewer are left.
    pub fn take(&mut self, n: usize) -> Result<Vec<TrainRow>, RftError> {
        if n > self.remaining() {
            return Err(RftError::Setting {
                key: self.key,
                message: format!(
                    "{}: {n} rows wanted, {} left of {} passes; raise its total_epochs",
                    self.name,
                    self.remaining(),
                    self.total_epochs
                ),
            });
        }
        let rows =
            (self.served..self.served + n).flat_map(|i| self.items[i % self.items.len()].iter().cloned()).collect();
        self.served += n;
        Ok(rows)
    }
}
