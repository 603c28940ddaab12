//! Routing replay: the policy's mixture-of-experts layers compute with the experts the rollout chose.
//!
//! Trinity-RFT 0.6.0's `algorithm.enable_router_replay` selects veRL's router replay mode R3 for the actor: the
//! rollout engine records the experts every token was routed to (`rollout_model.enable_return_routed_experts`,
//! set from the same key), each experience carries them (`routed_experts`, one `[layers, top_k]` row for every
//! token the rollout read), and the actor's forwards — the old-logprob recomputation and the update — force
//! each sparse layer to those experts, weighting them with its own router's probabilities there so the router
//! still learns. A routing that flips between the rollout engine and the trainer (near-tied router logits,
//! different kernels, bf16) then no longer changes which experts a token's logprob comes from, and the
//! importance ratio measures the policy change rather than the flip. The reference model keeps its own routing,
//! as Trinity-RFT configures veRL's `ref.router_replay` (disabled); a LoRA policy's reference, the policy with
//! its adapters off, is scored by the actor and so replays.
//!
//! The rollout's rows cover the prompt and the response but its last token; in the padded layout
//! ([`crate::batch`]) a row's token `t` sits at column `P − prompt_length + t`. The last token and the padding
//! get experts `0..k` (any valid ids do: their outputs predict nothing the loss reads), as Trinity-RFT's
//! collation zero-pads them.

use tch::{Device, Kind, Tensor};
use trinity_model::Decoder;

use crate::batch::TrainRow;
use crate::error::{Result, TrainerError};

/// The trainer's copy of an experience's `routed_experts`: the rollout's routing of every token but the last.
pub use trinity_model::RoutedExperts;

/// The one problem with a row's routing, if any: it must hold whole `[layers, top_k]` rows, one for each token
/// but the last.
pub(crate) fn row_problem(row: &TrainRow) -> Option<String> {
    let r = row.routed_experts.as_ref()?;
    let read = row.tokens.len().saturating_sub(1);
    let unit = r.layers * r.top_k;
    (unit == 0 || r.ids.len() != read * unit).then(|| {
        format!(
            "`routed_experts` holds {} ids of {} layers × top {} for {} tokens; want one row for each of the {read} \
             tokens the rollout read",
            r.ids.len(),
            r.layers,
            r.top_k,
            row.tokens.len()
        )
    })
}

/// Checks that every row carries routing the policy can replay: its sparse layers, its top k, its experts.
/// Trinity-RFT refuses a batch where only some experiences carry `routed_experts`; so does this, naming the
/// row and saying where routing comes from.
pub fn check_rows(rows: &[TrainRow], policy: &Decoder) -> Result<()> {
    let Some(moe) = policy.config().moe.as_ref() else {
        return Err(TrainerError::setting(
            "algorithm.enable_router_replay",
            format!("the policy ({:?}) has no mixture-of-experts layer to replay routing in", policy.config().family),
        ));
    };
    let (layers, top_k, experts) = (policy.sparse_layers().len(), moe.num_experts_per_tok as usize, moe.num_experts);
    for (i, row) in rows.iter().enumerate() {
        let bad = |problem: String| TrainerError::InvalidRow { row: i, problem };
        let Some(r) = &row.routed_experts else {
            return Err(bad("it carries no routed experts, which algorithm.enable_router_replay needs: its rollout \
                            did not record them (a workflow that builds experiences from engine completions \
                            records them; an SFT or multi-turn row does not)"
                .into()));
        };
        if (r.layers, r.top_k) != (layers, top_k) {
            return Err(bad(format!(
                "its routed experts cover {} layers × top {}; the policy has {layers} sparse layers × top {top_k}",
                r.layers, r.top_k
            )));
        }
        if let Some(&e) = r.ids.iter().find(|&&e| i64::from(e) >= experts) {
            return Err(bad(format!("routed expert {e} is outside the policy's {experts} experts")));
        }
    }
    Ok(())
}

/// The routing layout of `all[rows]` when every one carries routed experts, `None` when none does; a mix is an
/// error naming a row without.
pub(crate) fn layout_of(all: &[TrainRow], rows: &[usize]) -> Result<Option<(usize, usize)>> {
    let Some(first) = rows.iter().find_map(|&i| all[i].routed_experts.as_ref()) else { return Ok(None) };
    let layout = (first.layers, first.top_k);
    for &i in rows {
        match &all[i].routed_experts {
            Some(r) if (r.layers, r.top_k) == layout => {}
            Some(r) => {
                return Err(TrainerError::InvalidRow {
                    row: i,
                    problem: format!(
                        "routed experts of {} layers × top {} among rows of {} × {}",
                        r.layers, r.top_k, layout.0, layout.1
                    ),
                });
            }
            None => {
                return Err(TrainerError::InvalidRow {
                    row: i,
                    problem: "no routed experts, while other rows of its batch replay theirs".into(),
                });
            }
        }
    }
    Ok(Some(layout))
}

/// The `[B, P + R, layers, k]` experts to force for `all[rows]` in the full-row layout (prompts left-padded to
/// `p`, `t = p + r` columns): each row's rollout routing at its tokens' columns, experts `0..k` elsewhere.
pub(crate) fn replay_tensor(
    all: &[TrainRow],
    rows: &[usize],
    p: usize,
    t: usize,
    (layers, k): (usize, usize),
    device: Device,
) -> Result<Tensor> {
    let unit = layers * k;
    let filler: Vec<i16> = (0..unit).map(|j| (j % k) as i16).collect();
    let mut flat: Vec<i16> = Vec::with_capacity(rows.len() * t * unit);
    for _ in 0..rows.len() * t {
        flat.extend_from_slice(&filler);
    }
    for (b, &i) in rows.iter().enumerate() {
        let row = &all[i];
        let Some(r) = &row.routed_experts else { continue };
        let start = (b * t + p - row.prompt_length) * unit;
        for (slot, &e) in flat[start..start + r.ids.len()].iter_mut().zip(&r.ids) {
            *slot = e as i16;
        }
    }
    let shape = [rows.len() as i64, t as i64, layers as i64, k as i64];
    Ok(Tensor::from_slice(&flat).f_view(shape)?.f_to_kind(Kind::Int64)?.f_to_device(device)?)
}

/// The weight of the load-balancing loss in the policy's update: the model's `router_aux_loss_coef` when its
/// config.json asks for router logits (`output_router_logits`, which makes transformers add `coef × loss` to the
/// training loss), else `None`. Qwen3-MoE checkpoints ship it off; veRL's FSDP actor, which Trinity-RFT 0.6.0
/// trains with, never adds it, so a run trains it only when the model's config turns it on.
pub fn aux_loss_coef(policy: &Decoder) -> Option<f64> {
    let moe = policy.config().moe.as_ref()?;
    (moe.output_router_logits && moe.router_aux_loss_coef != 0.0).then_some(moe.router_aux_loss_coef)
}

/// Adds the gradient of `loss` (a scalar on the policy's graph) into the policy's trainable parameters, keeping
/// the graph for the pass's main backward through the same forward. One more backward over the layers up to the
/// last sparse one: the price of training the load-balancing loss.
pub(crate) fn backward_keeping_graph(policy: &Decoder, loss: &Tensor) -> Result<()> {
    if !loss.requires_grad() {
        return Ok(());
    }
    let params: Vec<Tensor> =
        policy.named_parameters()?.into_iter().map(|(_, p)| p).filter(Tensor::requires_grad).collect();
    let grads = Tensor::f_run_backward(&[loss], &params, true, false)?;
    for (param, grad) in params.iter().zip(grads) {
        if grad.defined() {
            trinity_model::accumulate_grad(param, grad)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed_row(prompt: &[i64], response: &[i64], fill: u16) -> TrainRow {
        let mut row = TrainRow::sft(prompt, response);
        let read = row.tokens.len() - 1;
        row.routed_experts = Some(RoutedExperts { layers: 1, top_k: 2, ids: vec![fill; read * 2] });
        row
    }

    #[test]
    fn the_rollouts_experts_sit_at_their_tokens_columns() {
        // Prompts of 3 and 1 tokens, left-padded to 3; responses of 1 and 2, right-padded to 2.
        let rows = vec![routed_row(&[5, 6, 7], &[8], 3), routed_row(&[9], &[10, 11], 2)];
        let replay = replay_tensor(&rows, &[0, 1], 3, 5, (1, 2), Device::Cpu).unwrap();
        assert_eq!(replay.size(), [2, 5, 1, 2]);
        let firsts = Vec::<i64>::try_from(replay.select(3, 0).reshape([-1])).unwrap();
        // Row 0: tokens at columns 0..4, routed for all but the last (column 3); row 1: tokens at 2..5.
        assert_eq!(firsts, [3, 3, 3, 0, 0, 0, 0, 2, 2, 0]);
        let seconds = Vec::<i64>::try_from(replay.select(3, 1).reshape([-1])).unwrap();
        assert_eq!(seconds, [3, 3, 3, 1, 1, 1, 1, 2, 2, 1]);
    }

    #[test]
    fn rows_must_all_carry_routing_of_one_layout() {
        let rows = vec![routed_row(&[5, 6], &[8], 1), TrainRow::sft(&[9], &[10])];
        assert_eq!(layout_of(&rows, &[0]).unwrap(), Some((1, 2)));
        assert_eq!(layout_of(&rows, &[1]).unwrap(), None);
        let err = layout_of(&rows, &[0, 1]).unwrap_err().to_string();
        assert!(err.contains("row 1") && err.contains("no routed experts"), "{err}");
        let mut short = routed_row(&[5, 6], &[8], 1);
        short.routed_experts.as_mut().unwrap().ids.pop();
        assert!(row_problem(&short).unwrap().contains("2 tokens the rollout read"));
        assert!(row_problem(&rows[0]).is_none());
    }
}
