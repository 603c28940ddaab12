//! The experts a mixture-of-experts rollout routed each token to, stored compactly for routing replay.
//!
//! Trinity-RFT's `Experience.routed_experts` is a `[seq_length - 1, layers, top_k]` tensor (every token the
//! rollout model read: the prompt and the response but its last token) that its trainer forces the policy's
//! routers to use (`algorithm.enable_router_replay`). A 30B-A3B rollout of 4,096 tokens holds 4,096 × 48 × 8 =
//! 1.6 M ids, so JSON numbers (2–4 bytes each) would dwarf the rest of the experience: the ids are stored as
//! bytes, one a byte when every id is below 256 (Trinity-RFT's `uint8`, what its trainer casts to when the
//! largest id allows), else two (little-endian `uint16`), base64 in the JSON payload that every store writes.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `[tokens, layers, top_k]` expert ids, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedExperts {
    /// Sparse layers a token row covers.
    pub layers: usize,
    /// Experts each token is routed to in each layer, best first.
    pub top_k: usize,
    /// `tokens × layers × top_k` ids.
    pub ids: Vec<u16>,
}

impl RoutedExperts {
    /// Token rows held.
    pub fn tokens(&self) -> usize {
        self.ids.len() / (self.layers * self.top_k).max(1)
    }

    /// Whether `ids` holds whole token rows of a non-empty layout.
    pub fn is_well_formed(&self) -> bool {
        self.layers > 0 && self.top_k > 0 && self.ids.len().is_multiple_of(self.layers * self.top_k)
    }

    /// The storage dtype: `uint8` when every id fits a byte.
    pub fn dtype(&self) -> &'static str {
        if self.ids.iter().all(|&e| e <= u16::from(u8::MAX)) { "uint8" } else { "uint16" }
    }
}

/// The stored form.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    layers: usize,
    top_k: usize,
    dtype: String,
    data: String,
}

impl Serialize for RoutedExperts {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let dtype = self.dtype();
        let bytes: Vec<u8> = if dtype == "uint8" {
            self.ids.iter().map(|&e| e as u8).collect()
        } else {
            self.ids.iter().flat_map(|e| e.to_le_bytes()).collect()
        };
        Stored { layers: self.layers, top_k: self.top_k, dtype: dtype.to_owned(), data: STANDARD.encode(bytes) }
            .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RoutedExperts {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let stored = Stored::deserialize(deserializer)?;
        let bytes = STANDARD.decode(&stored.data).map_err(|e| D::Error::custom(format!("routed_experts.data: {e}")))?;
        let ids = match stored.dtype.as_str() {
            "uint8" => bytes.into_iter().map(u16::from).collect(),
            "uint16" if bytes.len().is_multiple_of(2) => {
                bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect()
            }
            "uint16" => return Err(D::Error::custom("routed_experts.data: an odd number of bytes for uint16 ids")),
            other => {
                return Err(D::Error::custom(format!("routed_experts.dtype `{other}` (expected uint8 or uint16)")));
            }
        };
        Ok(RoutedExperts { layers: stored.layers, top_k: stored.top_k, ids })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_below_256_take_a_byte_each_and_larger_ones_two() {
        let small = RoutedExperts { layers: 2, top_k: 2, ids: vec![0, 3, 255, 7, 1, 2, 4, 5] };
        let text = serde_json::to_string(&small).unwrap();
        assert_eq!(small.dtype(), "uint8");
        assert!(text.contains("\"uint8\""), "{text}");
        assert_eq!(serde_json::from_str::<RoutedExperts>(&text).unwrap(), small);
        assert_eq!(small.tokens(), 2);

        let large = RoutedExperts { layers: 1, top_k: 2, ids: vec![256, 4095, 0, 1] };
        let text = serde_json::to_string(&large).unwrap();
        assert!(text.contains("\"uint16\""), "{text}");
        assert_eq!(serde_json::from_str::<RoutedExperts>(&text).unwrap(), large);
    }

    #[test]
    fn a_long_rollout_is_stored_in_about_a_byte_and_a_third_an_id() {
        // 500 tokens of a 48-layer, top-8, 128-expert model.
        let ids: Vec<u16> = (0..500u32 * 48 * 8).map(|i| (i.wrapping_mul(2654435761) >> 25) as u16).collect();
        let n = ids.len();
        let routed = RoutedExperts { layers: 48, top_k: 8, ids };
        let text = serde_json::to_string(&routed).unwrap();
        assert!(text.len() < n * 4 / 3 + 100, "{} bytes for {n} ids", text.len());
    }

    #[test]
    fn malformed_stored_forms_are_refused_with_the_field() {
        let bad = |text: &str| serde_json::from_str::<RoutedExperts>(text).unwrap_err().to_string();
        assert!(bad(r#"{"layers":1,"top_k":1,"dtype":"int8","data":""}"#).contains("int8"));
        assert!(bad(r#"{"layers":1,"top_k":1,"dtype":"uint16","data":"AA=="}"#).contains("odd"));
        assert!(bad(r#"{"layers":1,"top_k":1,"dtype":"uint8","data":"!!"}"#).contains("routed_experts.data"));
    }
}
