//! Where a decode step's time goes: the model's decode steps timed in parts (layers, LM head, greedy sampling),
//! the layers split into their matmuls and attention by timing those ops alone at the same shapes, and the
//! memory-bandwidth floor (weight bytes read per step / read bandwidth from a plain reduction over a buffer much
//! larger than the caches).
//!
//! `cargo run --release -p trinity-model --example decode_profile -- --model FILE.gguf [--dtype f32|bf16]
//! [--batch 1] [--threads 2] [--prompt-tokens 48] [--new-tokens 128] [--no-pack] [--isa amx|avx512|avx512core|avx2]`
//!
//! `--no-pack` skips `prepare_decode`, so the step runs libtorch's kernels: the packed kernels' gain on this CPU.
//! `--isa` packs for that instruction set instead of the fastest one the CPU has, to compare two sets' kernels
//! in one binary.
//!
//! The step is the engine's: `forward_with_cache` on B one-token rows, `logits`, then the greedy path of the
//! engine's sampler (f32 log-softmax, argmax, gather, one host copy) repeated here with the same ops. The engine
//! adds its scheduling around that; its own decode tok/s (`trinity generate`) minus these parts is that overhead.

use std::path::PathBuf;
use std::time::Instant;

use tch::{Device, Kind, Tensor};

type Error = Box<dyn std::error::Error>;

struct Args {
    model: PathBuf,
    dtype: String,
    batch: i64,
    threads: i32,
    prompt_tokens: i64,
    new_tokens: i64,
    no_pack: bool,
    isa: Option<trinity_model::PackedIsa>,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        model: PathBuf::new(),
        dtype: "f32".into(),
        batch: 1,
        threads: 2,
        prompt_tokens: 48,
        new_tokens: 128,
        no_pack: false,
        isa: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--no-pack" {
            args.no_pack = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--model" => args.model = value.into(),
            "--dtype" => args.dtype = value,
            "--batch" => args.batch = value.parse()?,
            "--threads" => args.threads = value.parse()?,
            "--prompt-tokens" => args.prompt_tokens = value.parse()?,
            "--new-tokens" => args.new_tokens = value.parse()?,
            "--isa" => {
                use trinity_model::PackedIsa as Isa;
                args.isa = Some(match value.as_str() {
                    "amx" => Isa::Amx,
                    "avx512" => Isa::Avx512,
                    "avx512core" => Isa::Avx512Core,
                    "avx2" => Isa::Avx2,
                    _ => return Err(format!("--isa {value}: expected amx, avx512, avx512core or avx2").into()),
                })
            }
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    if args.model.as_os_str().is_empty() {
        return Err("--model FILE is required".into());
    }
    Ok(args)
}

/// Seconds per call of `f`, the median of `reps` timed calls after one untimed call.
fn time_median(reps: usize, mut f: impl FnMut() -> Result<(), Error>) -> Result<f64, Error> {
    f()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[reps / 2])
}

/// The engine's greedy sampling for rows that need neither banned ids nor top logprobs (`sampling::sample`).
fn greedy(logits: &Tensor) -> Result<Vec<f32>, Error> {
    let logp = logits.f_to_kind(Kind::Float)?.f_log_softmax(-1, Kind::Float)?;
    let ids = logp.shallow_clone().f_argmax(-1, false)?;
    let lp = logp.f_gather(-1, &ids.f_unsqueeze(-1)?, false)?.f_squeeze_dim(-1)?;
    let both = Tensor::f_stack(&[ids.f_to_kind(Kind::Float)?, lp], 0)?;
    Ok(Vec::try_from(both.f_flatten(0, -1)?)?)
}

fn main() -> Result<(), Error> {
    let args = parse_args()?;
    tch::set_num_threads(args.threads);
    let kind = trinity_model::parse_kind(&args.dtype)?;
    let mut model = trinity_model::load_model(&args.model, kind, Device::Cpu)?;
    let isa = args.isa.or_else(|| trinity_model::PackedIsa::best(kind));
    let packed = match (args.no_pack, isa) {
        (false, Some(isa)) => model.decoder.prepare_decode_on(isa)?,
        _ => false,
    };
    if let (false, Some(isa), false) = (args.no_pack, isa, packed) {
        return Err(format!("this CPU cannot run the {isa:?} kernels on {} weights", args.dtype).into());
    }
    let decoder = &model.decoder;
    let config = decoder.config().clone();
    let (b, p, n) = (args.batch, args.prompt_tokens, args.new_tokens);
    let capacity = (p + n) as usize;
    let mut cache = decoder.new_cache(b as usize, capacity)?;
    let slots: Vec<usize> = (0..b as usize).collect();

    // Prefill B distinct prompts, then decode N-1 steps as the engine does (the first new token comes from the
    // prefill's logits).
    let prompt: Vec<i64> = (0..b * p).map(|i| 1000 + (i * 7919) % 20000).collect();
    let prompt = Tensor::from_slice(&prompt).f_view([b, p])?;
    let hidden =
        tch::no_grad(|| decoder.forward_with_cache(&prompt, &mut cache, &slots, &vec![p as usize; b as usize]))?;
    let last = decoder.last_hidden(&hidden, &vec![p as usize; b as usize])?;
    let mut next = greedy(&tch::no_grad(|| decoder.logits(&last))?)?;
    let (mut layers_s, mut head_s, mut sample_s) = (Vec::new(), 0.0, 0.0);
    for _ in 1..n {
        let ids: Vec<i64> = next[..b as usize].iter().map(|&t| t as i64).collect();
        let ids = Tensor::from_slice(&ids).f_view([b, 1])?;
        let start = Instant::now();
        let hidden = tch::no_grad(|| decoder.forward_with_cache(&ids, &mut cache, &slots, &vec![1; b as usize]))?;
        let layers_done = Instant::now();
        let logits = tch::no_grad(|| decoder.logits(&hidden.f_squeeze_dim(1)?))?;
        let head_done = Instant::now();
        next = greedy(&logits)?;
        sample_s += head_done.elapsed().as_secs_f64();
        head_s += (head_done - layers_done).as_secs_f64();
        layers_s.push((layers_done - start).as_secs_f64());
    }
    let steps = (n - 1) as f64;
    let layers_total: f64 = layers_s.iter().sum();
    let step = (layers_total + head_s + sample_s) / steps;

    // The layers' matmuls alone: each layer's seven projections on B rows, in the dtype the step computes in.
    let compute = if packed { Kind::Float } else { kind };
    let vars = decoder.var_store().variables();
    let weight = |name: String| vars.get(&name).map(|t| t.f_to_kind(compute)).ok_or(format!("no weight {name}"));
    let mut projections = Vec::new();
    for i in 0..config.num_hidden_layers {
        for name in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
            .into_iter()
            .chain(["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"])
        {
            projections.push(weight(format!("model.layers.{i}.{name}.weight"))??);
        }
    }
    let x = Tensor::f_randn([b, config.hidden_size], (compute, Device::Cpu))?;
    let xi = Tensor::f_randn([b, config.intermediate_size], (compute, Device::Cpu))?;
    let matmul = time_median(9, || {
        tch::no_grad(|| -> Result<(), Error> {
            for w in &projections {
                let input = if w.size()[1] == config.hidden_size { &x } else { &xi };
                let _ = input.f_linear::<Tensor>(w, None)?;
            }
            Ok(())
        })
    })?;

    // Attention alone at the mean cache length of the decode steps: the libtorch path's GQA-folded
    // scaled_dot_product_attention and its two cache writes, per layer.
    let (kvh, hd) = (config.num_key_value_heads, config.head_dim);
    let groups = config.num_attention_heads / kvh;
    let mean_len = p + n / 2;
    let cache_kind = if packed { Kind::Float } else { kind };
    let keys = Tensor::f_randn([b, kvh, capacity as i64 + 1, hd], (cache_kind, Device::Cpu))?;
    let values = keys.f_randn_like()?;
    let q = Tensor::f_randn([b, kvh, groups, hd], (cache_kind, Device::Cpu))?;
    let kv_new = Tensor::f_randn([b, 1, kvh, hd], (cache_kind, Device::Cpu))?;
    let mask = Tensor::f_ones([b, 1, 1, mean_len], (Kind::Bool, Device::Cpu))?;
    let rows = Tensor::from_slice(&(0..b).collect::<Vec<i64>>()).f_view([b, 1])?;
    let cols = Tensor::from_slice(&vec![mean_len - 1; b as usize]).f_view([b, 1])?;
    let attention = time_median(9, || {
        tch::no_grad(|| -> Result<(), Error> {
            for _ in 0..config.num_hidden_layers {
                let (mut k, mut v) = (keys.shallow_clone(), values.shallow_clone());
                let _ = k.f_index_put_(&[Some(&rows), None, Some(&cols)], &kv_new, false)?;
                let _ = v.f_index_put_(&[Some(&rows), None, Some(&cols)], &kv_new, false)?;
                let k = keys.f_narrow(2, 0, mean_len)?;
                let v = values.f_narrow(2, 0, mean_len)?;
                let _ = Tensor::f_scaled_dot_product_attention(&q, &k, &v, Some(&mask), 0.0, false, None, false)?;
            }
            Ok(())
        })
    })?;

    // Bandwidth: a sum over 512 MiB reads it once (what a matmul does with its weights); a copy reads and writes.
    let big = Tensor::f_ones([128 << 20], (Kind::Float, Device::Cpu))?;
    let bytes = (128u64 << 20) as f64 * 4.0;
    let read = bytes
        / time_median(5, || {
            let _sum = big.f_sum(Kind::Float)?;
            Ok(())
        })?;
    let mut dst = big.f_zeros_like()?;
    let copy = 2.0 * bytes
        / time_median(5, || {
            let () = dst.f_copy_(&big)?;
            Ok(())
        })?;
    drop(dst);

    // Bytes a decode step must read at least: every projection and the LM head once (the embedding lookup reads
    // B rows), in the dtype the weights are kept in (a packed bf16 model keeps bf16 weights).
    let elem = if kind == Kind::BFloat16 { 2.0 } else { 4.0 };
    let proj_params: i64 = projections.iter().map(Tensor::numel).map(|n| n as i64).sum();
    let head_params = config.vocab_size * config.hidden_size;
    let weight_bytes = (proj_params + head_params) as f64 * elem;
    let floor = weight_bytes / read;

    let ms = |s: f64| s * 1e3;
    let layers = layers_total / steps;
    println!(
        "decode profile: {} ({}), batch {b}, {p}-token prompts, {n} new tokens, {} threads, packed decode {packed}{}",
        args.model.display(),
        args.dtype,
        args.threads,
        if packed { format!(" ({:?})", isa.expect("packed on a set")) } else { String::new() }
    );
    println!("  step {:.2} ms = {:.1} tok/s (before the engine's scheduling)", ms(step), b as f64 / step);
    if packed {
        // The fused step does its matmuls and attention in one call; the libtorch ops are what it replaces.
        println!(
            "    layers {:.2} ms (fused step); libtorch alone at the same shapes: matmuls {:.2} ms, attention + \
             cache writes {:.2} ms (at length {mean_len})",
            ms(layers),
            ms(matmul),
            ms(attention)
        );
    } else {
        println!(
            "    layers {:.2} ms: matmuls {:.2} ms, attention + cache writes {:.2} ms (at length {mean_len}), \
             norms/RoPE/activations/dispatch {:.2} ms",
            ms(layers),
            ms(matmul),
            ms(attention),
            ms(layers - matmul - attention)
        );
    }
    println!("    LM head {:.2} ms, greedy sampling {:.2} ms", ms(head_s / steps), ms(sample_s / steps));
    let first = layers_s.iter().take(8).sum::<f64>() / 8.0;
    let last = layers_s.iter().rev().take(8).sum::<f64>() / 8.0;
    println!("    layers at the first 8 steps {:.2} ms, at the last 8 {:.2} ms", ms(first), ms(last));
    println!(
        "  bandwidth: read {:.1} GB/s (sum), copy {:.1} GB/s (read + write); weights read per step {:.0} MB \
         → floor {:.2} ms/step = {:.1} tok/s at batch {b}; step at {:.0}% of the floor's speed",
        read / 1e9,
        copy / 1e9,
        weight_bytes / 1e6,
        ms(floor),
        b as f64 / floor,
        100.0 * floor / step
    );
    Ok(())
}
