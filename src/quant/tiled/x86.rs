//! The tiles' kernels for x86-64: AVX2's, and AVX512-VNNI's where the CPU
//! has it (see the parent module for what they compute).

use std::arch::x86_64::*;

use half::f16;
use rayon::prelude::*;

use super::round::{quantize, Rounded};

pub const BLOCK: usize = 32;
/// Input rows a task takes; weight rows a pass over them takes (their
/// blocks stay in the L1/L2 cache while the task's rows go by).
const TASK_ROWS: usize = 16;
const PASS_COLS: usize = 64;

/// A weight's block format. Blocks start with an f16 scale `d`; `MIN`
/// formats then hold an f16 minimum (Q4_1's `m`), and the 32 quantized
/// values follow at `W_QS`. The input is rounded to 8 bits for it as
/// candle rounds it to Q8_1 (for `MIN` formats, with `s = d * Σq`) or
/// Q8_0 ([`quantize`]).
pub trait Format {
    const W_BYTES: usize;
    const W_QS: usize;
    const MIN: bool;
    /// A weight block's 32 values as bytes, from its values at `q`.
    ///
    /// # Safety
    /// `q` points at the block's values; the CPU has AVX2.
    unsafe fn load(q: *const u8) -> __m256i;
    /// The 32 products with the input's bytes, summed in fours, as 8
    /// floats.
    ///
    /// # Safety
    /// The CPU has what `D` needs.
    unsafe fn products<D: Dot>(w: __m256i, x: __m256i) -> __m256;
}

/// How 32 unsigned bytes times 32 signed bytes become 8 sums of four:
/// the integers are exact either way, so both give candle's bits.
pub trait Dot {
    /// Input rows a tile takes: as many as the registers hold
    /// accumulators for four weight rows.
    const ROWS: usize;
    /// # Safety
    /// The CPU has this way's instructions.
    unsafe fn sums(w: __m256i, x: __m256i) -> __m256i;
}

/// AVX2's pairs, then pairs of pairs (candle's `mul_sum_us8_pairs_float`;
/// no pair can saturate: the unsigned side is at most 127).
pub struct Avx2;
/// AVX512-VNNI's fused four-product sum on 256-bit registers, where
/// AVX512-VL also gives 32 of them.
pub struct Vnni;

impl Dot for Avx2 {
    const ROWS: usize = 2;
    #[inline(always)]
    unsafe fn sums(w: __m256i, x: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(w, x))
    }
}

impl Dot for Vnni {
    const ROWS: usize = 4;
    #[inline(always)]
    unsafe fn sums(w: __m256i, x: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
    }
}

pub struct Q4_1;
pub struct Q8_0;

impl Format for Q4_1 {
    const W_BYTES: usize = 20;
    const W_QS: usize = 4;
    const MIN: bool = true;
    /// 16 bytes of nibbles as 32 bytes: the low nibbles, then the high
    /// ones (candle's `bytes_from_nibbles_32`), from one broadcast load
    /// and a shift of the upper half.
    #[inline(always)]
    unsafe fn load(q: *const u8) -> __m256i {
        let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(q as *const __m128i));
        let v = _mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0));
        _mm256_and_si256(v, _mm256_set1_epi8(0xF))
    }
    /// Unsigned nibbles times signed bytes.
    #[inline(always)]
    unsafe fn products<D: Dot>(w: __m256i, x: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(D::sums(w, x))
    }
}

impl Format for Q8_0 {
    const W_BYTES: usize = 34;
    const W_QS: usize = 2;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn load(q: *const u8) -> __m256i {
        _mm256_loadu_si256(q as *const __m256i)
    }
    /// Signed times signed through the sign trick
    /// (`mul_sum_i8_pairs_float`).
    #[inline(always)]
    unsafe fn products<D: Dot>(w: __m256i, x: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(D::sums(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)))
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Each block's scale (and minimum, for `MIN` formats), converted to
/// f32, laid out `[block][row]`.
fn scales(bytes: &[u8], rows: usize, nb: usize, size: usize, min: bool) -> (Vec<f32>, Vec<f32>) {
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
    x: &'a [i8],
    xd: &'a [f32],
    xs: &'a [f32],
}

/// With `vnni`, AVX512-VNNI's sums, which the caller checked the CPU
/// has (with AVX512-VL); without, AVX2's.
pub fn x_wt<F: Format>(
    x: &[f32],
    rows: usize,
    (n, k): (usize, usize),
    w: &[u8],
    vnni: bool,
) -> Vec<f32> {
    let nb = k / BLOCK;
    assert_eq!(w.len(), n * nb * F::W_BYTES, "a weight [{n}, {k}]");
    let (wd, wm) = scales(w, n, nb, F::W_BYTES, F::MIN);
    let mut y = vec![0f32; rows * n];
    y.par_chunks_mut(TASK_ROWS * n)
        .zip(x.par_chunks(TASK_ROWS * k))
        .for_each(|(y, x)| {
            let rows = x.len() / k;
            let mut q = Rounded {
                qs: vec![0; rows * k],
                d: vec![0.0; rows * nb],
                s: vec![0.0; if F::MIN { rows * nb } else { 0 }],
            };
            // SAFETY: x_wt's caller checked AVX2 and FMA.
            unsafe { quantize(x, rows, &mut q) };
            let o = Operands {
                n,
                nb,
                rows,
                w,
                wd: &wd,
                wm: &wm,
                x: &q.qs,
                xd: &q.d,
                xs: &q.s,
            };
            // SAFETY: x_wt's caller checked AVX2 and FMA, and VNNI and
            // VL where `vnni`.
            unsafe {
                if vnni {
                    task_vnni::<F>(&o, y)
                } else {
                    task_avx2::<F>(&o, y)
                }
            }
        });
    y
}

#[target_feature(enable = "avx2,fma")]
fn task_avx2<F: Format>(o: &Operands, y: &mut [f32]) {
    // SAFETY: this function's features are Avx2's.
    unsafe { task::<F, Avx2>(o, y) }
}

#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
fn task_vnni<F: Format>(o: &Operands, y: &mut [f32]) {
    // SAFETY: this function's features are Vnni's.
    unsafe { task::<F, Vnni>(o, y) }
}

/// # Safety
/// The CPU has AVX2, FMA and what `D` needs.
#[inline(always)]
unsafe fn task<F: Format, D: Dot>(o: &Operands, y: &mut [f32]) {
    // Each block's products of scales for one tile, `[block][row][col]`.
    let mut dd = vec![0f32; o.nb * D::ROWS * 4];
    for c0 in (0..o.n).step_by(PASS_COLS) {
        let c1 = (c0 + PASS_COLS).min(o.n);
        let mut r0 = 0;
        while r0 < o.rows {
            let rm = (o.rows - r0).min(D::ROWS);
            let mut j0 = c0;
            while j0 < c1 {
                let rn = if j0 + 4 <= c1 { 4 } else { 1 };
                let t = (o, &mut *y, &mut dd[..], r0, j0);
                // SAFETY: the caller's.
                unsafe {
                    match (rm, rn) {
                        (1, 1) => tile::<F, D, 1, 1>(t),
                        (1, _) => tile::<F, D, 1, 4>(t),
                        (2, 1) => tile::<F, D, 2, 1>(t),
                        (2, _) => tile::<F, D, 2, 4>(t),
                        (3, 1) => tile::<F, D, 3, 1>(t),
                        (3, _) => tile::<F, D, 3, 4>(t),
                        (_, 1) => tile::<F, D, 4, 1>(t),
                        _ => tile::<F, D, 4, 4>(t),
                    }
                }
                j0 += rn;
            }
            r0 += rm;
        }
    }
}

/// Outputs `y[r0..r0+RM, j0..j0+RN]`.
///
/// # Safety
/// As [`task`]'s.
#[inline(always)]
unsafe fn tile<F: Format, D: Dot, const RM: usize, const RN: usize>(
    (o, y, dd, r0, j0): (&Operands, &mut [f32], &mut [f32], usize, usize),
) {
    assert!(r0 + RM <= o.rows && j0 + RN <= o.n && dd.len() >= o.nb * RM * RN);
    // candle's order: the weight's scale times the input's, then
    // fmadd(d, products, acc). The products of scales first, so that the
    // main loop only loads them.
    for b in 0..o.nb {
        let wd = &o.wd[b * o.n + j0..][..RN];
        let xd = &o.xd[b * o.rows + r0..][..RM];
        let dd = &mut dd[b * RM * RN..][..RM * RN];
        for (dd, xd) in dd.chunks_exact_mut(RN).zip(xd) {
            if RN == 4 {
                // SAFETY: wd and dd are 4 floats; SSE is x86-64's.
                unsafe {
                    let p = _mm_mul_ps(_mm_loadu_ps(wd.as_ptr()), _mm_set1_ps(*xd));
                    _mm_storeu_ps(dd.as_mut_ptr(), p);
                }
            } else {
                for (dd, wd) in dd.iter_mut().zip(wd) {
                    *dd = wd * xd;
                }
            }
        }
    }
    let (w_row, x_row) = (o.nb * F::W_BYTES, o.nb * BLOCK);
    // SAFETY: x_wt asserted the weight's length, n * nb blocks, and the
    // task's input holds rows * nb blocks; the tile's rows and blocks
    // lie inside both (asserted above), as its products of scales do.
    unsafe {
        let wp = o.w.as_ptr().add(j0 * w_row + F::W_QS);
        let xp = o.x.as_ptr().add(r0 * x_row);
        let mut acc = [[_mm256_setzero_ps(); RN]; RM];
        for b in 0..o.nb {
            let mut wq = [_mm256_setzero_si256(); RN];
            for (j, wq) in wq.iter_mut().enumerate() {
                *wq = F::load(wp.add(j * w_row + b * F::W_BYTES));
            }
            let ddb = dd.as_ptr().add(b * RM * RN);
            for (r, acc) in acc.iter_mut().enumerate() {
                let xq = xp.add(r * x_row + b * BLOCK);
                let xq = _mm256_loadu_si256(xq as *const __m256i);
                for (j, acc) in acc.iter_mut().enumerate() {
                    let d = _mm256_broadcast_ss(&*ddb.add(r * RN + j));
                    *acc = _mm256_fmadd_ps(d, F::products::<D>(wq[j], xq), *acc);
                }
            }
        }
        // Q4_1's minimum term, each output's in block order (a
        // multiply, then an add, as candle's `summs += m * s`).
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
}

/// candle's `hsum_float_8`, in its order.
#[inline(always)]
unsafe fn hsum(x: __m256) -> f32 {
    let res = _mm256_extractf128_ps(x, 1);
    let res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    let res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    let res = _mm_add_ss(res, _mm_movehdup_ps(res));
    _mm_cvtss_f32(res)
}
