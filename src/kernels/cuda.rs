//! Loading and launching taper's CUDA kernels (`kernels/*.cu`, compiled to
//! PTX by `build.rs` and embedded here). Each PTX file is one module, loaded
//! once per device by candle's `get_or_load_custom_func`. The helpers below
//! check their arguments (dtype, contiguity, sizes) before any launch, and
//! every launch's error is returned, never ignored.

use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, CudaDevice, CudaStorage, DType, Layout, Result, WithDType};

/// A PTX module: the name it is cached under, and its text.
pub(crate) struct Module {
    pub(crate) name: &'static str,
    pub(crate) ptx: &'static str,
}

macro_rules! module {
    ($konst:ident, $file:literal) => {
        pub(crate) const $konst: Module = Module {
            name: concat!("taper-", $file),
            ptx: include_str!(concat!(env!("OUT_DIR"), "/", $file, ".ptx")),
        };
    };
}
module!(GELU, "gelu");
module!(ADD, "add");
module!(ROWS, "rows");
module!(ROPE, "rope");
module!(ADAMW, "adamw");
module!(CE, "ce");
module!(ATTENTION, "attention");
module!(DENSE, "dense");
module!(EMBEDDING, "embedding");
module!(CONV, "conv");
module!(FLASH, "flash");
module!(NORM, "norm");

/// Threads per block for element-wise kernels, and the most blocks a
/// grid-stride launch uses.
const THREADS: u32 = 256;
const MAX_BLOCKS: usize = 65_535;

/// `kernel!(module, device, name)`: the named kernel of a module on a
/// device (loading the module on first use), or an early error return.
/// A macro because candle does not export the function type it returns.
macro_rules! kernel {
    ($m:expr, $dev:expr, $name:expr) => {
        $dev.get_or_load_custom_func(&$name, $m.name, $m.ptx)?
    };
}
pub(crate) use kernel;

/// The kernel-name suffix of a float dtype.
pub(crate) fn suffix(dtype: DType) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        other => bail!("taper's CUDA kernels take f32, f16 or bf16, not {other:?}"),
    })
}

/// The contiguous values of a storage, as a view (callers make their
/// inputs contiguous first, as on the CPU).
pub(crate) fn view<'a, T: CudaDType>(
    s: &'a CudaStorage,
    l: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(s.as_cuda_slice::<T>()?.slice(a..b)),
        None => bail!("{what}: expected a contiguous tensor"),
    }
}

/// A grid-stride launch over `n` elements.
pub(crate) fn elementwise(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block per row of `cols` values: a warp multiple, at most 1024.
pub(crate) fn per_row(rows: usize, cols: usize) -> LaunchConfig {
    let threads = cols.next_multiple_of(32).clamp(32, 1024) as u32;
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Rows of `cols` values for the row kernels (ROW in kernels/common.cuh):
/// eight rows a block, a warp each, when rows are short (a block's
/// barriers and its 1024 threads cost more than such a row's work); a
/// block per row otherwise.
pub(crate) fn row_groups(rows: usize, cols: usize) -> LaunchConfig {
    if cols > 2048 {
        return per_row(rows, cols);
    }
    LaunchConfig {
        grid_dim: (rows.div_ceil(8) as u32, 1, 1),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    }
}

/// Two-stage column sums over `rows` rows (the dense layer's bias gradient,
/// the layer norm's weight and bias gradients): rows per chunk, and chunks
/// (at most 1024, of at least 32 rows). Each first stage launches its own
/// kernel over them.
pub(crate) fn column_chunks(rows: usize) -> (usize, usize) {
    let per = rows.div_ceil(1024).max(32);
    (per, rows.div_ceil(per).max(1))
}

/// The values of `T` a thread reads and writes at a time (16 bytes) when
/// rows of `cols` values, starting `offset` values into a buffer, are whole
/// packs on 16-byte boundaries; 1 otherwise. For launchers whose grid
/// depends on it (the kernels of `map_values` decide for themselves).
pub(crate) fn pack_width<T>(cols: usize, offset: usize) -> usize {
    let size = std::mem::size_of::<T>();
    let v = 16 / size;
    if cols.is_multiple_of(v) && (offset * size).is_multiple_of(16) {
        v
    } else {
        1
    }
}

/// The second stage of a column sum (`sum_chunks` in kernels/common.cuh)
/// over `m` values: a block of (32, 16) threads per 32 of them.
pub(crate) fn sum_chunks(m: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (m.div_ceil(32).max(1) as u32, 1, 1),
        block_dim: (32, 16, 1),
        shared_mem_bytes: 0,
    }
}

/// Floats of shared memory the one-pass layer-norm backward
/// (`layer_norm_bwd` in kernels/rows.cu) declares: `LN_SHARED` there.
const LN_SHARED: usize = 12_288;

/// The one-pass layer-norm backward's launch for `rows` rows of `cols`:
/// warps per block (as many as 8 whose accumulators, `2 * cols` floats
/// each, fit its shared memory), rows per block, and blocks; `None` when
/// one warp's do not fit (rows longer than 6144).
pub(crate) fn layer_norm_bwd_plan(rows: usize, cols: usize) -> Option<(usize, usize, usize)> {
    let warps = [8, 4, 2, 1]
        .into_iter()
        .find(|w| w * 2 * cols.max(1) <= LN_SHARED)?;
    // At most 512 blocks (so the partial sums stay small), of at least
    // four rows a warp (so the accumulators' set-up is worth it).
    let per = rows.div_ceil(512).max(4 * warps);
    Some((warps, per, rows.div_ceil(per).max(1)))
}

/// Runs a launch whose arguments `args` pushed.
pub(crate) fn run(b: &mut LaunchArgs<'_>, cfg: LaunchConfig) -> Result<()> {
    // SAFETY: every launcher passes the argument list its kernel declares,
    // with buffers at least as long as the sizes it passes.
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}

/// A fresh output buffer of `n` values. A failure is noted with its size,
/// so that an OOM here says what it asked for (`memory::oom`).
pub(crate) fn alloc<T: DeviceRepr>(dev: &CudaDevice, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: every kernel that receives it writes all n values.
    unsafe { dev.alloc::<T>(n) }.inspect_err(|_| {
        crate::memory::oom::note_failed_alloc((n * std::mem::size_of::<T>()) as u64)
    })
}

/// A fresh zero-filled buffer of `n` values, noted as [`alloc`] is.
pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    dev: &CudaDevice,
    n: usize,
) -> Result<CudaSlice<T>> {
    dev.alloc_zeros::<T>(n).inspect_err(|_| {
        crate::memory::oom::note_failed_alloc((n * std::mem::size_of::<T>()) as u64)
    })
}

/// `by_float!(storage, f(args))`: calls the generic launcher `f::<T>` for
/// the storage's float dtype.
macro_rules! by_float {
    ($storage:expr, $f:ident ( $($arg:expr),* $(,)? )) => {
        match candle_core::backend::BackendStorage::dtype($storage) {
            candle_core::DType::F32 => $f::<f32>($($arg),*),
            candle_core::DType::F16 => $f::<half::f16>($($arg),*),
            candle_core::DType::BF16 => $f::<half::bf16>($($arg),*),
            other => candle_core::bail!("taper's CUDA kernels take f32, f16 or bf16, not {other:?}"),
        }
    };
}
pub(crate) use by_float;

/// A grid-stride launch for kernels that take 16 bytes a thread at a time
/// (`kernels/gelu.cu`): a thread per 8 values.
pub(crate) fn packed(n: usize) -> LaunchConfig {
    elementwise(n.div_ceil(8))
}

/// `kernel(x, out, n)` over every element, in a new storage; the kernel
/// takes 16 bytes a thread at a time ([`packed`]).
pub(crate) fn map1(m: &Module, base: &str, s: &CudaStorage, l: &Layout) -> Result<CudaStorage> {
    fn go<T: CudaDType + DeviceRepr + WithDType>(
        m: &Module,
        base: &str,
        s: &CudaStorage,
        l: &Layout,
    ) -> Result<CudaStorage> {
        let x = view::<T>(s, l, base)?;
        let n = x.len();
        let dev = &s.device;
        let out = alloc::<T>(dev, n)?;
        if n > 0 {
            let f = kernel!(m, dev, format!("{base}_{}", suffix(T::DTYPE)?));
            let mut b = f.builder();
            b.arg(&x).arg(&out).arg(&n);
            run(&mut b, packed(n))?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
    by_float!(s, go(m, base, s, l))
}

/// `kernel(a, b, out, n)` over two inputs of the same size and dtype; the
/// kernel takes 16 bytes a thread at a time ([`packed`]).
pub(crate) fn map2(
    m: &Module,
    base: &str,
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    fn go<T: CudaDType + DeviceRepr + WithDType>(
        m: &Module,
        base: &str,
        (s1, l1): (&CudaStorage, &Layout),
        (s2, l2): (&CudaStorage, &Layout),
    ) -> Result<CudaStorage> {
        let (a, b2) = (view::<T>(s1, l1, base)?, view::<T>(s2, l2, base)?);
        let n = a.len();
        if b2.len() != n {
            bail!("{base}: inputs of {n} and {} values", b2.len())
        }
        let dev = &s1.device;
        let out = alloc::<T>(dev, n)?;
        if n > 0 {
            let f = kernel!(m, dev, format!("{base}_{}", suffix(T::DTYPE)?));
            let mut b = f.builder();
            b.arg(&a).arg(&b2).arg(&out).arg(&n);
            run(&mut b, packed(n))?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
    by_float!(s1, go(m, base, (s1, l1), (s2, l2)))
}

/// The number of rows and the row length of a layout.
pub(crate) fn rows_cols(l: &Layout) -> (usize, usize) {
    let cols = l.shape().dims().last().copied().unwrap_or(1).max(1);
    (l.shape().elem_count() / cols, cols)
}

/// A row kernel `kernel(inputs.., out, cols, rows, extra..)` launched by
/// [`row_groups`]; `extra` are trailing f32 arguments.
pub(crate) fn rows<T: CudaDType + DeviceRepr + WithDType>(
    m: &Module,
    base: &str,
    inputs: &[(&CudaStorage, &Layout)],
    extra: &[f32],
) -> Result<CudaStorage> {
    let (s0, l0) = inputs[0];
    let (nrows, cols) = rows_cols(l0);
    let views = inputs
        .iter()
        .map(|(s, l)| view::<T>(s, l, base))
        .collect::<Result<Vec<_>>>()?;
    let dev = &s0.device;
    let out = alloc::<T>(dev, nrows * cols)?;
    if nrows > 0 {
        let f = kernel!(m, dev, format!("{base}_{}", suffix(T::DTYPE)?));
        let mut b = f.builder();
        for v in &views {
            b.arg(v);
        }
        let (cols_i, rows_i) = (cols as i32, nrows as i32);
        b.arg(&out).arg(&cols_i).arg(&rows_i);
        for x in extra {
            b.arg(x);
        }
        run(&mut b, row_groups(nrows, cols))?;
    }
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}
