//! How an experience is stored in a database row: its JSON, zstd-compressed, as a BLOB / `bytea`.
//!
//! The indexed columns (producer, uid, group, model version, reward, claim state) stay plain; only the payload
//! (token ids, logprobs, masks, advantages, texts) is compressed. JSON keeps the payload readable by any tool
//! that can run `zstd -d`, and tolerant of added fields across versions. Rows written before compression (JSON
//! text in SQLite) still read: a payload that does not start with zstd's frame magic is taken as JSON.
//!
//! Measured on a realistic single-turn experience (the test `realistic_experience_shrinks` below: 200 prompt +
//! 300 response tokens drawn from a 49,152-token vocabulary, full-precision sampling logprobs, GRPO's one
//! advantage and return per response token, the prompt and response texts): 17,189 bytes of JSON are stored in
//! 4,937 bytes at zstd level 3, 29 % of the JSON (a 71 % saving). The sample is on the pessimistic side (token
//! ids and texts as varied as random ones; real text compresses better). Levels 1 / 9 / 19 give 5,088 / 4,779 /
//! 4,591 bytes, so the default level keeps nearly all of the gain.

use crate::error::{BufferError, Result};
use crate::experience::Experience;

/// zstd's default level: within 8 % of level 19's size on experiences (see the module docs), far faster.
const LEVEL: i32 = 3;

/// The first bytes of every zstd frame (0xFD2FB528, little-endian).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Serialises and compresses one experience.
pub(crate) fn encode(exp: &Experience) -> Result<Vec<u8>> {
    let json = serde_json::to_vec(exp).map_err(|source| BufferError::Encode { uid: exp.eid.uid(), source })?;
    zstd::bulk::compress(&json, LEVEL).map_err(|source| BufferError::Compress { uid: exp.eid.uid(), source })
}

/// Reads a stored payload: zstd-compressed JSON, or plain JSON text from before compression. The error is a
/// sentence for [`BufferError::CorruptRow`], which names the store and row.
pub(crate) fn decode(bytes: &[u8]) -> std::result::Result<Experience, String> {
    if bytes.starts_with(&ZSTD_MAGIC) {
        let json = zstd::decode_all(bytes).map_err(|e| format!("cannot decompress: {e}"))?;
        serde_json::from_slice(&json).map_err(|e| format!("invalid JSON after decompression: {e}"))
    } else {
        serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON: {e}"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::experience::Eid;

    /// A deterministic experience shaped like a real one: `prompt` + `response` tokens, logprobs mostly near 0
    /// with a tail of unlikely tokens, one advantage per response token, and the decoded texts.
    pub(crate) fn realistic_experience(prompt: usize, response: usize, seed: u64) -> Experience {
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mut next = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let tokens: Vec<u32> = (0..prompt + response).map(|_| next() % 49_152).collect();
        let logprobs: Vec<f32> = (0..response)
            .map(|_| {
                let u = (next() % 1_000_000) as f32 / 1_000_000.0 + 1e-6;
                // Most sampled tokens are likely (logprob near 0); a few are not.
                -(u.powi(4) * 8.0)
            })
            .collect();
        let eid = Eid { batch: seed, task: seed % 7, run: seed % 4, step: 0 };
        let mut exp = Experience::single_turn(eid, tokens, prompt, logprobs);
        exp.reward = 1.0;
        exp.advantages = Some(vec![0.8660254; response]);
        exp.returns = Some(vec![0.8660254; response]);
        // Texts as varied as the tokens: one pseudo-word per token id (real text compresses better).
        let text = |ids: &[u32]| ids.iter().map(|id| format!("w{id:x}")).collect::<Vec<_>>().join(" ");
        exp.prompt_text = Some(text(&exp.tokens[..prompt]));
        exp.response_text = Some(text(&exp.tokens[prompt..]));
        exp.info.insert("taskset".into(), "gsm8k".into());
        exp.metrics.insert("accuracy".into(), 1.0);
        exp
    }

    #[test]
    fn round_trips_and_reads_plain_json() {
        let exp = realistic_experience(20, 30, 1);
        let stored = encode(&exp).unwrap();
        assert!(stored.starts_with(&ZSTD_MAGIC));
        assert_eq!(decode(&stored).unwrap(), exp);
        let legacy = serde_json::to_vec(&exp).unwrap();
        assert_eq!(decode(&legacy).unwrap(), exp);
        assert!(decode(b"{half").unwrap_err().contains("invalid JSON"));
        let mut truncated = stored.clone();
        truncated.truncate(stored.len() / 2);
        assert!(decode(&truncated).unwrap_err().contains("decompress"));
    }

    #[test]
    fn routed_experts_round_trip_compactly() {
        let mut exp = realistic_experience(200, 300, 3);
        // 499 tokens read, 2 sparse layers, top 4 of 64 experts.
        let ids: Vec<u16> = (0..499u32 * 2 * 4).map(|i| (i.wrapping_mul(2654435761) >> 26) as u16).collect();
        exp.routed_experts = Some(crate::RoutedExperts { layers: 2, top_k: 4, ids });
        exp.validate().unwrap();
        let without = encode(&realistic_experience(200, 300, 3)).unwrap().len();
        let stored = encode(&exp).unwrap();
        assert_eq!(decode(&stored).unwrap(), exp);
        // 3,992 ids: about a byte each after compression, not the 3-4 of JSON numbers.
        let extra = stored.len() - without;
        assert!(extra < 3992 * 3 / 2, "{extra} bytes for 3992 ids");
    }

    #[test]
    fn realistic_experience_shrinks() {
        let exp = realistic_experience(200, 300, 7);
        let json = serde_json::to_vec(&exp).unwrap().len();
        let stored = encode(&exp).unwrap().len();
        let share = stored as f64 / json as f64;
        println!("payload: {json} bytes of JSON -> {stored} bytes zstd ({:.0} % of the JSON)", share * 100.0);
        assert!(share < 0.5, "zstd should at least halve the JSON: {json} -> {stored}");
    }
}
