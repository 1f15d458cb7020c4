//! The input's gradient through a frozen quantized layer on the CPU,
//! `dx [rows, k] = dy [rows, n] W` for `W [n, k]`, with `W` dequantized a
//! block of its rows at a time into a buffer each thread keeps, and one
//! product per block accumulating into `dx`.
//!
//! candle's `QTensor::dequantize` makes a fresh f32 copy of the whole weight
//! in every backward (424 MB a step for SmolLM2-135M's blocks; 113 MB at a
//! time for its tied head), which the allocator takes from, and gives back
//! to, the kernel: page faults and zeroed pages were 5% of a QLoRA step.
//! The buffer here holds at most [`CHUNK`] values (4 MiB).

use std::borrow::Cow;
use std::cell::RefCell;

use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8_0, GgmlType,
};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Result;
use gemm::{gemm, Parallelism};
use rayon::prelude::*;

/// Values a block of dequantized rows may hold.
const CHUNK: usize = 1 << 20;

/// Values a task dequantizes (whole rows, at least one).
const TASK: usize = 1 << 15;

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `dx = dy W` for `dy [rows, n]`, or None where `q`'s rows cannot be
/// dequantized apart here (another type, rows that are not whole blocks, a
/// weight not on the CPU): the caller then dequantizes the whole weight.
pub fn dy_w(q: &QTensor, dy: &[f32], rows: usize) -> Result<Option<Vec<f32>>> {
    dy_w_by(q, dy, rows, CHUNK)
}

/// [`dy_w`] with blocks of up to `chunk` values (whole rows, at least one).
fn dy_w_by(q: &QTensor, dy: &[f32], rows: usize, chunk: usize) -> Result<Option<Vec<f32>>> {
    let (n, k) = q.shape().dims2()?;
    assert_eq!(dy.len(), rows * n, "quantized linear: the gradient's size");
    let Some(to_rows) = rows_of(q.dtype()) else {
        return Ok(None);
    };
    let Cow::Borrowed(data) = q.data()? else {
        return Ok(None);
    };
    if n == 0 || k == 0 || !to_rows(data, k, (0, 0), &mut []) {
        return Ok(None);
    }
    if rows == 0 {
        return Ok(Some(Vec::new()));
    }
    // Not zeroed: the first block's product writes every value without
    // reading it (gemm's `read_dst` false), and the others add to it.
    let mut dx: Vec<f32> = Vec::with_capacity(rows * k);
    let per = (chunk / k).clamp(1, n);
    let threads = match candle_core::utils::get_num_threads() {
        0 | 1 => Parallelism::None,
        t => Parallelism::Rayon(t),
    };
    SCRATCH.with(|cell| {
        // A second borrow on this thread (a product inside another's
        // parallel section) takes a buffer of its own.
        let mut own = Vec::new();
        let mut kept = cell.try_borrow_mut();
        let buf = match kept.as_deref_mut() {
            Ok(v) => v,
            Err(_) => &mut own,
        };
        buf.resize(per * k, 0.0);
        for r0 in (0..n).step_by(per) {
            let m = per.min(n - r0);
            let w = &mut buf[..m * k];
            if !to_rows(data, k, (r0, r0 + m), w) {
                candle_core::bail!("quantized linear: rows {r0}..{} of {:?}", r0 + m, q.shape())
            }
            // SAFETY: dx's capacity is rows x k (row stride k), written by
            // the first block before any block reads it; dy[:, r0..r0 + m]
            // (row stride n) lies in dy, which is rows x n (asserted); w is
            // m x k.
            unsafe {
                gemm(
                    rows,
                    k,
                    m,
                    dx.as_mut_ptr(),
                    1,
                    k as isize,
                    r0 > 0,
                    dy.as_ptr().add(r0),
                    1,
                    n as isize,
                    w.as_ptr(),
                    1,
                    k as isize,
                    1.0,
                    1.0,
                    false,
                    false,
                    false,
                    threads,
                )
            }
        }
        Ok(())
    })?;
    // SAFETY: the block at r0 = 0 wrote all rows * k values (n > 0).
    unsafe { dx.set_len(rows * k) };
    Ok(Some(dx))
}

/// Rows `r0..r1` of a weight of `B` blocks with rows of `k` values,
/// dequantized into `out`; false where they are not whole blocks in bytes
/// aligned for `B`, or lie outside.
type Rows = fn(&[u8], usize, (usize, usize), &mut [f32]) -> bool;

fn rows_of(dtype: GgmlDType) -> Option<Rows> {
    use GgmlDType as D;
    Some(match dtype {
        D::Q4_0 => blocks::<BlockQ4_0>,
        D::Q4_1 => blocks::<BlockQ4_1>,
        D::Q5_0 => blocks::<BlockQ5_0>,
        D::Q5_1 => blocks::<BlockQ5_1>,
        D::Q8_0 => blocks::<BlockQ8_0>,
        D::Q2K => blocks::<BlockQ2K>,
        D::Q3K => blocks::<BlockQ3K>,
        D::Q4K => blocks::<BlockQ4K>,
        D::Q5K => blocks::<BlockQ5K>,
        D::Q6K => blocks::<BlockQ6K>,
        _ => return None,
    })
}

fn blocks<B: GgmlType>(bytes: &[u8], k: usize, (r0, r1): (usize, usize), out: &mut [f32]) -> bool {
    let size = std::mem::size_of::<B>();
    if !k.is_multiple_of(B::BLCK_SIZE)
        || !bytes.len().is_multiple_of(size)
        || bytes.as_ptr().align_offset(std::mem::align_of::<B>()) != 0
    {
        return false;
    }
    // SAFETY: a CPU QTensor's data is its Vec of blocks seen as bytes: the
    // pointer is aligned for B (checked), and the bytes hold
    // bytes.len() / size whole blocks of plain integers and f16s.
    let all: &[B] =
        unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len() / size) };
    let per_row = k / B::BLCK_SIZE;
    match all.get(r0 * per_row..r1 * per_row) {
        Some(rows) if out.len() == (r1 - r0) * k => {
            // Across the pool: candle's to_float is one thread's loop, and
            // the product that follows waits for it.
            let per = (TASK / k).max(1);
            rows.par_chunks(per * per_row)
                .zip(out.par_chunks_mut(per * k))
                .for_each(|(b, o)| B::to_float(b, o));
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Tensor};

    /// The input's gradient against a float64 product with the whole
    /// dequantized weight, in blocks of 5 rows (the last of 2), of 1 row,
    /// and whole (dequantized by three tasks, the last of 41 rows); for the
    /// 4- and 8-bit types and a k-quant.
    #[test]
    fn the_gradient_by_blocks_matches_the_whole_weight_in_float64() -> Result<()> {
        let dev = Device::Cpu;
        let (n, k, rows) = (297, 256, 19);
        let wave = |len: usize, step: f32| -> Vec<f32> {
            (0..len).map(|i| (i as f32 * step).sin()).collect()
        };
        let w = Tensor::from_vec(wave(n * k, 0.377), (n, k), &dev)?;
        let dy = wave(rows * n, 0.291);
        for dtype in [
            GgmlDType::Q8_0,
            GgmlDType::Q4_1,
            GgmlDType::Q4_0,
            GgmlDType::Q4K,
        ] {
            let q = QTensor::quantize(&w, dtype)?;
            let wd = q.dequantize(&dev)?.to_dtype(DType::F64)?;
            let exact: Vec<f64> = Tensor::from_vec(dy.clone(), (rows, n), &dev)?
                .to_dtype(DType::F64)?
                .matmul(&wd)?
                .flatten_all()?
                .to_vec1()?;
            for chunk in [5 * k, 1, CHUNK] {
                let dx = dy_w_by(&q, &dy, rows, chunk)?.expect("a type with blocks");
                for (i, (g, w)) in dx.iter().zip(&exact).enumerate() {
                    assert!(
                        (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "{dtype:?} dx[{i}], blocks of {chunk} values: {g} vs {w}"
                    );
                }
            }
        }
        let f16 = QTensor::quantize(&w, GgmlDType::F16)?;
        assert!(dy_w(&f16, &dy, rows)?.is_none());
        Ok(())
    }
}
