//! Example algorithm library B: an explorer-side advantage (`group_mean`), a KL estimator (`clamped_k2`) and an
//! entropy loss (`capped_entropy`) — one component of each callable kind besides the policy loss of example A.

use trinity_plugin_sdk::algorithm::tch::{Kind, Tensor};
use trinity_plugin_sdk::algorithm::{
    Advantages, Args, Batch, Component, Error, KlFn, Loss, Metrics, aggregate, scalar,
};

/// A = r − mean(r of the row's group), on every action token; metric `group_mean/groups` (number of groups).
fn group_mean(batch: &Batch<'_>, _args: &Args) -> Result<Advantages, Error> {
    let reward = batch.need_reward()?;
    let groups = batch.group_id.ok_or_else(|| Error::new("needs batch field `group_id`"))?;
    let mut ids: Vec<&str> = groups.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let scores: Vec<f32> = groups
        .iter()
        .zip(reward)
        .map(|(g, r)| {
            let members: Vec<f64> = groups.iter().zip(reward).filter(|(h, _)| *h == g).map(|(_, r)| *r).collect();
            (r - members.iter().sum::<f64>() / members.len() as f64) as f32
        })
        .collect();
    let advantages = Tensor::from_slice(&scores).unsqueeze(-1) * batch.action_mask;
    Ok(Advantages {
        returns: advantages.copy(),
        advantages,
        metrics: Metrics::from([("group_mean/groups".to_owned(), ids.len() as f64)]),
        rows: None,
    })
}

/// min(½(ℓ − ℓ_ref)², `max_kl`) per token.
fn clamped_k2(logprob: &Tensor, reference: &Tensor, _old: Option<&Tensor>, args: &Args) -> Result<Tensor, Error> {
    let max_kl = args.f64("max_kl")?;
    Ok(((logprob - reference).square() * 0.5).clamp_max(max_kl))
}

/// agg(min(H, `cap`), m) under the trainer's `loss_agg_mode`; metric `entropy_loss`.
fn capped_entropy(batch: &Batch<'_>, mode: &str, args: &Args) -> Result<Loss, Error> {
    let entropy = batch.need("entropy")?.clamp_max(args.f64("cap")?);
    let loss = aggregate(&entropy.to_kind(Kind::Float), batch.action_mask, mode)?;
    Ok(Loss { metrics: Metrics::from([("entropy_loss".to_owned(), scalar(&loss))]), loss })
}

const CLAMPED_K2: KlFn = clamped_k2;

trinity_plugin_sdk::algorithm_library! {
    Component::advantage("group_mean", group_mean).doc("reward minus its group's mean reward"),
    Component::kl("clamped_k2", CLAMPED_K2).doc("k2 clamped at max_kl").arg("max_kl", 10.0),
    Component::entropy_loss("capped_entropy", capped_entropy).doc("entropy bonus with H capped").arg("cap", 5.0),
}

#[cfg(test)]
mod tests {
    use super::*;
    use trinity_plugin_sdk::algorithm::tch::Device;

    #[test]
    fn group_mean_centres_each_group() {
        let mask = Tensor::ones([3, 2], (Kind::Float, Device::Cpu));
        let ids = ["a", "a", "b"];
        let batch = Batch { reward: Some(&[1.0, 3.0, 5.0]), group_id: Some(&ids), ..Batch::new(&mask) };
        let out = group_mean(&batch, &Args::default()).unwrap();
        assert_eq!(out.advantages.double_value(&[0, 1]), -1.0);
        assert_eq!(out.advantages.double_value(&[1, 0]), 1.0);
        assert_eq!(out.advantages.double_value(&[2, 0]), 0.0);
        assert_eq!(out.metrics["group_mean/groups"], 2.0);
    }

    #[test]
    fn kl_is_clamped_and_entropy_capped() {
        let x = Tensor::from_slice(&[0.0f32, -10.0]).view([1, 2]);
        let y = Tensor::zeros([1, 2], (Kind::Float, Device::Cpu));
        let args = Args::parse(r#"{"max_kl": 1.0, "cap": 2.0}"#).unwrap();
        let kl = clamped_k2(&x, &y, None, &args).unwrap();
        assert_eq!((kl.double_value(&[0, 0]), kl.double_value(&[0, 1])), (0.0, 1.0));
        let h = Tensor::from_slice(&[1.0f32, 9.0]).view([1, 2]);
        let mask = Tensor::ones([1, 2], (Kind::Float, Device::Cpu));
        let out = capped_entropy(&Batch { entropy: Some(&h), ..Batch::new(&mask) }, "token-mean", &args).unwrap();
        assert!((scalar(&out.loss) - 1.5).abs() < 1e-6);
    }
}
