//! Dequantization of ggml tensor encodings into f32.
//!
//! Each quantized format stores fixed-size blocks along the fastest dimension (32 values for the legacy
//! formats, 256 for K-quants); a block holds its scale(s) and packed integers. Decoding is independent per block,
//! so large tensors are split into block-aligned chunks decoded on all cores. The inner loops are plain slices
//! without bounds checks inside the hot path so the compiler vectorizes them.
//!
//! Formats (byte layouts as in ggml-common.h):
//! - `Q4_0`: f16 `d`, 16 bytes of nibbles; `x = (q - 8) * d`; low nibbles are values 0..16, high 16..32.
//! - `Q4_1`: f16 `d`, f16 `m`, 16 bytes of nibbles; `x = q * d + m`.
//! - `Q8_0`: f16 `d`, 32 × i8; `x = q * d`.
//! - `Q4_K`: 256 values: f16 `d`, f16 `dmin`, 12 bytes of packed 6-bit scales/mins, 128 bytes of nibbles.
//! - `Q6_K`: 256 values: 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 × i8 scales, f16 `d`.

use half::{bf16, f16};

/// A ggml tensor encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// 4-bit, symmetric, blocks of 32.
    Q4_0,
    /// 4-bit with minimum, blocks of 32.
    Q4_1,
    /// 8-bit, blocks of 32.
    Q8_0,
    /// K-quant 4-bit, super-blocks of 256.
    Q4K,
    /// K-quant 6-bit, super-blocks of 256.
    Q6K,
    /// Any other type id (readable metadata, undecodable data).
    Other(u32),
}

impl GgmlType {
    /// Maps ggml's numeric type id.
    pub fn from_u32(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            14 => Self::Q6K,
            30 => Self::Bf16,
            other => Self::Other(other),
        }
    }

    /// ggml's name for the type (`Q4_1`, `IQ2_XXS`, ...).
    pub fn name(self) -> String {
        let known = match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Bf16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4K => "Q4_K",
            Self::Q6K => "Q6_K",
            Self::Other(id) => {
                return match id {
                    6 => "Q5_0",
                    7 => "Q5_1",
                    9 => "Q8_1",
                    10 => "Q2_K",
                    11 => "Q3_K",
                    13 => "Q5_K",
                    15 => "Q8_K",
                    16 => "IQ2_XXS",
                    17 => "IQ2_XS",
                    18 => "IQ3_XXS",
                    19 => "IQ1_S",
                    20 => "IQ4_NL",
                    21 => "IQ3_S",
                    22 => "IQ2_S",
                    23 => "IQ4_XS",
                    24 => "I8",
                    25 => "I16",
                    26 => "I32",
                    27 => "I64",
                    28 => "F64",
                    29 => "IQ1_M",
                    _ => return format!("type {id}"),
                }
                .to_owned();
            }
        };
        known.to_owned()
    }

    /// (values per block, bytes per block), or `None` for a type we do not decode.
    fn block(self) -> Option<(usize, usize)> {
        Some(match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::Bf16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q8_0 => (32, 34),
            Self::Q4K => (256, 144),
            Self::Q6K => (256, 210),
            Self::Other(_) => return None,
        })
    }

    /// Whether we decode this type.
    pub fn is_decodable(self) -> bool {
        self.block().is_some()
    }

    /// Encoded size of `numel` values, or `None` when the type is not decodable or `numel` is not whole blocks.
    pub fn n_bytes(self, numel: u64) -> Option<usize> {
        let (per, bytes) = self.block()?;
        let per = per as u64;
        if !numel.is_multiple_of(per) {
            return None;
        }
        (numel / per).checked_mul(bytes as u64).and_then(|n| usize::try_from(n).ok())
    }
}

/// Below this many values a tensor is decoded on the calling thread; thread start-up would cost more.
const PARALLEL_THRESHOLD: usize = 1 << 18;

/// Decodes `data` (whole blocks of `ty`) into `out`. On failure returns the type's name: the caller knows the
/// tensor and builds the error.
pub(crate) fn dequantize_into(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), String> {
    let Some((per, bytes)) = ty.block() else { return Err(ty.name()) };
    if !out.len().is_multiple_of(per) || data.len() != out.len() / per * bytes {
        return Err(format!("{} (size {} bytes does not hold {} values)", ty.name(), data.len(), out.len()));
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    if out.len() < PARALLEL_THRESHOLD || threads < 2 {
        decode(ty, data, out);
        return Ok(());
    }
    let n_blocks = out.len() / per;
    let blocks_per_chunk = n_blocks.div_ceil(threads);
    std::thread::scope(|s| {
        for (o, d) in out.chunks_mut(blocks_per_chunk * per).zip(data.chunks(blocks_per_chunk * bytes)) {
            s.spawn(move || decode(ty, d, o));
        }
    });
    Ok(())
}

fn decode(ty: GgmlType, data: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Bf16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(data.chunks_exact(18)) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                let qs = &b[2..18];
                let (lo, hi) = o.split_at_mut(16);
                for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(qs) {
                    *l = ((q & 0x0f) as i32 - 8) as f32 * d;
                    *h = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(32).zip(data.chunks_exact(20)) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
                let qs = &b[4..20];
                let (lo, hi) = o.split_at_mut(16);
                for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(qs) {
                    *l = (q & 0x0f) as f32 * d + m;
                    *h = (q >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(data.chunks_exact(34)) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                for (x, &q) in o.iter_mut().zip(&b[2..34]) {
                    *x = q as i8 as f32 * d;
                }
            }
        }
        GgmlType::Q4K => {
            for (o, b) in out.chunks_exact_mut(256).zip(data.chunks_exact(144)) {
                decode_q4k_block(b, o);
            }
        }
        GgmlType::Q6K => {
            for (o, b) in out.chunks_exact_mut(256).zip(data.chunks_exact(210)) {
                decode_q6k_block(b, o);
            }
        }
        // Filtered out by `dequantize_into` (no block size).
        GgmlType::Other(_) => {}
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) from Q4_K's 12 packed bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

fn decode_q4k_block(b: &[u8], out: &mut [f32]) {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
    let dmin = f16::from_le_bytes([b[2], b[3]]).to_f32();
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (chunk, (o, q)) in out.chunks_exact_mut(64).zip(qs.chunks_exact(32)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let (lo, hi) = o.split_at_mut(32);
        for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(q) {
            *l = d1 * (q & 0x0f) as f32 - m1;
            *h = d2 * (q >> 4) as f32 - m2;
        }
    }
}

fn decode_q6k_block(b: &[u8], out: &mut [f32]) {
    let ql_all = &b[0..128];
    let qh_all = &b[128..192];
    let sc_all = &b[192..208];
    let d = f16::from_le_bytes([b[208], b[209]]).to_f32();
    for half_idx in 0..2 {
        let ql = &ql_all[64 * half_idx..64 * half_idx + 64];
        let qh = &qh_all[32 * half_idx..32 * half_idx + 32];
        let sc = &sc_all[8 * half_idx..8 * half_idx + 8];
        let y = &mut out[128 * half_idx..128 * half_idx + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16b(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn legacy_blocks_decode_by_hand() {
        // Q4_0: d = 0.5, byte j = (hi << 4) | lo with lo = j, hi = 15 - j.
        let mut b = f16b(0.5).to_vec();
        b.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
        let mut out = [0f32; 32];
        dequantize_into(GgmlType::Q4_0, &b, &mut out).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(out[16 + j], ((15 - j) as f32 - 8.0) * 0.5);
        }
        // Q4_1: d = 2, m = -1.
        let mut b = f16b(2.0).to_vec();
        b.extend(f16b(-1.0));
        b.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
        dequantize_into(GgmlType::Q4_1, &b, &mut out).unwrap();
        assert_eq!(out[3], 3.0 * 2.0 - 1.0);
        assert_eq!(out[16 + 3], 12.0 * 2.0 - 1.0);
        // Q8_0: d = 0.25.
        let mut b = f16b(0.25).to_vec();
        b.extend((0..32).map(|j: i32| (j - 16) as i8 as u8));
        dequantize_into(GgmlType::Q8_0, &b, &mut out).unwrap();
        assert_eq!(out[0], -4.0);
        assert_eq!(out[31], 15.0 * 0.25);
        // F16 / BF16.
        let mut o2 = [0f32; 2];
        dequantize_into(GgmlType::F16, &[f16b(1.5), f16b(-2.0)].concat(), &mut o2).unwrap();
        assert_eq!(o2, [1.5, -2.0]);
        let bf: Vec<u8> = [bf16::from_f32(3.0), bf16::from_f32(-0.5)].iter().flat_map(|v| v.to_le_bytes()).collect();
        dequantize_into(GgmlType::Bf16, &bf, &mut o2).unwrap();
        assert_eq!(o2, [3.0, -0.5]);
    }

    #[test]
    fn parallel_decode_matches_serial() {
        let n_blocks = PARALLEL_THRESHOLD / 32 * 3 + 7;
        let data: Vec<u8> = (0..n_blocks * 20)
            .map(|i| if i % 20 < 4 { [0x00, 0x3c, 0x00, 0xbc][i % 20] } else { (i * 31 % 251) as u8 })
            .collect();
        let mut par = vec![0f32; n_blocks * 32];
        dequantize_into(GgmlType::Q4_1, &data, &mut par).unwrap();
        let mut ser = vec![0f32; n_blocks * 32];
        decode(GgmlType::Q4_1, &data, &mut ser);
        assert_eq!(par, ser);
    }

    #[test]
    fn wrong_sizes_and_unknown_types_are_rejected() {
        let mut out = [0f32; 32];
        assert!(dequantize_into(GgmlType::Q8_0, &[0; 33], &mut out).is_err());
        assert_eq!(dequantize_into(GgmlType::Other(13), &[0; 176], &mut out).unwrap_err(), "Q5_K");
        assert_eq!(GgmlType::from_u32(30), GgmlType::Bf16);
        assert_eq!(GgmlType::Q4K.n_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_0.n_bytes(31), None);
    }
}
