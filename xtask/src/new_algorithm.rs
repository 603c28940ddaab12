//! `cargo xtask new-algorithm NAME`: scaffold an algorithm library in `plugins/NAME` — a `cdylib` crate in the
//! workspace with a working policy loss (PPO's clipped surrogate, under the name NAME) and its unit tests — so a
//! researcher starts from code that builds, loads and trains at once.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Creates `plugins/NAME` under `root` and adds it to the workspace members; returns the crate's folder.
pub(crate) fn scaffold(root: &Path, name: &str) -> Result<PathBuf> {
    check_name(name)?;
    let dir = root.join("plugins").join(name);
    if dir.exists() {
        bail!("{} already exists; pick another name or remove it", dir.display());
    }
    let manifest = root.join("Cargo.toml");
    let workspace =
        std::fs::read_to_string(&manifest).with_context(|| format!("cannot read {}", manifest.display()))?;
    let workspace = add_member(&workspace, &format!("plugins/{name}"))
        .with_context(|| format!("cannot add plugins/{name} to the members of {}", manifest.display()))?;
    let component = name.replace('-', "_");
    std::fs::create_dir_all(dir.join("src")).with_context(|| format!("cannot create {}", dir.display()))?;
    for (file, text) in [
        ("Cargo.toml", cargo_toml(name)),
        ("build.rs", BUILD_RS.to_owned()),
        ("src/lib.rs", LIB_RS.replace("{{component}}", &component)),
    ] {
        let path = dir.join(file);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    std::fs::write(&manifest, workspace).with_context(|| format!("cannot write {}", manifest.display()))?;
    Ok(dir)
}

/// Prints what to do next.
pub(crate) fn next_steps(name: &str) {
    let lib = name.replace('-', "_");
    println!("created plugins/{name}: a policy loss `{lib}` (PPO's clipped surrogate) with its tests");
    println!("  cargo test -p {name}");
    println!("  cargo build -p {name}");
    println!("  trinity plugins list --plugin target/debug/lib{lib}.so");
    println!("  then in a config: `policy_loss_fn: {lib}` and `plugins: [target/debug/lib{lib}.so]`");
}

/// A crate name that is also a valid component name once `-` becomes `_`.
fn check_name(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let starts_with_letter = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    if !starts_with_letter
        || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    {
        bail!("invalid name `{name}`: use lowercase letters, digits, `_` and `-`, starting with a letter");
    }
    Ok(())
}

/// Adds `member` to the `members = [...]` list of the `[workspace]` table, keeping the list sorted and one entry
/// per line; the rest of the file is left byte for byte.
fn add_member(manifest: &str, member: &str) -> Result<String> {
    let workspace = manifest.find("[workspace]").context("no [workspace] table")?;
    let start = workspace + manifest[workspace..].find("members = [").context("no `members = [` list")?;
    let open = start + "members = [".len();
    let close = open + manifest[open..].find(']').context("unterminated members list")?;
    let mut members: Vec<String> = manifest[open..close]
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect();
    if members.iter().any(|m| m == member) {
        bail!("`{member}` is already a member");
    }
    members.push(member.to_owned());
    members.sort();
    let list: String = members.iter().map(|m| format!("    \"{m}\",\n")).collect();
    Ok(format!("{}\n{list}{}", &manifest[..open], &manifest[close..]))
}

fn cargo_toml(name: &str) -> String {
    format!(
        r#"[package]
name = "{name}"
description = "A trinity algorithm library"
version.workspace = true
edition.workspace = true
license.workspace = true
publish = false

[lib]
# Loaded by trinity with `--plugin target/debug/lib{lib}.so` (or `plugins:` in a config).
crate-type = ["cdylib"]

[dependencies]
# The SDK pins the tch (and so the libtorch) trinity links; use its re-export `trinity_plugin_sdk::algorithm::tch`.
trinity-plugin-sdk = {{ workspace = true, features = ["algorithm"] }}

[lints]
workspace = true
"#,
        lib = name.replace('-', "_")
    )
}

const BUILD_RS: &str = r#"//! Embeds libtorch's library folder as a run path so the unit tests start without LD_LIBRARY_PATH.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if let Ok(libtorch) = std::env::var("LIBTORCH") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libtorch}/lib");
    }
}
"#;

const LIB_RS: &str = r##"//! A trinity algorithm library. `{{component}}` is PPO's clipped surrogate, a starting point to change:
//!
//!   ratio = exp(ℓ − ℓ_old),  loss = agg(−min(A·ratio, A·clip(ratio, 1 − ε, 1 + ε)), m)
//!
//! Use it in a config with `policy_loss_fn: {{component}}` (and `policy_loss_fn_args: {clip_range: 0.1}`), after
//! loading the library with `--plugin` or `plugins:`.

use trinity_plugin_sdk::algorithm::tch::Kind;
use trinity_plugin_sdk::algorithm::{Args, Batch, Component, Error, Loss, Metrics, aggregate, scalar};

/// The clipped surrogate; metrics `pg_loss` and `pg_clipfrac` (the share of tokens whose ratio was clipped).
fn {{component}}(batch: &Batch<'_>, args: &Args) -> Result<Loss, Error> {
    let logprob = batch.need("logprob")?;
    let old_logprob = batch.need("old_logprob")?;
    let advantages = batch.need("advantages")?;
    let clip = args.f64("clip_range")?;
    let mode = args.str("loss_agg_mode")?;

    let ratio = (logprob - old_logprob).exp();
    let unclipped = advantages * &ratio;
    let clipped = advantages * ratio.clamp(1.0 - clip, 1.0 + clip);
    let loss = aggregate(&(-unclipped.minimum(&clipped)), batch.action_mask, mode)?;
    let clipfrac = aggregate(&clipped.lt_tensor(&unclipped).to_kind(Kind::Float), batch.action_mask, "token-mean")?;
    let metrics = Metrics::from([("pg_loss".to_owned(), scalar(&loss)), ("pg_clipfrac".to_owned(), scalar(&clipfrac))]);
    Ok(Loss { loss, metrics })
}

trinity_plugin_sdk::algorithm_library! {
    Component::policy_loss("{{component}}", {{component}})
        .doc("PPO's clipped surrogate")
        .arg("clip_range", 0.2)
        .arg("loss_agg_mode", "token-mean"),
}

#[cfg(test)]
mod tests {
    use super::*;
    use trinity_plugin_sdk::algorithm::tch::Tensor;

    fn args(clip: f64) -> Args {
        Args::parse(&format!(r#"{{"clip_range": {clip}, "loss_agg_mode": "token-mean"}}"#)).unwrap()
    }

    #[test]
    fn on_policy_the_loss_is_minus_the_mean_advantage_and_its_gradient_flows() {
        let logprob = Tensor::from_slice(&[-1.0f32, -2.0, -0.5, -0.7]).view([2, 2]).set_requires_grad(true);
        let old = logprob.detach();
        let advantages = Tensor::from_slice(&[1.0f32, 1.0, -1.0, 3.0]).view([2, 2]);
        let mask = Tensor::from_slice(&[1.0f32, 1.0, 1.0, 0.0]).view([2, 2]);
        let batch = Batch {
            logprob: Some(&logprob),
            old_logprob: Some(&old),
            advantages: Some(&advantages),
            ..Batch::new(&mask)
        };
        let out = {{component}}(&batch, &args(0.2)).unwrap();
        assert!((scalar(&out.loss) + 1.0 / 3.0).abs() < 1e-6, "{}", scalar(&out.loss));
        assert_eq!(out.metrics["pg_clipfrac"], 0.0);
        out.loss.backward();
        // ∂/∂ℓ of −A·e^{ℓ−ℓ_old}/3 at ratio 1 is −A/3; the masked token gets nothing.
        assert!((logprob.grad().double_value(&[1, 0]) - 1.0 / 3.0).abs() < 1e-6);
        assert_eq!(logprob.grad().double_value(&[1, 1]), 0.0);
    }

    #[test]
    fn a_large_ratio_is_clipped() {
        let logprob = Tensor::from_slice(&[0.0f32]).view([1, 1]);
        let old = Tensor::from_slice(&[-1.0f32]).view([1, 1]);
        let advantages = Tensor::from_slice(&[2.0f32]).view([1, 1]);
        let mask = Tensor::from_slice(&[1.0f32]).view([1, 1]);
        let batch = Batch {
            logprob: Some(&logprob),
            old_logprob: Some(&old),
            advantages: Some(&advantages),
            ..Batch::new(&mask)
        };
        let out = {{component}}(&batch, &args(0.2)).unwrap();
        assert!((scalar(&out.loss) + 2.0 * 1.2).abs() < 1e-6);
        assert_eq!(out.metrics["pg_clipfrac"], 1.0);
        let err = {{component}}(&Batch::new(&mask), &args(0.2)).unwrap_err();
        assert!(err.message().contains("`logprob`"), "{err}");
    }
}
"##;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_stay_sorted_and_the_rest_untouched() {
        let manifest =
            "[workspace]\nresolver = \"3\"\nmembers = [\n    \"plugin-sdk\",\n    \"xtask\",\n]\n\n[x]\ny = 1\n";
        let out = add_member(manifest, "plugins/my_algo").unwrap();
        assert_eq!(
            out,
            "[workspace]\nresolver = \"3\"\nmembers = [\n    \"plugin-sdk\",\n    \"plugins/my_algo\",\n    \"xtask\",\n]\n\n[x]\ny = 1\n"
        );
        assert!(add_member(&out, "plugins/my_algo").is_err());
        assert!(add_member("[package]\n", "a").is_err());
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("my_algo-2").is_ok());
        for bad in ["", "2algo", "My", "a/b", "a.b"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scaffolding_writes_the_crate_and_refuses_to_overwrite() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("Cargo.toml"), "[workspace]\nmembers = [\"xtask\"]\n").unwrap();
        let dir = scaffold(root.path(), "my-algo").unwrap();
        let lib = std::fs::read_to_string(dir.join("src/lib.rs")).unwrap();
        assert!(lib.contains("fn my_algo(") && lib.contains("Component::policy_loss(\"my_algo\", my_algo)"));
        assert!(!lib.contains("{{component}}"), "unfilled placeholder");
        let manifest = std::fs::read_to_string(root.path().join("Cargo.toml")).unwrap();
        assert!(manifest.contains("\"plugins/my-algo\",\n    \"xtask\""), "{manifest}");
        assert!(scaffold(root.path(), "my-algo").unwrap_err().to_string().contains("already exists"));
    }
}
