//! Blockwise dynamic 8-bit quantization (bitsandbytes' `quantize_blockwise`,
//! Dettmers et al., "8-bit Optimizers via Block-wise Quantization") and the
//! AdamW update over moments stored that way.
//!
//! A tensor is cut into blocks of [`BLOCK`] values; each block keeps its
//! absolute maximum in f32 and one byte per value: the index of the nearest
//! entry of a 256-entry *dynamic* code, whose entries are spaced
//! logarithmically (an exponent and a fraction), so small moments keep
//! their relative precision. The signed code holds the first moment, the
//! unsigned one the second. Both codes and the rounding (the nearest entry,
//! ties to the lower one) are bitsandbytes' own; the tests compare with
//! codes it produced.

use std::sync::OnceLock;

use rayon::prelude::*;

use super::adamw::AdamWStep;

/// Values per block: bitsandbytes' blockwise optimizers use 256.
pub const BLOCK: usize = 256;

/// The 256-entry dynamic code, sorted (`create_dynamic_map(signed)` with 7
/// exponent bits).
pub fn dynamic_code(signed: bool) -> &'static [f32; 256] {
    static SIGNED: OnceLock<[f32; 256]> = OnceLock::new();
    static UNSIGNED: OnceLock<[f32; 256]> = OnceLock::new();
    let cell = if signed { &SIGNED } else { &UNSIGNED };
    cell.get_or_init(|| build_code(signed))
}

/// `torch.linspace(start, end, steps)` in f32, as torch evaluates it: from
/// the start for the first half, from the end for the second.
fn linspace(start: f32, end: f32, steps: usize) -> Vec<f32> {
    let step = (end - start) / (steps - 1) as f32;
    let half = steps / 2;
    (0..steps)
        .map(|i| {
            if i < half {
                start + step * i as f32
            } else {
                end - step * (steps - 1 - i) as f32
            }
        })
        .collect()
}

fn build_code(signed: bool) -> [f32; 256] {
    const EXP_BITS: i32 = 7;
    let non_sign_bits = 7;
    let mut data: Vec<f32> = Vec::with_capacity(256);
    let additional = (1 << (non_sign_bits - EXP_BITS)) - 1;
    for i in 0..EXP_BITS {
        let items = if signed {
            (1usize << (i + non_sign_bits - EXP_BITS)) + 1
        } else {
            (1usize << (i + non_sign_bits - EXP_BITS + 1)) + 1
        };
        let b = linspace(0.1, 1.0, items);
        let scale = 10f64.powi(-(EXP_BITS - 1) + i) as f32;
        for w in b.windows(2) {
            let mean = (w[0] + w[1]) / 2.0;
            data.push(scale * mean);
            if signed {
                data.push(-scale * mean);
            }
        }
    }
    // With 7 exponent bits and 7 non-sign bits there are no additional items.
    debug_assert_eq!(additional, 0);
    data.push(0.0);
    data.push(1.0);
    data.resize(256, 0.0);
    data.sort_by(f32::total_cmp);
    data.try_into().expect("256 entries")
}

/// Midpoints between neighbouring code entries: a value's index is the
/// number of midpoints below it.
fn bounds(signed: bool) -> &'static [f32; 255] {
    static SIGNED: OnceLock<[f32; 255]> = OnceLock::new();
    static UNSIGNED: OnceLock<[f32; 255]> = OnceLock::new();
    let cell = if signed { &SIGNED } else { &UNSIGNED };
    cell.get_or_init(|| {
        let c = dynamic_code(signed);
        std::array::from_fn(|i| (c[i] + c[i + 1]) / 2.0)
    })
}

/// The length of [`device_tables`]: `kernels/adamw.cu` loads this many.
pub const DEVICE_TABLES: usize = 2 * 256 + 2 * 255;

/// The tables the CUDA 8-bit AdamW kernel reads (`kernels/adamw.cu`): the
/// signed code, the unsigned code, then the midpoints of each.
pub fn device_tables() -> Vec<f32> {
    let mut t = Vec::with_capacity(DEVICE_TABLES);
    t.extend_from_slice(dynamic_code(true));
    t.extend_from_slice(dynamic_code(false));
    t.extend_from_slice(bounds(true));
    t.extend_from_slice(bounds(false));
    t
}

#[inline]
fn encode(scaled: f32, bounds: &[f32; 255]) -> u8 {
    bounds.partition_point(|&b| b < scaled) as u8
}

/// A tensor's values in blocks of [`BLOCK`]: one code index per value and
/// one f32 absolute maximum per block (the last block may be shorter).
#[derive(Debug, Clone, PartialEq)]
pub struct Blockwise {
    pub signed: bool,
    pub codes: Vec<u8>,
    pub absmax: Vec<f32>,
}

impl Blockwise {
    pub fn zeros(n: usize, signed: bool) -> Self {
        Blockwise {
            signed,
            codes: vec![encode(0.0, bounds(signed)); n],
            absmax: vec![0.0; n.div_ceil(BLOCK)],
        }
    }

    pub fn len(&self) -> usize {
        self.codes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    /// Bytes held: one per value and four per block.
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * self.absmax.len()
    }
}

/// Quantizes `x` in blocks of `block` values (bitsandbytes accepts 64 to
/// 4096; the optimizer uses [`BLOCK`]).
pub fn quantize(x: &[f32], block: usize, signed: bool) -> Blockwise {
    let b = bounds(signed);
    let mut codes = vec![0u8; x.len()];
    let absmax: Vec<f32> = x
        .par_chunks(block)
        .zip(codes.par_chunks_mut(block))
        .map(|(x, q)| quantize_block(x, q, b))
        .collect();
    Blockwise {
        signed,
        codes,
        absmax,
    }
}

/// Quantizes one block into `q`; returns its absolute maximum.
#[inline]
fn quantize_block(x: &[f32], q: &mut [u8], b: &[f32; 255]) -> f32 {
    let absmax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let inv = 1.0 / absmax.max(1e-38);
    for (q, &v) in q.iter_mut().zip(x) {
        *q = encode((v * inv).clamp(-1.0, 1.0), b);
    }
    absmax
}

/// The values `q` stands for, in blocks of `block`.
pub fn dequantize(q: &Blockwise, block: usize) -> Vec<f32> {
    let code = dynamic_code(q.signed);
    q.codes
        .chunks(block)
        .zip(&q.absmax)
        .flat_map(|(c, &a)| c.iter().map(move |&i| code[i as usize] * a))
        .collect()
}

/// One AdamW step with 8-bit moments, as bitsandbytes' blockwise 8-bit
/// AdamW: per block, the moments are dequantized, updated in f32, used for
/// the weight update, and quantized again with the block's new maximum.
pub fn adamw8_slices(
    theta: &mut [f32],
    g: &[f32],
    m: &mut Blockwise,
    v: &mut Blockwise,
    h: &AdamWStep,
) {
    assert!(
        theta.len() == g.len() && g.len() == m.len() && m.len() == v.len(),
        "adamw8: slices of different lengths"
    );
    let (cm, cv) = (dynamic_code(true), dynamic_code(false));
    let (bm, bv) = (bounds(true), bounds(false));
    theta
        .par_chunks_mut(BLOCK)
        .zip(g.par_chunks(BLOCK))
        .zip(m.codes.par_chunks_mut(BLOCK).zip(m.absmax.par_iter_mut()))
        .zip(v.codes.par_chunks_mut(BLOCK).zip(v.absmax.par_iter_mut()))
        .for_each(|(((theta, g), (qm, am)), (qv, av))| {
            let mut fm = [0f32; BLOCK];
            let mut fv = [0f32; BLOCK];
            for i in 0..theta.len() {
                let (mi, vi) = h.moments(cm[qm[i] as usize] * *am, cv[qv[i] as usize] * *av, g[i]);
                fm[i] = mi;
                fv[i] = vi;
                theta[i] = h.apply(theta[i], mi, vi);
            }
            let n = theta.len();
            *am = quantize_block(&fm[..n], qm, bm);
            *av = quantize_block(&fv[..n], qv, bv);
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout `kernels/adamw.cu` reads: codes at 0 and 256, midpoints
    /// at 512 and 767, 1022 values in all.
    #[test]
    fn device_tables_have_the_kernels_layout() {
        let t = device_tables();
        assert_eq!(t.len(), DEVICE_TABLES);
        assert_eq!(DEVICE_TABLES, 1022);
        assert_eq!(t[..256], dynamic_code(true)[..]);
        assert_eq!(t[256..512], dynamic_code(false)[..]);
        assert_eq!(t[512..767], bounds(true)[..]);
        assert_eq!(t[767..], bounds(false)[..]);
    }

    /// The test vector: sin(0.37 i) * exp(2 cos(0.11 i)), i < 160.
    fn xs() -> Vec<f32> {
        (0..160)
            .map(|i| ((0.37 * i as f64).sin() * (2.0 * (0.11 * i as f64).cos()).exp()) as f32)
            .collect()
    }

    // From bitsandbytes 0.50.2, torch 2.15: the reference kernel
    // (backends/default/ops.py `quantize_blockwise`: bucketize against the
    // midpoints, i.e. the nearest entry) with
    //   F.create_dynamic_map(signed=True), blocksize=64 on xs, and
    //   F.create_dynamic_map(signed=False), blocksize=64 on |xs|.
    // (Its native CPU kernel is approximate: it is off by one near midpoints
    // and maps 0 to 2.1e-5, so it is not the reference.)
    const SIGNED_CODES: [u8; 160] = [
        127, 210, 232, 244, 245, 237, 223, 206, 188, 70, 57, 54, 54, 57, 61, 70, 87, 138, 163, 168,
        169, 168, 166, 163, 160, 148, 106, 95, 93, 92, 92, 92, 94, 98, 137, 159, 164, 169, 173,
        176, 177, 172, 162, 88, 64, 57, 51, 46, 44, 47, 56, 160, 204, 226, 244, 255, 254, 242, 221,
        195, 56, 36, 24, 22, 29, 39, 51, 62, 155, 187, 193, 193, 192, 188, 177, 166, 155, 97, 92,
        90, 90, 91, 92, 94, 102, 139, 154, 160, 161, 162, 163, 162, 160, 150, 97, 89, 82, 74, 67,
        64, 67, 79, 156, 191, 200, 209, 217, 221, 219, 209, 192, 56, 32, 12, 0, 0, 10, 28, 51, 168,
        203, 214, 217, 214, 207, 199, 192, 164, 54, 39, 34, 36, 42, 50, 58, 73, 159, 180, 191, 192,
        193, 192, 187, 175, 160, 88, 72, 62, 59, 58, 58, 59, 67, 163, 197, 212, 228, 244, 255, 255,
    ];
    const UNSIGNED_CODES: [u8; 160] = [
        0, 166, 209, 233, 236, 220, 191, 157, 121, 113, 139, 145, 145, 139, 132, 114, 80, 22, 72,
        81, 84, 82, 77, 71, 65, 41, 41, 63, 67, 69, 69, 69, 66, 57, 19, 64, 73, 83, 92, 98, 99, 90,
        70, 77, 126, 139, 151, 161, 165, 159, 141, 65, 154, 197, 233, 255, 254, 230, 188, 135, 141,
        181, 205, 210, 195, 175, 151, 129, 55, 119, 131, 132, 129, 121, 99, 78, 55, 60, 70, 74, 74,
        72, 69, 65, 50, 24, 53, 65, 68, 70, 71, 70, 66, 45, 59, 75, 90, 106, 119, 125, 119, 95, 58,
        127, 145, 163, 179, 188, 183, 163, 129, 141, 189, 229, 253, 255, 234, 197, 151, 82, 152,
        173, 179, 173, 160, 144, 129, 74, 145, 175, 186, 182, 170, 154, 137, 107, 63, 106, 128,
        130, 131, 129, 119, 95, 66, 77, 110, 129, 135, 138, 138, 135, 120, 71, 139, 169, 202, 233,
        255, 255,
    ];
    const ABSMAX: [f32; 3] = [6.982_407_6, 7.267_326, 1.153_725_4];

    #[test]
    fn codes_match_bitsandbytes() {
        let s = dynamic_code(true);
        let u = dynamic_code(false);
        // Entries and sums printed by bitsandbytes' create_dynamic_map.
        for (got, want) in [
            (s[0], -0.992_968_738_079_071),
            (s[1], -0.978_906_273_841_857_9),
            (s[127], 0.0),
            (s[128], 5.500_000_384_017_767e-7),
            (s[200], 0.233_593_747_019_767_76),
            (s[255], 1.0),
            (u[1], 3.250_000_304_433_342_5e-7),
            (u[2], 7.749_999_895_168_003e-7),
            (u[100], 0.062_734_380_364_418_03),
            (u[254], 0.996_484_398_841_857_9),
        ] {
            assert!(
                (got as f64 - want).abs() <= want.abs() * 1e-6,
                "{got} vs {want}"
            );
        }
        let abs_sum: f64 = s.iter().map(|&x| x.abs() as f64).sum();
        let u_sum: f64 = u.iter().map(|&x| x as f64).sum();
        assert!((abs_sum - 75.105_263_172_000_26).abs() < 1e-5, "{abs_sum}");
        assert!((u_sum - 75.105_263_243_386_9).abs() < 1e-5, "{u_sum}");
    }

    #[test]
    fn blockwise_quantization_matches_bitsandbytes() {
        let x = xs();
        let q = quantize(&x, 64, true);
        assert_eq!(q.codes, SIGNED_CODES);
        for (a, b) in q.absmax.iter().zip(ABSMAX) {
            assert!((a - b).abs() <= b * 1e-6);
        }
        let ax: Vec<f32> = x.iter().map(|v| v.abs()).collect();
        assert_eq!(quantize(&ax, 64, false).codes, UNSIGNED_CODES);
    }

    #[test]
    fn round_trip_error_is_within_half_a_code_step() {
        // The documented bound: each value comes back as its nearest code
        // entry times the block maximum, so the error is at most half the gap
        // between the two code entries around it (times the maximum).
        for signed in [true, false] {
            let code = dynamic_code(signed);
            let x: Vec<f32> = (0..5000)
                .map(|i| {
                    let v = ((i as f32) * 0.731).sin() * (((i % 97) as f32) * 0.05).exp();
                    if signed {
                        v
                    } else {
                        v.abs()
                    }
                })
                .collect();
            let q = quantize(&x, BLOCK, signed);
            let y = dequantize(&q, BLOCK);
            for (i, (a, b)) in x.iter().zip(&y).enumerate() {
                let am = q.absmax[i / BLOCK];
                let s = (a / am).clamp(-1.0, 1.0);
                let k = code.partition_point(|&c| c < s).min(255);
                // Past the outermost entries (the signed code ends at
                // -0.99297), the error is the distance to that entry.
                let bound = if k == 0 {
                    code[0] - s
                } else {
                    (code[k] - code[k - 1]) / 2.0
                };
                assert!(
                    (a - b).abs() <= bound * am * 1.0001 + 1e-7,
                    "{i}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn eight_bit_adamw_matches_bitsandbytes() {
        // bitsandbytes 0.50.2 AdamW8bit on the CPU (its CPU update, with the
        // requantization through the reference kernel above), 4096 parameters
        // p_i = 0.5 sin(0.37 i), lr 1e-2, betas (0.9, 0.999), eps 1e-8,
        // weight decay 0.1, five steps with g_i = 0.1 cos(0.05 i t)(1 + i % 7).
        let n = 4096;
        let mut p: Vec<f32> = (0..n)
            .map(|i| ((0.37 * i as f64).sin() * 0.5) as f32)
            .collect();
        let (mut m, mut v) = (Blockwise::zeros(n, true), Blockwise::zeros(n, false));
        for t in 1..=5u64 {
            let g: Vec<f32> = (0..n)
                .map(|i| ((0.05 * (i as u64 * t) as f64).cos() * (1 + i % 7) as f64 * 0.1) as f32)
                .collect();
            let h = AdamWStep::new(1e-2, (0.9, 0.999), 1e-8, 0.1, t);
            adamw8_slices(&mut p, &g, &mut m, &mut v, &h);
        }
        let head = [
            -0.050_948_049_873_113_63,
            0.129_556_626_081_466_67,
            0.285_367_459_058_761_6,
            0.395_872_294_902_801_5,
            0.446_164_101_362_228_4,
            0.430_002_689_361_572_27,
        ];
        for (a, b) in p.iter().zip(head) {
            assert!((*a as f64 - b).abs() < 1e-6, "{a} vs {b}");
        }
        let sum: f64 = p.iter().map(|&x| x as f64).sum();
        let sq: f64 = p.iter().map(|&x| (x as f64).powi(2)).sum();
        assert!((sum - 7.250_278_994_208_202).abs() < 1e-4, "{sum}");
        assert!((sq - 508.826_983_670_603_4).abs() < 1e-4, "{sq}");
        assert_eq!(
            m.codes[..12],
            [194, 204, 212, 219, 223, 223, 220, 173, 181, 168, 92, 62]
        );
        assert_eq!(
            v.codes[..12],
            [70, 112, 135, 149, 160, 167, 172, 54, 75, 100, 130, 144]
        );
        for (a, b) in m
            .absmax
            .iter()
            .zip([0.286_185_71f64, 0.286_656_62, 0.284_629_76])
        {
            assert!((*a as f64 - b).abs() < 1e-6, "{a} vs {b}");
        }
        for (a, b) in v
            .absmax
            .iter()
            .zip([0.002_437_900_5f64, 0.002_445_100_1, 0.002_427_437_1])
        {
            assert!((*a as f64 - b).abs() < 1e-8, "{a} vs {b}");
        }
    }
}
