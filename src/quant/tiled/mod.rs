//! `x W^T` for a frozen Q4_1 or Q8_0 weight on an x86-64 CPU with AVX2 and
//! FMA, in tiles of input rows by four weight rows: two input rows with
//! AVX2's instructions, four where the CPU has AVX512-VNNI and VL (32
//! registers, and one instruction for four bytes' products).
//!
//! candle's quantized matmul takes each pair of an input row and a weight
//! row through one dot product (`vec_dot_q4_1_q8_1`, `vec_dot_q8_0_q8_0`:
//! AVX2 in the vendored copy), so each weight block is loaded, and its f16
//! scales converted, once for every input row. A tile here loads four weight
//! blocks once for its input rows, and the scales are converted once a call.
//! Each output is computed with candle's operations in candle's order, so the
//! results are the same bits (the tests check it): the input rounded to the
//! weight's 8-bit companion type (Q8_1, Q8_0) as candle rounds it
//! ([`round`]), a block's integer products summed exactly, scaled and
//! accumulated with one FMA a block, the lanes summed as candle's
//! `hsum_float_8` does, and for Q4_1 the minimum's term `Σ m·s` added last,
//! in block order.
//!
//! SmolLM2's GGUF file holds its blocks' projections in Q4_1 and its tied
//! head in Q8_0; QLoRA's forward through them was 80% of a step with
//! candle's product (`taper bench quant` times both).

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Result;

/// `x [rows, k] W^T` for a Q4_1 or Q8_0 `w [n, k]`, or `None` where this
/// path does not apply (another type, another CPU, fewer than 4 rows) and
/// candle's matmul should run instead.
pub fn x_wt(x: &[f32], rows: usize, w: &QTensor) -> Result<Option<Vec<f32>>> {
    #[cfg(target_arch = "x86_64")]
    let vnni = is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl");
    #[cfg(not(target_arch = "x86_64"))]
    let vnni = false;
    x_wt_by(x, rows, w, vnni)
}

/// [`x_wt`], with AVX512-VNNI's sums (`vnni`, which the CPU must have) or
/// AVX2's.
fn x_wt_by(x: &[f32], rows: usize, w: &QTensor, vnni: bool) -> Result<Option<Vec<f32>>> {
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
                GgmlDType::Q4_1 => x86::x_wt::<x86::Q4_1>(x, rows, (n, k), &data, vnni),
                _ => x86::x_wt::<x86::Q8_0>(x, rows, (n, k), &data, vnni),
            }));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (x, rows, w, vnni, GgmlDType::Q4_1);
    Ok(None)
}

#[cfg(target_arch = "x86_64")]
mod round;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QMatMul;
    use candle_core::{Device, Module, Tensor};
    use std::sync::Arc;

    fn fixed(len: usize, step: f32, shift: f32) -> Vec<f32> {
        (0..len).map(|i| (i as f32 * step).sin() + shift).collect()
    }

    /// The same bits as candle's own quantized matmul, with AVX2's sums
    /// and, where the CPU has them, AVX512-VNNI's, over shapes whose rows
    /// and weight rows leave every kind of partial tile (1 to 3 rows, 1 to
    /// 3 weight rows) and a partial 16-row task.
    #[test]
    fn same_bits_as_candles_quantized_matmul() -> Result<()> {
        let dev = Device::Cpu;
        let shapes = [
            (4, 4, 32),
            (5, 7, 64),
            (23, 66, 64),
            (37, 130, 96),
            (64, 192, 576),
        ];
        let vnni = cfg!(target_arch = "x86_64")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vl");
        let sums: &[bool] = if vnni { &[false, true] } else { &[false] };
        for (((rows, n, k), dtype), &vnni) in shapes
            .into_iter()
            .flat_map(|s| [(s, GgmlDType::Q4_1), (s, GgmlDType::Q8_0)])
            .flat_map(|c| sums.iter().map(move |v| (c, v)))
        {
            let w = Tensor::from_vec(fixed(n * k, 0.377, 0.1), (n, k), &dev)?;
            let q = Arc::new(QTensor::quantize(&w, dtype)?);
            let x = fixed(rows * k, 0.519, -0.2);
            let ours = x_wt_by(&x, rows, &q, vnni)?;
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
                    "{dtype:?} [{rows}, {n}, {k}] (vnni {vnni}) at {i}: {a} against {b}"
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
