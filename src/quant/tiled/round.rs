//! The input of a tiled product rounded to 8 bits, as candle rounds it
//! for the weight's dot product (Q8_1 for Q4_1, Q8_0 for Q8_0), eight values
//! a step; candle's own rounding (`f32::round`, a libm call per value) was
//! 5% of a QLoRA step.

use std::arch::x86_64::*;

use half::f16;

use super::x86::BLOCK;

/// Rows of the input rounded to 8 bits: the values `[row][block][32]`,
/// and each block's scale `d` and, for Q8_1, `s = d * Σq`, as the f32
/// values of their f16 forms, laid out `[block][row]`.
pub struct Rounded {
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
}

/// candle's `BlockQ8_1::from_float` (with `s` where `q.s` is not
/// empty) or `BlockQ8_0::from_float`, the same bits, 8 values a step:
/// `d = amax / 127`, each value `round(x * (1 / d))` rounded half away
/// from zero (Rust's `f32::round`) and cast as `as i8` casts.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn quantize(x: &[f32], rows: usize, q: &mut Rounded) {
    let nb = x.len() / rows / BLOCK;
    assert!(x.len() == rows * nb * BLOCK && q.qs.len() == x.len());
    assert!(q.d.len() == rows * nb && (q.s.is_empty() || q.s.len() == rows * nb));
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let sign = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
    let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
    let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
    for (i, (x, qs)) in x
        .chunks_exact(BLOCK)
        .zip(q.qs.chunks_exact_mut(BLOCK))
        .enumerate()
    {
        // SAFETY: x and qs are 32 values; loadu/storeu need no alignment.
        unsafe {
            let v: [__m256; 4] = std::array::from_fn(|j| _mm256_loadu_ps(x.as_ptr().add(8 * j)));
            // f32::max skips a NaN; max_ps returns its second operand
            // where either is one.
            let mut m = _mm256_setzero_ps();
            for v in v {
                m = _mm256_max_ps(_mm256_and_ps(v, abs), m);
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), m);
            let amax = lanes.iter().fold(0f32, |a, &l| a.max(l));
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            let ints: [__m256i; 4] = std::array::from_fn(|j| {
                let p = _mm256_mul_ps(v[j], id);
                let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
                let away =
                    _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_and_ps(_mm256_sub_ps(p, t), abs), half);
                let step = _mm256_or_ps(one, _mm256_and_ps(p, sign));
                let r = _mm256_add_ps(t, _mm256_and_ps(away, step));
                // `as i8` saturates, and takes a NaN to 0.
                let r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
                let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(p, p));
                _mm256_cvtps_epi32(r)
            });
            // Packing works within 128-bit lanes; the permutation puts
            // the 32 bytes back in order.
            let b = _mm256_packs_epi16(
                _mm256_packs_epi32(ints[0], ints[1]),
                _mm256_packs_epi32(ints[2], ints[3]),
            );
            let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, b);
            let (row, blk) = (i / nb, i % nb);
            let d16 = f16::from_f32(d);
            q.d[blk * rows + row] = d16.to_f32();
            if !q.s.is_empty() {
                let sum = _mm256_add_epi32(
                    _mm256_add_epi32(ints[0], ints[1]),
                    _mm256_add_epi32(ints[2], ints[3]),
                );
                let mut sums = [0i32; 8];
                _mm256_storeu_si256(sums.as_mut_ptr() as *mut __m256i, sum);
                let sum: i32 = sums.iter().sum();
                q.s[blk * rows + row] = (f16::from_f32(sum as f32) * d16).to_f32();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The input's rounding against candle's `BlockQ8_1::from_float` and
    /// `BlockQ8_0::from_float`, byte for byte: values exactly half way
    /// between integers (candle rounds them away from zero), a block of
    /// zeros, one with a NaN, tiny and huge values, and spread-out ones.
    #[test]
    fn rounds_the_input_as_candle_does() {
        use candle_core::quantized::k_quants::{BlockQ8_0, BlockQ8_1, GgmlType};
        if !is_x86_feature_detected!("avx2") {
            return;
        }
        // amax 127 makes the scale 1: the halves stay halves.
        let mut x: Vec<f32> = (0..32).map(|i| i as f32 - 15.5).collect();
        x[31] = 127.0;
        x.extend((0..32).map(|i| if i % 2 == 0 { 0.5 } else { -126.5 }));
        x[64 - 1] = -127.0;
        x.extend([0.0f32; 32]);
        x.extend((0..32).map(|i| if i == 7 { f32::NAN } else { i as f32 }));
        x.extend((0..32).map(|i| 1e-40 * (i as f32 - 16.0)));
        x.extend((0..32).map(|i| 3e38 * ((i as f32) * 0.3).sin()));
        x.extend((0..320).map(|i| (i as f32 * 0.519).sin() - 0.2));
        let nb = x.len() / 32;
        let (rows, per_row) = (2, nb / 2);
        for with_s in [true, false] {
            let mut q = Rounded {
                qs: vec![0; x.len()],
                d: vec![0.0; nb],
                s: vec![0.0; if with_s { nb } else { 0 }],
            };
            // SAFETY: AVX2, checked above.
            unsafe { quantize(&x, rows, &mut q) };
            for (i, x) in x.chunks(32).enumerate() {
                let (row, b) = (i / per_row, i % per_row);
                let at = b * rows + row;
                // candle's blocks: d (f16), [s (f16),] then 32 i8.
                let bytes: Vec<u8> = if with_s {
                    let mut c = [BlockQ8_1::zeros()];
                    BlockQ8_1::from_float(x, &mut c);
                    // SAFETY: BlockQ8_1 is repr(C), 36 bytes of integers.
                    unsafe { std::slice::from_raw_parts(c.as_ptr() as *const u8, 36) }.to_vec()
                } else {
                    let mut c = [BlockQ8_0::zeros()];
                    BlockQ8_0::from_float(x, &mut c);
                    // SAFETY: BlockQ8_0 is repr(C), 34 bytes of integers.
                    unsafe { std::slice::from_raw_parts(c.as_ptr() as *const u8, 34) }.to_vec()
                };
                let f16_at = |at: usize| half::f16::from_le_bytes([bytes[at], bytes[at + 1]]);
                let qs_at = if with_s { 4 } else { 2 };
                let ours: Vec<u8> = q.qs[i * 32..][..32].iter().map(|&v| v as u8).collect();
                assert_eq!(ours, &bytes[qs_at..], "block {i} (s: {with_s}): {x:?}");
                assert_eq!(
                    q.d[at].to_bits(),
                    f16_at(0).to_f32().to_bits(),
                    "d of block {i}"
                );
                if with_s {
                    assert_eq!(
                        q.s[at].to_bits(),
                        f16_at(2).to_f32().to_bits(),
                        "s of block {i}"
                    );
                }
            }
        }
    }
}
