//! Qwen2.5-VL against transformers (`tiny/qwen2_5_vl`, made by `make_fixtures.py qwen2_5_vl`): the image
//! processor's pixel values and grids, the vision tower's output, the 3-D rope positions and the full model's
//! logits for a prompt holding an image, all in fp32.

use std::path::PathBuf;

use tch::{Device, Kind, Tensor};
use trinity_model::SafetensorsWeights;
use trinity_model::vision::{ImageProcessor, Qwen25Vl, mrope};

use crate::helpers::fixtures;

fn dir() -> PathBuf {
    fixtures().join("tiny/qwen2_5_vl")
}

fn expected() -> SafetensorsWeights {
    SafetensorsWeights::open_files(&[dir().join("vl_expected.safetensors")]).unwrap()
}

fn bytes(t: &Tensor) -> (Vec<u8>, usize, usize) {
    let size = t.size();
    let v: Vec<i64> = Vec::try_from(t.flatten(0, -1)).unwrap();
    (v.into_iter().map(|x| x as u8).collect(), size[0] as usize, size[1] as usize)
}

fn grid(t: &Tensor) -> [i64; 3] {
    let v: Vec<i64> = Vec::try_from(t.flatten(0, -1)).unwrap();
    [v[0], v[1], v[2]]
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a.to_kind(Kind::Float) - b.to_kind(Kind::Float)).abs().max().double_value(&[])
}

#[test]
fn preprocessing_matches_the_image_processor() {
    let e = expected();
    let cases = [
        ("image", "pixel_values", "image_grid_thw", ImageProcessor::default()),
        (
            "small_image",
            "small_pixel_values",
            "small_image_grid_thw",
            ImageProcessor { min_pixels: 784, max_pixels: 2352, ..ImageProcessor::default() },
        ),
    ];
    for (image, pixels, grid_name, processor) in cases {
        let (rgb, h, w) = bytes(&e.get(image).unwrap());
        let out = processor.preprocess(&rgb, h, w).unwrap();
        assert_eq!(out.grid_thw, grid(&e.get(grid_name).unwrap()), "{image}");
        // Pillow's resize reproduced byte for byte, then the same f64 rescale and f32 normalize: equal bits.
        let diff = max_diff(&out.pixel_values, &e.get(pixels).unwrap());
        assert_eq!(diff, 0.0, "{image}: pixel values differ");
    }
}

#[test]
fn vision_tower_positions_and_logits_match_transformers() {
    let e = expected();
    let vl = Qwen25Vl::load_dir(&dir(), Kind::Float, Device::Cpu).unwrap();
    let pixels = e.get("pixel_values").unwrap();
    let grids = [grid(&e.get("image_grid_thw").unwrap())];
    let vision = vl.vision.forward(&pixels, &grids).unwrap();
    let diff = max_diff(&vision, &e.get("vision_output").unwrap());
    assert!(diff < 1e-4, "vision output differs by {diff}");

    let ids = e.get("input_ids").unwrap();
    let (positions, deltas) = mrope::batch_positions(&vl.config, &ids, None, &grids).unwrap();
    assert_eq!(max_diff(&positions, &e.get("position_ids").unwrap()), 0.0);
    assert_eq!(deltas, vec![12 - 20]);

    let logits = vl.forward(&ids, None, Some((&pixels, &grids))).unwrap();
    let diff = max_diff(&logits, &e.get("logits").unwrap());
    assert!(diff < 1e-4, "logits differ by {diff}");

    // Left padding changes nothing at the real tokens.
    let t = ids.size()[1];
    let padded = Tensor::cat(&[Tensor::zeros([1, 3], (Kind::Int64, Device::Cpu)), ids.shallow_clone()], 1);
    let mask = Tensor::cat(
        &[Tensor::zeros([1, 3], (Kind::Int64, Device::Cpu)), Tensor::ones([1, t], (Kind::Int64, Device::Cpu))],
        1,
    );
    let logits = vl.forward(&padded, Some(&mask), Some((&pixels, &grids))).unwrap().narrow(1, 3, t);
    let diff = max_diff(&logits, &e.get("logits").unwrap());
    assert!(diff < 1e-4, "left-padded logits differ by {diff}");

    // Placeholders without images, and images without placeholders, are errors.
    assert!(vl.forward(&ids, None, None).unwrap_err().to_string().contains("no images"));
    let text = Tensor::from_slice(&[1i64, 5, 7]).view([1, 3]);
    assert!(vl.forward(&text, None, Some((&pixels, &grids))).is_err());
}

#[test]
fn a_text_only_prompt_is_the_plain_decoder() {
    let vl = Qwen25Vl::load_dir(&dir(), Kind::Float, Device::Cpu).unwrap();
    let ids = Tensor::from_slice(&[1i64, 5, 9, 3, 17, 22]).view([1, 6]);
    let ours = vl.forward(&ids, None, None).unwrap();
    let plain = vl.decoder.forward(&ids, None).unwrap();
    assert!(max_diff(&ours, &plain) < 1e-6);
}

#[test]
fn bf16_model_stays_close_to_f32() {
    let e = expected();
    let vl = Qwen25Vl::load_dir(&dir(), Kind::BFloat16, Device::Cpu).unwrap();
    let pixels = e.get("pixel_values").unwrap();
    let grids = [grid(&e.get("image_grid_thw").unwrap())];
    let ids = e.get("input_ids").unwrap();
    let vision = vl.vision.forward(&pixels, &grids).unwrap();
    assert_eq!(vision.kind(), Kind::BFloat16);
    let diff = max_diff(&vision, &e.get("vision_output").unwrap());
    assert!(diff < 0.1, "bf16 vision output differs by {diff}");
    let logits = vl.forward(&ids, None, Some((&pixels, &grids))).unwrap();
    let diff = max_diff(&logits, &e.get("logits").unwrap());
    assert!(diff < 0.1, "bf16 logits differ by {diff}");
}

/// Gradients reach the text decoder through a prompt with an image, and recomputing the layers in the backward
/// gives the same ones.
#[test]
fn gradients_flow_through_an_image_prompt_and_recompute_agrees() {
    let e = expected();
    let pixels = e.get("pixel_values").unwrap();
    let grids = [grid(&e.get("image_grid_thw").unwrap())];
    let ids = e.get("input_ids").unwrap();
    let mut grads = Vec::new();
    let modes = if trinity_model::activation_recompute_available() { vec![false, true] } else { vec![false] };
    for recompute in modes {
        let mut vl = Qwen25Vl::load_dir(&dir(), Kind::Float, Device::Cpu).unwrap();
        vl.decoder.set_recompute_activations(recompute).unwrap();
        let logits = vl.forward(&ids, None, Some((&pixels, &grids))).unwrap();
        logits.square().sum(Kind::Float).backward();
        let vars = vl.decoder.var_store().variables();
        let g = vars["model.layers.0.self_attn.q_proj.weight"].grad();
        assert!(g.abs().max().double_value(&[]) > 0.0, "no gradient (recompute {recompute})");
        grads.push(g.copy());
    }
    for g in &grads[1..] {
        assert!(max_diff(g, &grads[0]) < 1e-5, "recomputed gradients differ");
    }
}

#[test]
fn the_text_only_loader_says_where_a_vl_model_loads() {
    let err = trinity_model::load_model(&dir(), Kind::Float, Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("config.json") && err.contains("vision::Qwen25Vl"), "{err}");
}
