//! A dense layer `y = x W^T + b` as one op. Composed from candle's ops it
//! is five graph nodes (reshape, transpose, matmul, bias add, reshape), and
//! candle's backward zero-fills and then adds a gradient buffer for each:
//! in a `perf` profile of the GPT step that memset and add were 12% of the
//! samples after the fused attention. Here the forward is one `gemm` call
//! that starts from the bias rows, and the backward is two matmuls and a
//! column sum with no graph of their own.
//!
//! On CUDA (`dense_cuda.rs`) the same: one cuBLAS product onto the bias
//! rows, and a column-sum kernel for the bias gradient; in a kernel profile
//! of the GPT-2 step (`scripts/gpu-check.sh profile`) the composed version's
//! broadcast adds, their zero-then-add gradients and the bias sums took
//! about a fifth of the step.
//!
//! With a bias, f32 on the CPU and f32, f16 or bf16 on CUDA (all three
//! tensors in one dtype); otherwise the composed ops.

use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, D};
use gemm::{gemm, Parallelism};

use super::bias::ColumnSum;

/// `x [.., in] W^T + b` for `w [out, in]` and `b [out]`.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let Some((&k, lead)) = x.dims().split_last() else {
        bail!("linear: a scalar input")
    };
    let n = w.dim(0)?;
    let mut out = lead.to_vec();
    out.push(n);
    match b {
        Some(b) if fused_ok(x, w, b) => {
            x.contiguous()?
                .apply_op3(&w.contiguous()?, &b.contiguous()?, Dense)
        }
        _ => {
            let rows = x.reshape(((), k))?.matmul(&w.t()?)?;
            let rows = match b {
                Some(b) => super::bias_add(&rows, b)?,
                None => rows,
            };
            rows.reshape(out)
        }
    }
}

fn fused_ok(x: &Tensor, w: &Tensor, b: &Tensor) -> bool {
    let here = |t: &Tensor| {
        t.dtype() == x.dtype() && t.device().same_device(x.device()) && super::covers(t)
    };
    super::fused()
        && [x, w, b].iter().all(|t| here(t))
        && w.rank() == 2
        && b.rank() == 1
        && x.dims().last() == w.dims().get(1)
        && b.dims().first() == w.dims().first()
}

struct Dense;

impl CustomOp3 for Dense {
    fn name(&self) -> &'static str {
        "taper-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = super::f32_slice(s1, l1, "linear input")?;
        let w = super::f32_slice(s2, l2, "linear weight")?;
        let b = super::f32_slice(s3, l3, "linear bias")?;
        let (n, k) = l2.shape().dims2()?;
        let rows = x.len() / k.max(1);
        if b.len() != n || rows * k != x.len() {
            bail!(
                "linear: input {:?}, weight [{n}, {k}], bias [{}]",
                l1.dims(),
                b.len()
            )
        }
        let mut y: Vec<f32> = Vec::with_capacity(rows * n);
        for _ in 0..rows {
            y.extend_from_slice(b);
        }
        if rows > 0 && n > 0 && k > 0 {
            let threads = candle_core::utils::get_num_threads();
            let par = if threads > 1 {
                Parallelism::Rayon(threads)
            } else {
                Parallelism::None
            };
            // SAFETY: y is rows x n (row stride n), x rows x k (row stride
            // k), and W^T is read from w [n, k] as k x n with row stride 1
            // and column stride k; all three slices have exactly those sizes.
            unsafe {
                gemm(
                    rows,
                    n,
                    k,
                    y.as_mut_ptr(),
                    1,
                    n as isize,
                    true,
                    x.as_ptr(),
                    1,
                    k as isize,
                    w.as_ptr(),
                    k as isize,
                    1,
                    1.0,
                    1.0,
                    false,
                    false,
                    false,
                    par,
                )
            }
        }
        let mut out = l1.dims().to_vec();
        *out.last_mut().expect("checked rank") = n;
        Ok((CpuStorage::F32(y), Shape::from(out)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::dense_cuda::forward;
        let y = super::cuda::by_float!(s1, forward((s1, l1), (s2, l2), (s3, l3)))?;
        let mut out = l1.dims().to_vec();
        *out.last_mut().expect("checked rank") = l2.dims()[0];
        Ok((y, Shape::from(out)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, db) = linear_grads(x, w, dy)?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// The dense layer's backward: `(dx, dw, db)` for `x [.., in]`, `w [out,
/// in]` and the output's gradient `dy [.., out]`. Two products and a
/// column sum, recording no graph (`taper bench products` times it).
pub fn linear_grads(x: &Tensor, w: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let (x, w, dy) = (x.detach(), w.detach(), dy.detach());
    let (k, n) = (x.dim(D::Minus1)?, w.dim(0)?);
    let g = dy.reshape(((), n))?;
    let dx = g.matmul(&w)?.reshape(x.shape())?;
    let x = x.reshape(((), k))?;
    let dw = if super::weight_grad::applies(&g, &x) {
        g.contiguous()?
            .apply_op2_no_bwd(&x.contiguous()?, &super::weight_grad::WeightGrad)?
    } else {
        g.t()?.matmul(&x)?
    };
    let db = g.contiguous()?.apply_op1_no_bwd(&ColumnSum)?;
    Ok((dx, dw, db))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    /// Forward and all three gradients against the composed ops in f64.
    #[test]
    fn matches_composed_linear_in_float64() -> Result<()> {
        let dev = Device::Cpu;
        let vals = |n: usize, m: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * m) % 1009) as f32 / 504.5 - 1.0)
                .collect()
        };
        let x = Var::from_tensor(&Tensor::from_vec(
            vals(3 * 70 * 33, 7919),
            (3, 70, 33),
            &dev,
        )?)?;
        let w = Var::from_tensor(&Tensor::from_vec(vals(21 * 33, 104_729), (21, 33), &dev)?)?;
        let b = Var::from_tensor(&Tensor::from_vec(vals(21, 31), 21, &dev)?)?;
        let probe = Tensor::from_vec(vals(3 * 70 * 21, 613), (3, 70, 21), &dev)?;
        let y = linear(x.as_tensor(), w.as_tensor(), Some(b.as_tensor()))?;
        assert_eq!(y.dims(), &[3, 70, 21]);
        let g = (&y * &probe)?.sum_all()?.backward()?;

        let f64v =
            |v: &Var| -> Result<Var> { Var::from_tensor(&v.as_tensor().to_dtype(DType::F64)?) };
        let (x64, w64, b64) = (f64v(&x)?, f64v(&w)?, f64v(&b)?);
        let y64 = x64
            .as_tensor()
            .broadcast_matmul(&w64.as_tensor().t()?)?
            .broadcast_add(b64.as_tensor())?;
        let g64 = (&y64 * probe.to_dtype(DType::F64)?)?
            .sum_all()?
            .backward()?;

        let err = |a: &Tensor, r: &Tensor| -> Result<f64> {
            let d = (a.to_dtype(DType::F64)? - r)?
                .abs()?
                .flatten_all()?
                .max(0)?;
            Ok(d.to_scalar::<f64>()? / r.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()?)
        };
        assert!(err(&y, &y64)? < 1e-6, "forward");
        for (v, r) in [(&x, &x64), (&w, &w64), (&b, &b64)] {
            let e = err(g.get(v).expect("gradient"), g64.get(r).expect("gradient"))?;
            assert!(e < 1e-6, "gradient error {e}");
        }
        Ok(())
    }

    /// candle's CPU matmul no longer zeroes its output before gemm writes
    /// it (the vendored candle's fifth change, vendor/README.md). Buffers of
    /// the output's size full of NaN are freed just before each product, so
    /// the allocator hands one back for its output; a product that read its
    /// output, or left a value unwritten, would carry a NaN into the result. Shapes: a batch, the
    /// batch folded into rows (a shared right operand), gemv (one row or one
    /// column), an inner dimension of 0, and transposed operands, each
    /// against float64.
    #[test]
    fn matmul_writes_its_whole_output_without_reading_it() -> Result<()> {
        let dev = Device::Cpu;
        let vals = |n: usize, m: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * m) % 997) as f32 / 498.5 - 1.0)
                .collect()
        };
        let shapes: [(&[usize], &[usize]); 6] = [
            (&[3, 17, 40], &[3, 40, 23]),
            (&[4, 33, 19], &[19, 29]),
            (&[1, 64], &[64, 300]),
            (&[300, 64], &[64, 1]),
            (&[2, 9, 0], &[2, 0, 7]),
            (&[130, 70], &[70, 90]),
        ];
        for (i, (a, b)) in shapes.iter().enumerate() {
            let (na, nb) = (a.iter().product(), b.iter().product());
            let lhs = Tensor::from_vec(vals(na, 7919 + i), *a, &dev)?;
            let mut rhs = Tensor::from_vec(vals(nb, 104_729 + i), *b, &dev)?;
            if i == 5 {
                // A transposed right operand: strides other than row-major.
                rhs = Tensor::from_vec(vals(nb, 31), (90, 70), &dev)?.t()?;
            }
            let want = lhs
                .to_dtype(DType::F64)?
                .broadcast_matmul(&rhs.to_dtype(DType::F64)?)?
                .flatten_all()?
                .to_vec1::<f64>()?;
            for _ in 0..3 {
                let poison: Vec<Vec<f32>> = (0..8).map(|_| vec![f32::NAN; want.len()]).collect();
                drop(std::hint::black_box(poison));
                let got = lhs
                    .broadcast_matmul(&rhs)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                assert_eq!(got.len(), want.len(), "{a:?} x {b:?}");
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (*g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()),
                        "{a:?} x {b:?}: {g} vs {w}"
                    );
                }
            }
        }
        Ok(())
    }
}
