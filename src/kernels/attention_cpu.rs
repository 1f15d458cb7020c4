//! The CPU algorithm of the fused attention (`attention.rs` has the causal
//! op and its dispatch, `padded_attention.rs` the bidirectional one over
//! padded texts): each (batch, head) pair is a rayon task that reads q, k
//! and v in place with strided `gemm` calls, one block of query rows at a
//! time, multiplying only the keys each row sees: the unmasked triangle, or
//! a padded text's own positions.

use candle_core::{bail, CpuStorage, Layout, Result, Shape};
use gemm::{gemm, Parallelism};
use multiversion::multiversion;
use rayon::prelude::*;

use super::attention::Dims;

/// Query rows per block.
const BLOCK: usize = 64;

/// The keys a query row sees.
#[derive(Clone, Copy)]
pub(super) enum Keys<'a> {
    /// Its own and earlier ones.
    Causal,
    /// Every key of its batch element's text: the first `lens[b]`.
    Lengths(&'a [usize]),
}

impl Keys<'_> {
    /// Keys of query rows `r0..r0 + m` of batch element `b`.
    fn of(self, b: usize, r0: usize, m: usize) -> usize {
        match self {
            Keys::Causal => r0 + m,
            Keys::Lengths(lens) => lens[b],
        }
    }
}

/// Dropout on the attention weights: the draw, and the batch's place of
/// the call's first sample. A weight's row is (sample, head, query).
#[derive(Clone, Copy)]
pub(super) struct Dropped<'a> {
    pub(super) draw: &'a super::Dropout,
    pub(super) first: usize,
}

impl<'a> Dropped<'a> {
    /// The kernels' view of an op's dropout: the draw and the batch's place
    /// of its first sample.
    pub(super) fn of(drop: &'a Option<(super::Dropout, usize)>) -> Option<Dropped<'a>> {
        drop.as_ref().map(|(draw, first)| Dropped {
            draw,
            first: *first,
        })
    }

    /// Rows `r0..` of `(b, h)`'s weights `p` (rows of `n`), dropped or
    /// scaled.
    fn apply(self, (b, h, r0): (usize, usize, usize), p: &mut [f32], n: usize) {
        for (i, row) in p.chunks_mut(n).enumerate() {
            let ids = [(self.first + b) as u64, h as u64, (r0 + i) as u64];
            self.draw.apply(self.draw.row(&ids), row);
        }
    }
}

/// A pointer that tasks share to write disjoint parts of one buffer.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: each task writes only the columns of its own (batch, head).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// The pointer `i` values in (a method, so that closures capture the
    /// whole `Out` rather than its raw pointer).
    ///
    /// SAFETY: `i` lies inside the buffer.
    unsafe fn at(self, i: usize) -> *mut f32 {
        self.0.add(i)
    }
}

/// `dst[m x n] (row stride dst_rs) = alpha * dst + beta * lhs * rhs`, with
/// `lhs` (m x k) and `rhs` (k x n) given by (row stride, column stride).
///
/// SAFETY: the caller guarantees every pointer covers its strided matrix.
#[allow(clippy::too_many_arguments)]
unsafe fn mm(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    dst_rs: usize,
    accumulate: bool,
    lhs: (*const f32, usize, usize),
    rhs: (*const f32, usize, usize),
    beta: f32,
) {
    gemm(
        m,
        n,
        k,
        dst,
        1,
        dst_rs as isize,
        accumulate,
        lhs.0,
        lhs.2 as isize,
        lhs.1 as isize,
        rhs.0,
        rhs.2 as isize,
        rhs.1 as isize,
        1.0,
        beta,
        false,
        false,
        false,
        Parallelism::None,
    )
}

/// The attention weights of query rows `r0..r0 + m` over keys `0..n` into
/// `p` (`m x n`): scaled scores, the causal mask (`causal`: `n = r0 + m`),
/// softmax.
///
/// SAFETY: `q` and `k` point at this head's q and k in a `qkv` of `d`.
unsafe fn weights(
    d: Dims,
    q: *const f32,
    k: *const f32,
    (r0, m, n): (usize, usize, usize),
    causal: bool,
    p: &mut [f32],
) {
    let rs = 3 * d.c();
    mm(
        (m, n, d.hd),
        p.as_mut_ptr(),
        n,
        false,
        (q.add(r0 * rs), rs, 1),
        (k, 1, rs),
        d.scale(),
    );
    match causal {
        true => causal_softmax(p, n, r0),
        false => p.chunks_mut(n).for_each(super::vexp::softmax),
    }
}

/// Rows of `n` scores of the queries from `r0` on: softmax over the keys up
/// to each query's own, zeros after.
#[multiversion(targets("x86_64+avx2+fma"))]
fn causal_softmax(p: &mut [f32], n: usize, r0: usize) {
    for (i, row) in p.chunks_mut(n).enumerate() {
        let (live, masked) = row.split_at_mut(r0 + i + 1);
        super::vexp::softmax(live);
        masked.fill(0.0);
    }
}

/// `dS = P (dP - rowsum(dY y))` in place of `dp`, rows of `n`; row `i`'s
/// `y` and `dY` are the `hd` values at `at + i * c`.
#[multiversion(targets("x86_64+avx2+fma"))]
fn softmax_grad_rows(
    dp: &mut [f32],
    p: &[f32],
    n: usize,
    (y, dy): (&[f32], &[f32]),
    (at, c, hd): (usize, usize, usize),
) {
    for (i, (dp, p)) in dp.chunks_mut(n).zip(p.chunks(n)).enumerate() {
        let at = at + i * c;
        let dot: f32 = y[at..at + hd]
            .iter()
            .zip(&dy[at..at + hd])
            .map(|(a, b)| a * b)
            .sum();
        for (g, &w) in dp.iter_mut().zip(p) {
            *g = w * (*g - dot);
        }
    }
}

/// `qkv [b, t, 3c]` to `y [b, t, c]`, the weights dropped by `drop`.
pub(super) fn forward(
    qkv: &[f32],
    b: usize,
    d: Dims,
    keys: Keys,
    drop: Option<Dropped>,
) -> Vec<f32> {
    let (t, c) = (d.t, d.c());
    let mut y = vec![0f32; b * t * c];
    let out = Out(y.as_mut_ptr());
    (0..b * d.heads).into_par_iter().for_each(|task| {
        let (src, dst) = d.offsets(task / d.heads, task % d.heads);
        let mut p = vec![0f32; BLOCK.min(t) * t];
        let causal = matches!(keys, Keys::Causal);
        for r0 in (0..t).step_by(BLOCK) {
            let m = BLOCK.min(t - r0);
            let n = keys.of(task / d.heads, r0, m);
            let p = &mut p[..m * n];
            // SAFETY: src and dst address this task's head inside
            // buffers of the layout's size; rows and keys stay below t.
            unsafe {
                let q = qkv.as_ptr().add(src);
                weights(d, q, q.add(c), (r0, m, n), causal, p);
                if let Some(drop) = drop {
                    drop.apply((task / d.heads, task % d.heads, r0), p, n);
                }
                mm(
                    (m, d.hd, n),
                    out.at(dst + r0 * c),
                    c,
                    false,
                    (p.as_ptr(), n, 1),
                    (q.add(2 * c), 3 * c, 1),
                    1.0,
                );
            }
        }
    });
    y
}

/// `(qkv, y, dy)` to `dqkv`, recomputing each block's weights `P`:
/// `dV += P^T dY`, `dP = dY V^T`, `dS = P (dP - rowsum(dY y))`,
/// `dQ = scale dS K`, `dK += scale dS^T Q`. With dropout (mask `M`,
/// scaled) `dV += (P M)^T dY` and `dP = (dY V^T) M`; the row sums are
/// still `dY y`, as `y = (P M) V`.
pub(super) fn backward(
    (qkv, y, dy): (&[f32], &[f32], &[f32]),
    b: usize,
    d: Dims,
    keys: Keys,
    drop: Option<Dropped>,
) -> Result<Vec<f32>> {
    let (t, c) = (d.t, d.c());
    if y.len() != b * t * c || dy.len() != y.len() {
        bail!("attention backward: output or gradient is not [{b}, {t}, {c}]")
    }
    let mut dqkv = vec![0f32; qkv.len()];
    let out = Out(dqkv.as_mut_ptr());
    (0..b * d.heads).into_par_iter().for_each(|task| {
        let (src, col) = d.offsets(task / d.heads, task % d.heads);
        let rows = BLOCK.min(t);
        let (mut p, mut dp) = (vec![0f32; rows * t], vec![0f32; rows * t]);
        // The dropped weights, with dropout.
        let mut pd = vec![0f32; if drop.is_some() { rows * t } else { 0 }];
        let causal = matches!(keys, Keys::Causal);
        for r0 in (0..t).step_by(BLOCK) {
            let m = BLOCK.min(t - r0);
            let n = keys.of(task / d.heads, r0, m);
            let (p, dp) = (&mut p[..m * n], &mut dp[..m * n]);
            // SAFETY: as in the forward; dq, dk and dv of this head are
            // written by this task only.
            unsafe {
                let q = qkv.as_ptr().add(src);
                let (k, v) = (q.add(c), q.add(2 * c));
                let g = dy.as_ptr().add(col + r0 * c);
                let dq = out.at(src);
                let (dk, dv) = (dq.add(c), dq.add(2 * c));
                weights(d, q, k, (r0, m, n), causal, p);
                let at = (task / d.heads, task % d.heads, r0);
                let pv = match drop {
                    Some(drop) => {
                        let pd = &mut pd[..m * n];
                        pd.copy_from_slice(p);
                        drop.apply(at, pd, n);
                        pd.as_ptr()
                    }
                    None => p.as_ptr(),
                };
                mm((n, d.hd, m), dv, 3 * c, true, (pv, 1, n), (g, c, 1), 1.0);
                mm(
                    (m, n, d.hd),
                    dp.as_mut_ptr(),
                    n,
                    false,
                    (g, c, 1),
                    (v, 1, 3 * c),
                    1.0,
                );
                if let Some(drop) = drop {
                    drop.apply(at, dp, n);
                }
                softmax_grad_rows(dp, p, n, (y, dy), (col + r0 * c, c, d.hd));
                let ds = (dp.as_ptr(), n, 1);
                mm(
                    (m, d.hd, n),
                    dq.add(r0 * 3 * c),
                    3 * c,
                    false,
                    ds,
                    (k, 3 * c, 1),
                    d.scale(),
                );
                let dst = (dp.as_ptr(), 1, n);
                mm(
                    (n, d.hd, m),
                    dk,
                    3 * c,
                    true,
                    dst,
                    (q.add(r0 * 3 * c), 3 * c, 1),
                    d.scale(),
                );
            }
        }
    });
    Ok(dqkv)
}

/// The backward ops' CPU side: `(qkv, y, dy)` as candle hands them to a
/// `CustomOp3`, to `dqkv` in `qkv`'s shape.
pub(super) fn backward_storage(
    (s1, l1): (&CpuStorage, &Layout),
    (s2, l2): (&CpuStorage, &Layout),
    (s3, l3): (&CpuStorage, &Layout),
    heads: usize,
    (keys, drop): (Keys, Option<Dropped>),
) -> Result<(CpuStorage, Shape)> {
    let qkv = super::f32_slice(s1, l1, "attention backward")?;
    let y = super::f32_slice(s2, l2, "attention backward output")?;
    let dy = super::f32_slice(s3, l3, "attention backward gradient")?;
    let (b, d) = Dims::of(l1, heads)?;
    let dqkv = backward((qkv, y, dy), b, d, keys, drop)?;
    Ok((CpuStorage::F32(dqkv), l1.shape().clone()))
}
