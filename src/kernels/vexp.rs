//! Softmax rows on the CPU in code the compiler vectorizes. `f32::exp` is a
//! call to libm's `expf` per value, and a max or sum folded in one
//! accumulator is a serial chain (floating-point adds are not reordered
//! for it): together they were a tenth of the Shakespeare GPT's CPU step.
//! Here `exp` is Cephes' `expf` (a range reduction by ln 2 and a degree-6
//! polynomial) written without branches or calls, and the reductions keep
//! eight accumulators, combined in a fixed order.

const LANES: usize = 8;

/// e^x within 2 ulp of the exact value (checked against f64 below) for x
/// in [-87.3, 88.3]; outside it, e^x of the nearest end.
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    // 1.5 * 2^23: adding it rounds to an integer, which its low mantissa
    // bits then hold.
    const MAGIC: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.3);
    let m = x * std::f32::consts::LOG2_E + MAGIC;
    let n = m - MAGIC;
    // x - n ln 2, with ln 2 in two parts so that the first product is exact.
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // 2^n: n + 127 in the exponent field.
    let k = (m.to_bits() as i32 - MAGIC.to_bits() as i32 + 127) as u32;
    e * f32::from_bits(k << 23)
}

/// The largest value of `v` (negative infinity for none; NaNs are
/// skipped, as `f32::max` does).
#[inline(always)]
pub(super) fn max(v: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.max(x);
        }
    }
    tail.iter()
        .chain(&acc)
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// `v` to `exp(v - max v)` in place; returns their sum.
#[inline(always)]
fn exp_shifted(v: &mut [f32], top: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = v.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *x = exp(*x - top);
            *a += *x;
        }
    }
    let mut sum = 0f32;
    for x in chunks.into_remainder() {
        *x = exp(*x - top);
        sum += *x;
    }
    acc.iter().fold(sum, |s, &a| s + a)
}

/// `Σ exp(v - top)` and `Σ v`, each in eight lanes.
#[inline(always)]
pub(super) fn sum_exp_and_sum(v: &[f32], top: f32) -> (f32, f32) {
    let (mut e, mut p) = ([0f32; LANES], [0f32; LANES]);
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for ((e, p), &x) in e.iter_mut().zip(p.iter_mut()).zip(c) {
            *e += exp(x - top);
            *p += x;
        }
    }
    let (mut se, mut sp) = (0f32, 0f32);
    for &x in tail {
        se += exp(x - top);
        sp += x;
    }
    (
        e.iter().fold(se, |s, &a| s + a),
        p.iter().fold(sp, |s, &a| s + a),
    )
}

/// A softmax row, in place.
#[inline(always)]
pub(super) fn softmax(v: &mut [f32]) {
    let top = max(v);
    let r = 1.0 / exp_shifted(v, top);
    v.iter_mut().for_each(|x| *x *= r);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every 997th f32 in the clamped range, and its ends, against f64.
    #[test]
    fn exp_is_within_2_ulp_of_float64() {
        let (lo, hi) = (-87.3f32, 88.3f32);
        let mut worst = 0f64;
        let mut check = |x: f32| {
            let want = (x as f64).exp();
            let ulp = (want as f32).to_bits().abs_diff(exp(x).to_bits());
            assert!(ulp <= 2, "exp({x}) = {} vs {want}: {ulp} ulp", exp(x));
            worst = worst.max(((exp(x) as f64 - want) / want).abs());
        };
        for bits in (0..u32::MAX).step_by(997) {
            let x = f32::from_bits(bits);
            if x.is_finite() && (lo..=hi).contains(&x) {
                check(x);
            }
        }
        check(lo);
        check(hi);
        check(0.0);
        assert!(worst < 3e-7, "{worst}");
        assert_eq!(exp(-1000.0), exp(lo));
    }

    /// Rows of every length up to three chunks against f64, with a large
    /// spread of values.
    #[test]
    fn softmax_matches_float64() {
        for n in 1..=3 * LANES + 1 {
            let row: Vec<f32> = (0..n)
                .map(|i| ((i * 37) % 23) as f32 * 1.7 - 19.0)
                .collect();
            let mut got = row.clone();
            softmax(&mut got);
            let top = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
            let e: Vec<f64> = row.iter().map(|&x| (x as f64 - top).exp()).collect();
            let s: f64 = e.iter().sum();
            for (g, w) in got.iter().zip(&e) {
                assert!(
                    ((*g as f64) - w / s).abs() <= 1e-6 * (w / s) + 1e-12,
                    "{n}: {g} vs {}",
                    w / s
                );
            }
        }
    }
}
