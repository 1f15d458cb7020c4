//! The CUDA path of the dense layer (`dense.rs` has the CPU reference):
//! the output starts as the bias rows and one cuBLAS product adds `x W^T`
//! onto it (or, switched on, one cuBLASLt product with the bias in its
//! epilogue: `lt.rs`); the bias gradient is a two-stage column sum
//! (`kernels/dense.cu`).

use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, Gemm};
use candle_core::cuda_backend::cudarc::cublaslt::{CudaBlasLT, Matmul};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{bail, CudaStorage, Layout, Result, WithDType};

use super::blas::{int, product, Mat};
use super::cuda::{
    alloc, column_chunks, kernel, pack_width, rows_cols, run, suffix, sum_chunks, view, DENSE,
};

/// `x [rows, k] W^T + b` for `w [n, k]`, `b [n]`: `[rows, n]`.
pub(super) fn forward<T: CudaDType + DeviceRepr + WithDType>(
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
    (s3, l3): (&CudaStorage, &Layout),
) -> Result<CudaStorage>
where
    CudaBlas: Gemm<T>,
    CudaBlasLT: Matmul<T>,
{
    let (n, k) = l2.shape().dims2()?;
    let (x, w, b) = (
        view::<T>(s1, l1, "linear input")?,
        view::<T>(s2, l2, "linear weight")?,
        view::<T>(s3, l3, "linear bias")?,
    );
    let rows = x.len() / k.max(1);
    if b.len() != n || rows * k != x.len() {
        bail!(
            "linear: input {:?}, weight [{n}, {k}], bias [{}]",
            l1.dims(),
            b.len()
        )
    }
    let dev = &s1.device;
    let mut y = alloc::<T>(dev, rows * n)?;
    if rows * n > 0
        && k > 0
        && super::cublaslt()
        && super::lt::applies::<T>([l1.start_offset(), l2.start_offset(), l3.start_offset()])
    {
        match super::lt::linear_bias(dev, (&x, &w, &b), &mut y, (rows, n, k)) {
            Ok(()) => return Ok(CudaStorage::wrap_cuda_slice(y, dev.clone())),
            Err(e) => super::lt::note_refusal(&e, (rows, n, k)),
        }
    }
    if rows * n > 0 {
        // 16-byte packs a thread where rows are whole packs and the bias
        // starts on a 16-byte boundary (the output is a fresh buffer).
        let v = pack_width::<T>(n, l3.start_offset());
        let name = if v > 1 {
            "bias_rows_packed"
        } else {
            "bias_rows"
        };
        let threads = n / v;
        let f = kernel!(DENSE, dev, format!("{name}_{}", suffix(T::DTYPE)?));
        let (rows_u, n_i) = (rows as u64, int(n)?);
        let mut args = f.builder();
        args.arg(&b).arg(&mut y).arg(&rows_u).arg(&n_i);
        let block = threads.next_multiple_of(32).min(256);
        let cfg = LaunchConfig {
            grid_dim: (threads.div_ceil(block) as u32, rows.min(1024) as u32, 1),
            block_dim: (block as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        run(&mut args, cfg)?;
        if k > 0 {
            let blas = dev.cublas_handle();
            product(
                &blas,
                1,
                (rows, n, k),
                (1.0, 1.0),
                (&x, Mat::new(0, k, rows * k)),
                (&w, Mat::new(0, k, n * k).t()),
                (&mut y, Mat::new(0, n, rows * n)),
            )?;
        }
    }
    Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
}

/// The sum over all rows of `g [.., cols]`: `[cols]`.
pub(super) fn column_sum<T: CudaDType + DeviceRepr + WithDType>(
    s: &CudaStorage,
    l: &Layout,
) -> Result<CudaStorage> {
    let (rows, cols) = rows_cols(l);
    let g = view::<T>(s, l, "bias gradient")?;
    let dev = &s.device;
    if cols == 0 {
        return Ok(CudaStorage::wrap_cuda_slice(
            alloc::<T>(dev, 0)?,
            dev.clone(),
        ));
    }
    let sfx = suffix(T::DTYPE)?;
    let (per, chunks) = column_chunks(rows);
    let partial = alloc::<f32>(dev, chunks * cols)?;
    let (rows_i, cols_i, per_i, chunks_i) = (int(rows)?, int(cols)?, int(per)?, int(chunks)?);
    // 16-byte packs (8 f16 or bf16 values, 4 f32) a thread where rows are
    // whole packs and start on 16-byte boundaries; a value a thread else.
    let v = pack_width::<T>(cols, l.start_offset());
    let name = match v {
        1 => format!("column_sum_partial_{sfx}"),
        _ => format!("column_sum_partial_packed_{sfx}"),
    };
    let cfg = LaunchConfig {
        grid_dim: (chunks as u32, cols.div_ceil(32 * v) as u32, 1),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    };
    let f = kernel!(DENSE, dev, name);
    let mut args = f.builder();
    args.arg(&g)
        .arg(&partial)
        .arg(&rows_i)
        .arg(&cols_i)
        .arg(&per_i);
    run(&mut args, cfg)?;
    let out = alloc::<T>(dev, cols)?;
    let f = kernel!(DENSE, dev, format!("column_sum_final_{sfx}"));
    let mut args = f.builder();
    args.arg(&partial).arg(&out).arg(&chunks_i).arg(&cols_i);
    run(&mut args, sum_chunks(cols))?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}
