//! Each mode of `trinity run` as a composition of the explorer, the trainer and the synchronizer.
//!
//! | mode | explorer | trainer | weights move by |
//! |---|---|---|---|
//! | `both`, `colocate` | this process | this process | in-place copy (or the weight store) |

pub(crate) mod both;
