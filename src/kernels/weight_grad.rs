//! A dense layer's weight gradient on the CPU, `dW = G^T X` for `G [rows,
//! n]` and `X [rows, k]`: a product whose output is small and whose
//! reduction (every sample's position) is long. gemm's threads split the
//! output, so a 192 x 64 gradient over 2048 rows ran at one core's speed
//! with two (98 against 165 GFLOP/s for `dX` on the same machine). Here the
//! rows are cut into blocks of a fixed size whose partial products run in
//! parallel, one thread each, and are summed in block order: the result
//! does not depend on how many threads there are.

use candle_core::{bail, CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

/// Rows per partial product.
const BLOCK_ROWS: usize = 512;

/// Outputs larger than this have tiles enough for gemm's own threads, and
/// a partial per block would cost memory.
const MAX_OUT: usize = 1 << 17;

/// Whether `g^T x` takes the blocked product: f32 CPU matrices with more
/// than one block of rows and a small output.
pub(super) fn applies(g: &Tensor, x: &Tensor) -> bool {
    let (Ok((rows, n)), Ok((rows_x, k))) = (g.dims2(), x.dims2()) else {
        return false;
    };
    g.device().is_cpu()
        && g.dtype() == DType::F32
        && x.dtype() == DType::F32
        && rows == rows_x
        && rows > BLOCK_ROWS
        && n * k <= MAX_OUT
}

/// `(g [rows, n], x [rows, k])` to `g^T x [n, k]`; no backward.
pub(super) struct WeightGrad;

impl CustomOp2 for WeightGrad {
    fn name(&self) -> &'static str {
        "taper-weight-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = super::f32_slice(s1, l1, "weight gradient: output gradient")?;
        let x = super::f32_slice(s2, l2, "weight gradient: input")?;
        let ((rows, n), (rows_x, k)) = (l1.shape().dims2()?, l2.shape().dims2()?);
        if rows != rows_x {
            bail!("weight gradient: {rows} rows of output gradient for {rows_x} of input")
        }
        let partial = |block: usize| {
            let r0 = block * BLOCK_ROWS;
            let r = BLOCK_ROWS.min(rows - r0);
            let mut out = vec![0f32; n * k];
            // G^T's block [n, r] read from g [rows, n] at row r0 (row stride
            // 1, column stride n); X's block [r, k] from x at row r0.
            super::mm(
                (n, k, r),
                &mut out,
                false,
                &g[r0 * n..],
                (1, n),
                &x[r0 * k..],
                (k, 1),
            );
            out
        };
        let dw = super::sum_in_order(rows.div_ceil(BLOCK_ROWS), n * k, partial);
        Ok((CpuStorage::F32(dw), Shape::from((n, k))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Against a float64 product, for row counts that end a block exactly,
    /// leave a partial one, and are a single block; and the same result
    /// whatever the thread pool's size.
    #[test]
    fn matches_float64_and_ignores_the_thread_count() -> Result<()> {
        let dev = Device::Cpu;
        for (rows, n, k) in [(1024, 24, 40), (1300, 67, 64), (513, 3, 5)] {
            let vals = |len: usize, m: usize| -> Vec<f32> {
                (0..len)
                    .map(|i| ((i * m) % 1013) as f32 / 506.5 - 1.0)
                    .collect()
            };
            let g = Tensor::from_vec(vals(rows * n, 7919), (rows, n), &dev)?;
            let x = Tensor::from_vec(vals(rows * k, 104_729), (rows, k), &dev)?;
            assert!(applies(&g, &x));
            let dw = g.apply_op2_no_bwd(&x, &WeightGrad)?;
            let want = g
                .to_dtype(DType::F64)?
                .t()?
                .matmul(&x.to_dtype(DType::F64)?)?;
            let err = (dw.to_dtype(DType::F64)? - &want)?
                .abs()?
                .flatten_all()?
                .max(0)?
                .to_scalar::<f64>()?;
            let scale = want.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()?;
            assert!(err <= 1e-5 * scale, "{rows}x{n}x{k}: {err} of {scale}");
            let one = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap();
            let alone = one.install(|| g.apply_op2_no_bwd(&x, &WeightGrad))?;
            let (a, b) = (
                dw.flatten_all()?.to_vec1::<f32>()?,
                alone.flatten_all()?.to_vec1::<f32>()?,
            );
            assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
        }
        Ok(())
    }
}
