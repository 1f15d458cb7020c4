//! `x W^T` for a frozen Q4_1 or Q8_0 weight on an x86-64 CPU with AVX2 and
//! FMA, in tiles of two input rows by four weight rows.
//!
//! candle's quantized matmul takes each pair of an input row and a weight
//! row through one dot product (`vec_dot_q4_1_q8_1`, `vec_dot_q8_0_q8_0`:
//! AVX2 in the vendored copy), so each weight block is loaded, and its f16
//! scales converted, once for every input row. A tile here loads four weight
//! blocks once for two input rows, and the scales are converted once a call.
//! Each output is computed with candle's operations in candle's order, so the
//! results are the same bits (the test checks it): the input rounded to the
//! weight's 8-bit companion type (Q8_1, Q8_0) by candle, a block's integer
//! products in 8-bit lanes, scaled and accumulated with one FMA a block, the
//! lanes summed as candle's `hsum_float_8` does, and for Q4_1 the minimum's
//! term `Σ m·s` added last, in block order.
//!
//! SmolLM2's GGUF file holds its blocks' projections in Q4_1 and its tied
//! head in Q8_0; QLoRA's forward through them was 80% of a step.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Result;

/// `x [rows, k] W^T` for a Q4_1 or Q8_0 `w [n, k]`, or `None` where this
/// path does not apply (another type, another CPU, fewer than 4 rows) and
/// candle's matmul should run instead.
pub fn x_wt(x: &[f32], rows: usize, w: &QTensor) -> Result<Option<Vec<f32>>> {
    #[cfg(target_arch = "x86_64")]
    if matches!(w.dtype(), GgmlDType::Q4_1 | GgmlDType::Q8_0)
        && rows >= 4
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
    {
        let (n, k) = w.shape().dims2()?;
        if k % x86::BLOCK == 0 && x.len() == rows * k {
            let data = w.data()?;
            return Ok(Some(match w.dtype() {
                GgmlDType::Q4_1 => x86::x_wt::<x86::Q4_1>(x, rows, (n, k), &data),
                _ => x86::x_wt::<x86::Q8_0>(x, rows, (n, k), &data),
            }));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (x, rows, w, GgmlDType::Q4_1);
    Ok(None)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use candle_core::quantized::k_quants::{BlockQ8_0, BlockQ8_1, GgmlType};
    use half::f16;
    use rayon::prelude::*;

    pub const BLOCK: usize = 32;
    /// Input rows a task takes; weight rows a pass over them takes (their
    /// blocks stay in the L1/L2 cache while the task's rows go by).
    const TASK_ROWS: usize = 16;
    const PASS_COLS: usize = 64;

    /// A weight's block format and the 8-bit type candle rounds the input
    /// to for it. Blocks start with an f16 scale `d`; `MIN` formats then
    /// hold an f16 minimum (Q4_1's `m`; Q8_1's `s = d * Σq` on the input's
    /// side), and the 32 quantized values follow at `QS`.
    pub trait Format {
        const W_BYTES: usize;
        const W_QS: usize;
        const MIN: bool;
        type X: GgmlType;
        const X_BYTES: usize;
        const X_QS: usize;
        /// A weight block's 32 values as bytes.
        fn load(w: &[u8]) -> __m256i;
        /// The 32 products with the input's bytes, summed in pairs and then
        /// in pairs of pairs, as 8 floats.
        fn products(w: __m256i, x: __m256i) -> __m256;
    }

    pub struct Q4_1;
    pub struct Q8_0;

    const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);
    const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

    impl Format for Q4_1 {
        const W_BYTES: usize = 20;
        const W_QS: usize = 4;
        const MIN: bool = true;
        type X = BlockQ8_1;
        const X_BYTES: usize = 36;
        const X_QS: usize = 4;
        /// 16 bytes of nibbles as 32 bytes: the low nibbles, then the high
        /// ones (candle's `bytes_from_nibbles_32`).
        #[inline(always)]
        fn load(w: &[u8]) -> __m256i {
            let q = &w[..16];
            // SAFETY: q is 16 bytes, loadu has no alignment needs, and the
            // caller (tile) runs only where the CPU has AVX2.
            unsafe {
                let tmp = _mm_loadu_si128(q.as_ptr() as *const __m128i);
                let bytes = _mm256_insertf128_si256::<1>(
                    _mm256_castsi128_si256(tmp),
                    _mm_srli_epi16(tmp, 4),
                );
                _mm256_and_si256(_mm256_set1_epi8(0xF), bytes)
            }
        }
        /// Unsigned nibbles times signed bytes (`mul_sum_us8_pairs_float`).
        #[inline(always)]
        fn products(w: __m256i, x: __m256i) -> __m256 {
            // SAFETY: AVX2, as above.
            unsafe { us8_pairs(w, x) }
        }
    }

    impl Format for Q8_0 {
        const W_BYTES: usize = 34;
        const W_QS: usize = 2;
        const MIN: bool = false;
        type X = BlockQ8_0;
        const X_BYTES: usize = 34;
        const X_QS: usize = 2;
        #[inline(always)]
        fn load(w: &[u8]) -> __m256i {
            let q = &w[..32];
            // SAFETY: q is 32 bytes; AVX2, as above.
            unsafe { _mm256_loadu_si256(q.as_ptr() as *const __m256i) }
        }
        /// Signed times signed through the sign trick
        /// (`mul_sum_i8_pairs_float`).
        #[inline(always)]
        fn products(w: __m256i, x: __m256i) -> __m256 {
            // SAFETY: AVX2, as above.
            unsafe { us8_pairs(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)) }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    fn us8_pairs(w: __m256i, x: __m256i) -> __m256 {
        let pairs = _mm256_maddubs_epi16(w, x);
        _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), pairs))
    }

    fn f16_at(bytes: &[u8], at: usize) -> f32 {
        f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
    }

    /// Each block's scale (and minimum, for `MIN` formats), converted to
    /// f32, laid out `[block][row]`.
    fn scales(
        bytes: &[u8],
        rows: usize,
        nb: usize,
        size: usize,
        min: bool,
    ) -> (Vec<f32>, Vec<f32>) {
        let mut d = vec![0f32; rows * nb];
        let mut m = vec![0f32; if min { rows * nb } else { 0 }];
        for row in 0..rows {
            for b in 0..nb {
                let at = (row * nb + b) * size;
                d[b * rows + row] = f16_at(bytes, at);
                if min {
                    m[b * rows + row] = f16_at(bytes, at + 2);
                }
            }
        }
        (d, m)
    }

    /// What a tile reads: the weight's blocks and scales, and one task's
    /// input rows rounded to 8 bits and their scales.
    struct Operands<'a> {
        n: usize,
        nb: usize,
        rows: usize,
        w: &'a [u8],
        wd: &'a [f32],
        wm: &'a [f32],
        x: &'a [u8],
        xd: &'a [f32],
        xs: &'a [f32],
    }

    pub fn x_wt<F: Format>(x: &[f32], rows: usize, (n, k): (usize, usize), w: &[u8]) -> Vec<f32> {
        let nb = k / BLOCK;
        assert_eq!(w.len(), n * nb * F::W_BYTES, "a weight [{n}, {k}]");
        assert_eq!(std::mem::size_of::<F::X>(), F::X_BYTES);
        let (wd, wm) = scales(w, n, nb, F::W_BYTES, F::MIN);
        let mut y = vec![0f32; rows * n];
        y.par_chunks_mut(TASK_ROWS * n)
            .zip(x.par_chunks(TASK_ROWS * k))
            .for_each(|(y, x)| {
                let rows = x.len() / k;
                // As candle's matmul does, row by row.
                let mut q = vec![F::X::zeros(); rows * nb];
                for (x, q) in x.chunks(k).zip(q.chunks_mut(nb)) {
                    F::X::from_float(x, q);
                }
                // SAFETY: the input's block types are repr(C), X_BYTES long
                // (asserted above), of plain integers; `q` outlives `bytes`.
                let bytes = unsafe {
                    std::slice::from_raw_parts(q.as_ptr() as *const u8, q.len() * F::X_BYTES)
                };
                let (xd, xs) = scales(bytes, rows, nb, F::X_BYTES, F::MIN);
                let o = Operands {
                    n,
                    nb,
                    rows,
                    w,
                    wd: &wd,
                    wm: &wm,
                    x: bytes,
                    xd: &xd,
                    xs: &xs,
                };
                task::<F>(&o, y);
            });
        y
    }

    fn task<F: Format>(o: &Operands, y: &mut [f32]) {
        for c0 in (0..o.n).step_by(PASS_COLS) {
            let c1 = (c0 + PASS_COLS).min(o.n);
            for r0 in (0..o.rows).step_by(2) {
                let two = r0 + 1 < o.rows;
                let mut j0 = c0;
                while j0 < c1 {
                    let four = j0 + 4 <= c1;
                    // SAFETY: x_wt runs only where the CPU has AVX2 and FMA.
                    unsafe {
                        match (two, four) {
                            (true, true) => tile::<F, 2, 4>(o, y, r0, j0),
                            (false, true) => tile::<F, 1, 4>(o, y, r0, j0),
                            (true, false) => tile::<F, 2, 1>(o, y, r0, j0),
                            (false, false) => tile::<F, 1, 1>(o, y, r0, j0),
                        }
                    }
                    j0 += if four { 4 } else { 1 };
                }
            }
        }
    }

    /// Outputs `y[r0..r0+RM, j0..j0+RN]`.
    #[target_feature(enable = "avx2,fma")]
    fn tile<F: Format, const RM: usize, const RN: usize>(
        o: &Operands,
        y: &mut [f32],
        r0: usize,
        j0: usize,
    ) {
        assert!(r0 + RM <= o.rows && j0 + RN <= o.n);
        let mut acc = [[_mm256_setzero_ps(); RN]; RM];
        for b in 0..o.nb {
            let mut wq = [_mm256_setzero_si256(); RN];
            for (j, wq) in wq.iter_mut().enumerate() {
                *wq = F::load(&o.w[((j0 + j) * o.nb + b) * F::W_BYTES + F::W_QS..]);
            }
            let wd = &o.wd[b * o.n + j0..][..RN];
            for (r, acc) in acc.iter_mut().enumerate() {
                let xq = &o.x[((r0 + r) * o.nb + b) * F::X_BYTES + F::X_QS..][..32];
                // SAFETY: xq is 32 bytes; loadu has no alignment needs.
                let xq = unsafe { _mm256_loadu_si256(xq.as_ptr() as *const __m256i) };
                let xd = o.xd[b * o.rows + r0 + r];
                for j in 0..RN {
                    // candle: the weight's scale times the input's, then
                    // fmadd(d, products, acc).
                    let d = _mm256_set1_ps(wd[j] * xd);
                    acc[j] = _mm256_fmadd_ps(d, F::products(wq[j], xq), acc[j]);
                }
            }
        }
        // Q4_1's minimum term, each output's in block order (a multiply,
        // then an add, as candle's `summs += m * s`).
        let mut summs = [[0f32; RN]; RM];
        if F::MIN {
            for b in 0..o.nb {
                let wm = &o.wm[b * o.n + j0..][..RN];
                for (r, summs) in summs.iter_mut().enumerate() {
                    let xs = o.xs[b * o.rows + r0 + r];
                    for (s, m) in summs.iter_mut().zip(wm) {
                        *s += m * xs;
                    }
                }
            }
        }
        for r in 0..RM {
            for j in 0..RN {
                let sum = hsum(acc[r][j]);
                y[(r0 + r) * o.n + j0 + j] = if F::MIN { sum + summs[r][j] } else { sum };
            }
        }
    }

    /// candle's `hsum_float_8`, in its order.
    #[target_feature(enable = "avx2,fma")]
    fn hsum(x: __m256) -> f32 {
        let res = _mm256_extractf128_ps(x, 1);
        let res = _mm_add_ps(res, _mm256_castps256_ps128(x));
        let res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        let res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QMatMul;
    use candle_core::{Device, Module, Tensor};
    use std::sync::Arc;

    fn fixed(len: usize, step: f32, shift: f32) -> Vec<f32> {
        (0..len).map(|i| (i as f32 * step).sin() + shift).collect()
    }

    /// The same bits as candle's own quantized matmul, over shapes with odd
    /// rows and weight rows outside the 2 x 4 tiles and the 16-row tasks.
    #[test]
    fn same_bits_as_candles_quantized_matmul() -> Result<()> {
        let dev = Device::Cpu;
        let shapes = [(4, 4, 32), (5, 7, 64), (37, 130, 96), (64, 192, 576)];
        for ((rows, n, k), dtype) in shapes
            .into_iter()
            .flat_map(|s| [(s, GgmlDType::Q4_1), (s, GgmlDType::Q8_0)])
        {
            let w = Tensor::from_vec(fixed(n * k, 0.377, 0.1), (n, k), &dev)?;
            let q = Arc::new(QTensor::quantize(&w, dtype)?);
            let x = fixed(rows * k, 0.519, -0.2);
            let ours = x_wt(&x, rows, &q)?;
            if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
                assert!(ours.is_none());
                return Ok(());
            }
            let ours = ours.expect("the tiled path applies");
            let xt = Tensor::from_vec(x, (rows, k), &dev)?;
            let theirs: Vec<f32> = QMatMul::QTensor(q).forward(&xt)?.flatten_all()?.to_vec1()?;
            assert_eq!(ours.len(), theirs.len());
            for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{dtype:?} [{rows}, {n}, {k}] at {i}: {a} against {b}"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn leaves_other_types_and_few_rows_to_candle() -> Result<()> {
        let w = Tensor::from_vec(fixed(8 * 64, 0.3, 0.0), (8, 64), &Device::Cpu)?;
        let x = fixed(4 * 64, 0.7, 0.0);
        let q4_0 = QTensor::quantize(&w, GgmlDType::Q4_0)?;
        assert!(x_wt(&x, 4, &q4_0)?.is_none());
        let q4 = QTensor::quantize(&w, GgmlDType::Q4_1)?;
        assert!(x_wt(&x[..3 * 64], 3, &q4)?.is_none());
        Ok(())
    }
}
