//! Example algorithm library A: `vanilla_pg`, the plain policy-gradient loss agg(−A·ℓ), and `vanilla`, a preset
//! that pairs it with the built-in `grpo` advantage and no reference model.
//!
//! With `ratio = 1` (on-policy data) this is PPO's surrogate without clipping; it exists to show how a policy
//! loss and a preset are exported, and to prove that a second library (example B) loads beside it.

use trinity_plugin_sdk::algorithm::{Args, Batch, Component, Error, Loss, Metrics, Preset, aggregate, scalar};

/// agg(−A·ℓ, m): metrics `pg_loss` and `vanilla_pg/advantage_mean` (the masked mean advantage).
fn vanilla_pg(batch: &Batch<'_>, args: &Args) -> Result<Loss, Error> {
    let logprob = batch.need("logprob")?;
    let advantages = batch.need("advantages")?;
    let mode = args.str("loss_agg_mode")?;
    let loss = aggregate(&(-(advantages * logprob)), batch.action_mask, mode)?;
    let advantage_mean = scalar(&aggregate(advantages, batch.action_mask, "token-mean")?);
    let metrics = Metrics::from([
        ("pg_loss".to_owned(), scalar(&loss)),
        ("vanilla_pg/advantage_mean".to_owned(), advantage_mean),
    ]);
    Ok(Loss { loss, metrics })
}

fn vanilla() -> Preset {
    Preset {
        repeat_times: Some(2),
        sample_strategy: Some("default".into()),
        advantage_fn: Some("grpo".into()),
        policy_loss_fn: Some("vanilla_pg".into()),
        kl_penalty_fn: Some("none".into()),
        kl_loss_fn: Some("none".into()),
        entropy_loss_fn: Some("none".into()),
        ..Preset::default()
    }
}

trinity_plugin_sdk::algorithm_library! {
    Component::policy_loss("vanilla_pg", vanilla_pg)
        .doc("plain policy gradient agg(-A*logprob)")
        .arg("loss_agg_mode", "token-mean"),
    Component::preset("vanilla", vanilla()).doc("grpo advantages with vanilla_pg, no reference model"),
}

#[cfg(test)]
mod tests {
    use super::*;
    use trinity_plugin_sdk::algorithm::tch::{Device, Kind, Tensor};

    #[test]
    fn loss_and_gradient_by_hand() {
        let logprob = Tensor::from_slice(&[-1.0f32, -2.0, -3.0, -4.0]).view([2, 2]).set_requires_grad(true);
        let advantages = Tensor::from_slice(&[1.0f32, 1.0, -2.0, -2.0]).view([2, 2]);
        let mask = Tensor::from_slice(&[1.0f32, 1.0, 1.0, 0.0]).view([2, 2]);
        let batch = Batch { logprob: Some(&logprob), advantages: Some(&advantages), ..Batch::new(&mask) };
        let args = Args::parse(r#"{"loss_agg_mode": "token-mean"}"#).unwrap();
        let out = vanilla_pg(&batch, &args).unwrap();
        // −(1·−1 + 1·−2 + −2·−3)/3 = −1.
        assert!((scalar(&out.loss) + 1.0).abs() < 1e-5, "{}", scalar(&out.loss));
        out.loss.backward();
        let grad = logprob.grad();
        assert!((grad.double_value(&[1, 0]) - 2.0 / 3.0).abs() < 1e-5);
        assert_eq!(grad.double_value(&[1, 1]), 0.0, "masked token gets no gradient");
    }

    #[test]
    fn missing_advantages_are_named() {
        let mask = Tensor::ones([1, 1], (Kind::Float, Device::Cpu));
        let err = vanilla_pg(&Batch { logprob: Some(&mask), ..Batch::new(&mask) }, &Args::default()).unwrap_err();
        assert!(err.message().contains("`advantages`"), "{err}");
    }
}
