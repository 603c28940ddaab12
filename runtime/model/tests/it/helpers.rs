//! Small shared helpers: fixture paths and JSON comparisons.

use std::path::PathBuf;

use serde_json::Value;
use tch::Tensor;

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

pub fn ints(v: &Value) -> Vec<i64> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

pub fn ids_tensor(v: &Value) -> Tensor {
    let rows: Vec<Vec<i64>> = v.as_array().unwrap().iter().map(ints).collect();
    let (b, t) = (rows.len() as i64, rows[0].len() as i64);
    Tensor::from_slice(&rows.concat()).view([b, t])
}

/// Largest |a - b| over the positions where `mask` (shape [B, T]) is 1; logits are [B, T, V] flattened.
pub fn masked_max_diff(got: &Tensor, expected: &[f32], mask: &Value) -> f64 {
    let got: Vec<f32> = Vec::try_from(got.flatten(0, -1)).unwrap();
    assert_eq!(got.len(), expected.len());
    let mask: Vec<i64> = mask.as_array().unwrap().iter().flat_map(ints).collect();
    let v = got.len() / mask.len();
    let mut worst = 0f64;
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        if mask[i / v] == 1 {
            worst = worst.max((g - e).abs() as f64);
        }
    }
    worst
}
