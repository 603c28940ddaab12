//! HF directories: full load (tokenizer, template, generation config), save, and the exact round trip.

use tch::{Device, Kind};
use trinity_model::{SafetensorsWeights, convert_gguf_to_hf, load_model, save_hf_dir};

use crate::helpers::*;

#[test]
fn loads_tokenizer_template_and_eos_from_an_hf_dir() {
    let dir = fixtures().join("tiny/llama_tied");
    let model = load_model(&dir, Kind::Float, Device::Cpu).unwrap();
    let expected = read_json(&dir.join("expected.json"));
    let text = expected["tokenizer"]["text"].as_str().unwrap();
    let ids: Vec<i64> = model.tokenizer.encode(text, false).unwrap().into_iter().map(i64::from).collect();
    assert_eq!(ids, ints(&expected["tokenizer"]["ids"]));
    let rendered = model
        .chat_template
        .as_ref()
        .unwrap()
        .render(expected["chat"]["messages"].as_array().unwrap(), true, None)
        .unwrap();
    assert_eq!(rendered, expected["chat"]["rendered"].as_str().unwrap());
    assert_eq!(model.eos_token_ids, vec![2]);
    assert_eq!(model.tokenizer.eos_token(), Some("<|im_end|>"));
}

#[test]
fn hf_round_trip_is_exact() {
    for name in ["llama_tied", "qwen3_qk_norm"] {
        let src = fixtures().join("tiny").join(name);
        let out = tempfile::tempdir().unwrap();
        let staged = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&src).unwrap() {
            let p = entry.unwrap().path();
            std::fs::copy(&p, staged.path().join(p.file_name().unwrap())).unwrap();
        }
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            if !staged.path().join(f).exists() {
                std::fs::copy(fixtures().join("tiny/llama_tied").join(f), staged.path().join(f)).unwrap();
            }
        }
        let model = load_model(staged.path(), Kind::Float, Device::Cpu).unwrap();
        save_hf_dir(&model, out.path()).unwrap();
        let a = SafetensorsWeights::open_dir(&src).unwrap();
        let b = SafetensorsWeights::open_dir(out.path()).unwrap();
        let mut names_a = a.names();
        names_a.retain(|n| !(n == "lm_head.weight" && model.decoder.config().tie_word_embeddings));
        assert_eq!(names_a, b.names(), "{name}");
        for n in b.names() {
            assert!(a.get(&n).unwrap().equal(&b.get(&n).unwrap()), "{name}: tensor {n} changed");
        }
        let again = load_model(out.path(), Kind::Float, Device::Cpu).unwrap();
        assert_eq!(again.decoder.config().family, model.decoder.config().family);
        assert_eq!(again.decoder.config().rope_scaling, model.decoder.config().rope_scaling);
        assert_eq!(again.eos_token_ids, model.eos_token_ids);
        assert_eq!(
            again.chat_template.as_ref().map(|t| t.source().to_owned()),
            model.chat_template.as_ref().map(|t| t.source().to_owned())
        );
    }
}

#[test]
fn gguf_to_hf_conversion_reproduces_the_gguf_model() {
    let out = tempfile::tempdir().unwrap();
    convert_gguf_to_hf(&fixtures().join("tiny_llama.gguf"), out.path()).unwrap();
    let gguf = load_model(&fixtures().join("tiny_llama.gguf"), Kind::Float, Device::Cpu).unwrap();
    let hf = load_model(out.path(), Kind::Float, Device::Cpu).unwrap();
    let ids = tch::Tensor::from_slice(&[5i64, 9, 3, 17]).view([1, 4]);
    let a = gguf.decoder.forward(&ids, None).unwrap();
    let b = hf.decoder.forward(&ids, None).unwrap();
    assert!(a.equal(&b));
    // And the converted weights equal the original HF model's (the GGUF was written from it).
    let orig = SafetensorsWeights::open_dir(&fixtures().join("tiny/llama_tied")).unwrap();
    let conv = SafetensorsWeights::open_dir(out.path()).unwrap();
    for n in conv.names() {
        assert!(orig.get(&n).unwrap().equal(&conv.get(&n).unwrap()), "tensor {n} differs");
    }
}
