//! Stage 3 against one process, on two Gloo ranks started as processes of this test binary.

use std::path::PathBuf;
use std::time::Duration;

use trinity_collective::testing::{assert_all_succeeded, run_ranks, var};
use trinity_collective::{GroupOptions, Store};
use trinity_model::{Decoder, Family, ModelConfig, RandomWeights, RopeScaling};

use super::*;
use crate::data_parallel::share;

const TIMEOUT: Duration = Duration::from_secs(60);
const STEPS: usize = 6;
/// The step after which both runs save their state, and the resumed runs start.
const SAVE_AFTER: usize = 3;
const LR: f64 = 2e-3;
const MICRO_ROWS: usize = 2;
const LAYERS: usize = 3;

fn settings() -> AdamWSettings {
    AdamWSettings { betas: [0.9, 0.99], eps: 1e-8, weight_decay: 0.01 }
}

/// A three-layer Qwen2-style model (biases on q, k, v) with tied embeddings, the same weights in every process.
fn tiny(kind: Kind) -> Decoder {
    let _rng = crate::torch_rng();
    tch::manual_seed(3);
    let config = ModelConfig {
        family: Family::Qwen2,
        vocab_size: 40,
        hidden_size: 16,
        intermediate_size: 24,
        num_hidden_layers: LAYERS as i64,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        rope_scaling: RopeScaling::None,
        max_position_embeddings: 64,
        tie_word_embeddings: true,
        qkv_bias: true,
        o_bias: false,
        mlp_bias: false,
        qk_norm: false,
        bos_token_id: None,
        eos_token_ids: vec![1],
        torch_dtype: None,
        moe: None,
    };
    let mut m = Decoder::load(config, &mut RandomWeights, kind, Device::Cpu).unwrap();
    m.set_recompute_activations(true).unwrap();
    m
}

/// A copy of `m`'s weights: in one test process, tests that call [`tiny`] at the same time share torch's global
/// generator, so two calls may not draw the same weights.
fn twin(m: &Decoder) -> Decoder {
    let mut copy = crate::reference::copy_decoder(m, m.kind()).unwrap();
    copy.set_recompute_activations(true).unwrap();
    copy
}

/// Five rows of 3 to 8 tokens: shares of 3 and 2 rows, so rank 0 runs two micro-batches and rank 1 one.
fn rows() -> Vec<Vec<i64>> {
    (0..5).map(|i| (0..3 + (i * 3) % 6).map(|j| 1 + ((i * 7 + j * 3) % 37) as i64).collect()).collect()
}

fn tokens(rows: &[Vec<i64>]) -> i64 {
    rows.iter().map(|r| r.len() as i64 - 1).sum()
}

/// The next-token loss of `rows` (left-padded), summed over tokens and divided by `total`, the whole
/// mini-batch's count, so the ranks' losses add up to the one-process mean.
fn loss(m: &Decoder, rows: &[Vec<i64>], total: i64) -> Tensor {
    let t = rows.iter().map(Vec::len).max().unwrap();
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for r in rows {
        ids.extend(std::iter::repeat_n(0, t - r.len()).chain(r.iter().copied()));
        mask.extend(std::iter::repeat_n(0i64, t - r.len()).chain(std::iter::repeat_n(1, r.len())));
    }
    let shape = [rows.len() as i64, t as i64];
    let (ids, mask) = (Tensor::from_slice(&ids).view(shape), Tensor::from_slice(&mask).view(shape));
    let logits = m.logits(&m.forward_hidden(&ids, Some(&mask)).unwrap()).unwrap();
    let logp = logits.narrow(1, 0, t as i64 - 1).to_kind(Kind::Float).log_softmax(-1, Kind::Float);
    let target = ids.narrow(1, 1, t as i64 - 1);
    let nll = -logp.gather(2, &target.unsqueeze(-1), false).squeeze_dim(-1);
    let valid = (mask.narrow(1, 1, t as i64 - 1) * mask.narrow(1, 0, t as i64 - 1)).to_kind(Kind::Float);
    (nll * valid).sum(Kind::Float) / total as f64
}

/// The one-process run: every row, micro-batches of two rows, plain AdamW. Returns the weights and the state
/// file after [`SAVE_AFTER`] steps, the final weights and each step's forward-only loss.
struct Single {
    at_save: Vec<(String, Tensor)>,
    state: PathBuf,
    last: Vec<(String, Tensor)>,
    last_state: PathBuf,
    losses: Vec<f64>,
}

fn weights(m: &Decoder) -> Vec<(String, Tensor)> {
    m.named_parameters().unwrap().into_iter().map(|(n, t)| (n, t.detach().copy())).collect()
}

fn single_steps(m: &Decoder, adamw: &mut AdamW, steps: std::ops::Range<usize>, losses: &mut Vec<f64>) {
    let rows = rows();
    for _ in steps {
        losses.push(tch::no_grad(|| loss(m, &rows, tokens(&rows)).double_value(&[])));
        for micro in rows.chunks(MICRO_ROWS) {
            loss(m, micro, tokens(&rows)).backward();
        }
        adamw.clip_grad_norm(1.0).unwrap();
        adamw.step(LR).unwrap();
        adamw.zero_grad();
    }
}

fn single(kind: Kind, dir: &Path, rank: usize) -> (Vec<(String, Tensor)>, Single) {
    let m = tiny(kind);
    let init = weights(&m);
    let mut adamw = AdamW::new(m.named_parameters().unwrap(), settings()).unwrap();
    let mut losses = Vec::new();
    single_steps(&m, &mut adamw, 0..SAVE_AFTER, &mut losses);
    let at_save = weights(&m);
    let state = dir.join(format!("single_state_{rank}.safetensors"));
    adamw.save(&state).unwrap();
    single_steps(&m, &mut adamw, SAVE_AFTER..STEPS, &mut losses);
    let last_state = dir.join(format!("single_last_{rank}.safetensors"));
    adamw.save(&last_state).unwrap();
    (init, Single { at_save, state, last: weights(&m), last_state, losses })
}

/// Stage 3 steps on this rank's share, an idle pass where it has fewer micro-batches than another rank.
fn sharded_steps(m: &Decoder, fs: &mut FullShard, g: &ProcessGroup, steps: std::ops::Range<usize>) -> Vec<f64> {
    let rows = rows();
    let (rank, world) = (g.rank(), g.world_size());
    let micro_batches = |r: usize| share(rows.len(), r, world, 1).len().div_ceil(MICRO_ROWS);
    let most = (0..world).map(micro_batches).max().unwrap();
    let mine = rows[share(rows.len(), rank, world, 1)].to_vec();
    let mut losses = Vec::new();
    for _ in steps {
        // A forward-only pass, as the reference or old-logprob pass, over the rank's share.
        let part = fs.pass(g, false, || tch::no_grad(|| loss(m, &mine, tokens(&rows)).double_value(&[]))).unwrap();
        let mut total = Tensor::from_slice(&[part]);
        g.allreduce(&mut total, ReduceOp::Sum).unwrap();
        losses.push(total.double_value(&[0]));
        let micros: Vec<&[Vec<i64>]> = mine.chunks(MICRO_ROWS).collect();
        for k in 0..most {
            match micros.get(k) {
                Some(micro) => fs.pass(g, true, || loss(m, micro, tokens(&rows)).backward()).unwrap(),
                None => fs.idle_pass(g, true).unwrap(),
            }
        }
        // Between passes no parameter is whole.
        assert!(m.named_parameters().unwrap().iter().all(|(_, t)| t.numel() == 0), "freed between passes");
        fs.step(g, 1.0, LR).unwrap();
    }
    losses
}

fn gathered(fs: &FullShard, g: &ProcessGroup) -> Vec<(String, Tensor)> {
    let mut out = Vec::new();
    fs.gather_whole(g, |unit| {
        out.extend(unit.iter().map(|(n, t)| (n.clone(), t.detach().copy())));
        Ok(())
    })
    .unwrap();
    out
}

/// The fp32 values a run ends with: the parameters in fp32, the masters of a state file in bf16.
fn masters(kind: Kind, weights: &[(String, Tensor)], state: &Path) -> Vec<(String, Tensor)> {
    if kind == Kind::Float {
        return weights.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
    }
    let saved: HashMap<String, Tensor> = Tensor::read_safetensors(state).unwrap().into_iter().collect();
    weights.iter().map(|(n, _)| (n.clone(), saved[&format!("master/{n}")].shallow_clone())).collect()
}

/// `got` within 2% of what training moved `want` from `init`: the largest element of every parameter in
/// fp32; in bf16 the L2 norm over the model's fp32 masters (the parameters round to bf16 steps comparable to
/// a few steps' movement), as the stage 1-2 tests measure.
fn assert_close(
    what: &str,
    kind: Kind,
    got: &[(String, Tensor)],
    want: &[(String, Tensor)],
    init: &[(String, Tensor)],
) {
    let got: HashMap<&str, &Tensor> = got.iter().map(|(n, t)| (n.as_str(), t)).collect();
    assert_eq!(got.len(), want.len(), "{what}: parameters");
    let (mut moved_sq, mut apart_sq) = (0.0, 0.0);
    for ((name, w), (_, i)) in want.iter().zip(init) {
        let g = got[name.as_str()].to_kind(Kind::Float);
        let (w, i) = (w.to_kind(Kind::Float), i.to_kind(Kind::Float));
        let moved = (&w - &i).abs().max().double_value(&[]);
        let diff = (&g - &w).abs().max().double_value(&[]);
        assert!(moved > 0.0, "{what}: {name} did not move");
        moved_sq += (&w - &i).square().sum(Kind::Double).double_value(&[]);
        apart_sq += (&g - &w).square().sum(Kind::Double).double_value(&[]);
        if kind == Kind::Float {
            assert!(diff <= 0.02 * moved, "{what}: {name} is {diff} off the one-process run, which moved it {moved}");
        }
    }
    let (moved, apart) = (moved_sq.sqrt(), apart_sq.sqrt());
    println!(
        "{what}: {apart:.3e} from one process, {:.3}% of the {moved:.3e} training moved it",
        100.0 * apart / moved
    );
    assert!(apart <= 0.02 * moved, "{what}: {apart} from one process, more than 2% of the {moved} it moved");
}

/// The entry point of a rank process; returns at once in an ordinary test run.
#[test]
fn rank() {
    let Ok(kind) = std::env::var("TRINITY_ZERO3_KIND") else { return };
    let kind = if kind == "bf16" { Kind::BFloat16 } else { Kind::Float };
    let get = |k: &str| std::env::var(k).unwrap();
    let (rank, world): (usize, usize) = (get("TRINITY_ZERO3_RANK").parse().unwrap(), 2);
    let dir = PathBuf::from(get("TRINITY_ZERO3_DIR"));
    let store = Store::client("127.0.0.1", get("TRINITY_ZERO3_PORT").parse().unwrap(), TIMEOUT).unwrap();
    let options = GroupOptions { timeout: TIMEOUT, ..GroupOptions::default() };
    let g = ProcessGroup::new(&store.with_prefix("zero3").unwrap(), rank, world, &options).unwrap();
    let (init, single) = single(kind, &dir, rank);

    // Two ranks from the start, saving after SAVE_AFTER steps.
    let m = tiny(kind);
    let mut fs = FullShard::new(m.named_parameters().unwrap(), LAYERS, settings(), false, &g).unwrap();
    let whole_state: i64 =
        init.iter().map(|(_, t)| t.numel() as i64).sum::<i64>() * if kind == Kind::Float { 2 } else { 3 };
    let held = fs.optimizer().state_elements();
    assert!(held * 2 <= whole_state + 64 && held * 2 >= whole_state, "{held} of {whole_state} state elements");
    let mut losses = sharded_steps(&m, &mut fs, &g, 0..SAVE_AFTER);
    let state = dir.join("sharded_state.safetensors");
    fs.save(&g, &state).unwrap();
    let at_save = gathered(&fs, &g);
    losses.extend(sharded_steps(&m, &mut fs, &g, SAVE_AFTER..STEPS));
    let last = gathered(&fs, &g);
    let last_state = dir.join("sharded_last.safetensors");
    fs.save(&g, &last_state).unwrap();
    let memory = fs.memory();
    assert_eq!(memory.optimizer_state, 4 * held);
    assert_eq!(memory.gradient_shards, 0, "the step consumed the gradient shards");
    for (step, (got, want)) in losses.iter().zip(&single.losses).enumerate() {
        let tolerance = if kind == Kind::Float { 1e-5 } else { 2e-2 };
        assert!((got - want).abs() <= tolerance * want.abs(), "step {step}'s loss: {got} against {want}");
    }
    g.barrier().unwrap();
    let init_masters = masters(Kind::Float, &init, Path::new(""));
    let (want_save, want_last) =
        (masters(kind, &single.at_save, &single.state), masters(kind, &single.last, &single.last_state));
    let got_save = masters(kind, &at_save, &state);
    assert_close("after the first steps", kind, &got_save, &want_save, &init_masters);
    assert_close("at the end", kind, &masters(kind, &last, &last_state), &want_last, &init_masters);

    // 1 -> 2 ranks: the one-process state after SAVE_AFTER steps, continued on two.
    let m = tiny(kind);
    tch::no_grad(|| {
        for ((_, mut t), (_, w)) in m.named_parameters().unwrap().into_iter().zip(&single.at_save) {
            t.copy_(w);
        }
    });
    let mut resumed = FullShard::new(m.named_parameters().unwrap(), LAYERS, settings(), false, &g).unwrap();
    resumed.load(&single.state).unwrap();
    assert_eq!(resumed.optimizer().step_count(), SAVE_AFTER as i64);
    sharded_steps(&m, &mut resumed, &g, SAVE_AFTER..STEPS);
    let resumed_weights = gathered(&resumed, &g);
    let resumed_state = dir.join("resumed_last.safetensors");
    resumed.save(&g, &resumed_state).unwrap();
    g.barrier().unwrap();
    let got = masters(kind, &resumed_weights, &resumed_state);
    assert_close("resumed on two ranks", kind, &got, &want_last, &init_masters);

    // 2 -> 1: the two ranks' state and weights, continued in one process.
    g.barrier().unwrap();
    let m = tiny(kind);
    tch::no_grad(|| {
        let saved: HashMap<String, Tensor> = at_save.into_iter().collect();
        for (name, mut t) in m.named_parameters().unwrap() {
            t.copy_(&saved[&name]);
        }
    });
    let mut adamw = AdamW::new(m.named_parameters().unwrap(), settings()).unwrap();
    adamw.load(&state).unwrap();
    single_steps(&m, &mut adamw, SAVE_AFTER..STEPS, &mut Vec::new());
    let got: Vec<(String, Tensor)> = adamw.master_weights();
    assert_close("resumed in one process", kind, &got, &want_last, &init_masters);
}

fn two_ranks(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::server("127.0.0.1", 0, TIMEOUT).unwrap();
    let ranks: Vec<Vec<(String, String)>> = (0..2)
        .map(|rank| {
            vec![
                var("TRINITY_ZERO3_KIND", kind),
                var("TRINITY_ZERO3_RANK", rank),
                var("TRINITY_ZERO3_PORT", store.port()),
                var("TRINITY_ZERO3_DIR", dir.path().display()),
            ]
        })
        .collect();
    let outcomes = run_ranks("optimizer::zero3::tests::rank", &ranks, TIMEOUT * 2);
    assert_all_succeeded(&outcomes);
    for line in outcomes[0].output.lines().filter(|l| l.contains("from one process")) {
        println!("{kind}: {line}");
    }
}

/// Two Gloo ranks under stage 3 train as one process on rows of unequal length whose micro-batches differ
/// between the ranks (one rank idles through a pass), within 2% of what training moved each parameter; each
/// step's forward-only loss over the shares is the one-process loss; a state saved on two ranks continues in
/// one process and a one-process state on two ranks.
#[test]
fn two_ranks_train_as_one_process_in_fp32() {
    two_ranks("fp32");
}

/// [`two_ranks_train_as_one_process_in_fp32`] with bf16 parameters and fp32 masters.
#[test]
fn two_ranks_train_as_one_process_in_bf16() {
    two_ranks("bf16");
}

/// A group of one process, in this process.
fn alone() -> (Store, ProcessGroup) {
    let store = Store::server("127.0.0.1", 0, TIMEOUT).unwrap();
    let options = GroupOptions { timeout: TIMEOUT, ..GroupOptions::default() };
    let group = ProcessGroup::new(&store.with_prefix("alone").unwrap(), 0, 1, &options).unwrap();
    (store, group)
}

/// A forward-only pass gives the whole model's loss, bit for bit on one rank, and keeps no graph past the pass
/// (its backward would read freed parameters); a training pass of a decoder that keeps its activations is refused
/// before a layer computes, naming the cause.
#[test]
fn misuse_is_refused_and_a_forward_only_pass_is_exact() {
    let (_store, g) = alone();
    let rows = rows();
    let whole = tiny(Kind::Float);
    let want = tch::no_grad(|| loss(&whole, &rows, tokens(&rows)).double_value(&[]));
    let mut m = twin(&whole);
    let mut fs = FullShard::new(m.named_parameters().unwrap(), LAYERS, settings(), false, &g).unwrap();
    let got = fs.pass(&g, false, || tch::no_grad(|| loss(&m, &rows, tokens(&rows)).double_value(&[]))).unwrap();
    assert_eq!(got, want);

    // A forward-only pass runs without autograd, so no graph outlives it.
    let kept = fs.pass(&g, false, || loss(&m, &rows, tokens(&rows))).unwrap();
    assert!(!kept.requires_grad());
    assert!(m.named_parameters().unwrap().iter().all(|(_, t)| t.numel() == 0));

    // Activations kept: the layers' parameters are gone when the backward needs them.
    m.set_recompute_activations(false).unwrap();
    let outcome = fs.pass(&g, true, || m.forward_hidden(&Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]), None));
    let refused = match outcome {
        Err(e) => e.to_string(),
        Ok(Err(e)) => e.to_string(),
        Ok(Ok(_)) => panic!("a training pass without recomputation went through"),
    };
    assert!(refused.contains("activation recomputation on"), "{refused}");
}

/// On one rank, with clipping out of reach (the norm's sum runs in another order), stage 3 trains bit for bit
/// as plain AdamW on the whole model, with the prefetch on or off: the gathers, frees and reduce-scatters change
/// no number.
#[test]
fn one_rank_trains_bit_for_bit_as_the_whole_model() {
    let (_store, g) = alone();
    let rows = rows();
    let total = tokens(&rows);
    let whole = tiny(Kind::Float);
    let start = twin(&whole);
    let mut adamw = AdamW::new(whole.named_parameters().unwrap(), settings()).unwrap();
    for _ in 0..2 {
        for micro in rows.chunks(MICRO_ROWS) {
            loss(&whole, micro, total).backward();
        }
        adamw.clip_grad_norm(1e9).unwrap();
        adamw.step(LR).unwrap();
        adamw.zero_grad();
    }
    let want = weights(&whole);
    for prefetch in [true, false] {
        let m = twin(&start);
        let mut fs = FullShard::new(m.named_parameters().unwrap(), LAYERS, settings(), false, &g).unwrap();
        fs.set_prefetch(prefetch);
        for _ in 0..2 {
            for micro in rows.chunks(MICRO_ROWS) {
                fs.pass(&g, true, || loss(&m, micro, total).backward()).unwrap();
            }
            fs.step(&g, 1e9, LR).unwrap();
        }
        let got: HashMap<String, Tensor> = gathered(&fs, &g).into_iter().collect();
        for (name, w) in &want {
            assert!(got[name].equal(w), "prefetch {prefetch}: {name} differs from the whole model's");
        }
    }
}

/// A frozen model's layout (the KL reference under stage 3): a forward-only pass gives the whole fp32 model's
/// loss bit for bit, nothing stays whole between passes, it holds no optimizer state, and what would train it (a
/// training pass, idle or not, a step, a state file) is refused by name.
#[test]
fn a_frozen_layout_scores_as_the_whole_model_and_refuses_to_train() {
    let (_store, g) = alone();
    let rows = rows();
    let whole = tiny(Kind::Float);
    let want = tch::no_grad(|| loss(&whole, &rows, tokens(&rows)).double_value(&[]));
    let mut m = twin(&whole);
    m.var_store_mut().freeze();
    let mut fs = FullShard::frozen(m.named_parameters().unwrap(), LAYERS, &g).unwrap();
    assert!(fs.is_frozen());
    assert!(m.named_parameters().unwrap().iter().all(|(_, t)| t.numel() == 0), "the whole parameters are freed");
    for _ in 0..2 {
        let got = fs.pass(&g, false, || loss(&m, &rows, tokens(&rows)).double_value(&[])).unwrap();
        assert_eq!(got, want);
        fs.idle_pass(&g, false).unwrap();
    }
    let memory = fs.memory();
    assert_eq!((memory.optimizer_state, memory.gradient_shards), (0, 0));
    let elements: i64 = whole.named_parameters().unwrap().iter().map(|(_, t)| t.numel() as i64).sum();
    assert_eq!(memory.parameter_shards, 4 * elements, "one rank's shards are the whole fp32 model");
    let dir = tempfile::tempdir().unwrap();
    let refusals = [
        fs.pass(&g, true, || ()).map(|_| ()).unwrap_err(),
        fs.idle_pass(&g, true).unwrap_err(),
        fs.step(&g, 1.0, LR).map(|_| ()).unwrap_err(),
        fs.save(&g, &dir.path().join("state.safetensors")).unwrap_err(),
    ];
    for e in refusals {
        assert!(e.to_string().contains("the sharded model is frozen"), "{e}");
    }
}
