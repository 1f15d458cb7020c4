//! The CPU side of the convolution (`conv.rs`): each sample unfolded
//! (im2col) into a per-thread scratch buffer, folded back (col2im, its
//! adjoint); the products between them are `kernels::mm`, one thread each.

use std::ops::Range;

thread_local! {
    /// Each thread's im2col buffer, kept between calls: every element is
    /// written before it is read, so it is never zeroed again.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's scratch buffer of at least `n` floats.
pub(super) fn with_scratch<T>(n: usize, f: impl FnOnce(&mut [f32]) -> T) -> T {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < n {
            s.resize(n, 0.0);
        }
        f(&mut s[..n])
    })
}

/// A convolution's geometry: a `k x k` kernel, `p` zeros on every side,
/// stride 1, over `[C, H, W]` planes; the output planes are `ho x wo`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Geometry {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub p: usize,
}

impl Geometry {
    /// Output height and width: `h + 2p - k + 1` (0 when the kernel is
    /// larger than the padded plane).
    pub fn out(&self) -> (usize, usize) {
        let o = |n: usize| (n + 2 * self.p + 1).saturating_sub(self.k);
        (o(self.h), o(self.w))
    }

    /// Rows of the unfolded sample: one per input channel and kernel tap.
    pub fn taps(&self) -> usize {
        self.c * self.k * self.k
    }

    /// For kernel offset `kx` (or `ky`) along an axis of `n` inputs and
    /// `no` outputs: the outputs that read an input, and those inputs
    /// (output `i` reads input `i + kx - p`).
    fn span(&self, kx: usize, n: usize, no: usize) -> (Range<usize>, Range<usize>) {
        let lo = self.p.saturating_sub(kx).min(no);
        let hi = (n + self.p).saturating_sub(kx).min(no);
        if hi <= lo {
            return (lo..lo, 0..0);
        }
        // lo >= p - kx here, so lo + kx - p does not underflow.
        (lo..hi, lo + kx - self.p..hi + kx - self.p)
    }
}

/// `x [C, H, W]` unfolded into `col [C*k*k, Ho*Wo]`, zeros outside the
/// image.
pub(super) fn im2col(x: &[f32], g: Geometry, col: &mut [f32]) {
    let (hw, (ho, wo)) = (g.h * g.w, g.out());
    if wo == 0 {
        return;
    }
    for ci in 0..g.c {
        let img = &x[ci * hw..(ci + 1) * hw];
        for ky in 0..g.k {
            let (rows, _) = g.span(ky, g.h, ho);
            for kx in 0..g.k {
                let row = &mut col[((ci * g.k + ky) * g.k + kx) * ho * wo..][..ho * wo];
                let (to, from) = g.span(kx, g.w, wo);
                for y in 0..ho {
                    let out = &mut row[y * wo..(y + 1) * wo];
                    if !rows.contains(&y) {
                        out.fill(0.0);
                        continue;
                    }
                    let sy = y + ky - g.p;
                    out[..to.start].fill(0.0);
                    out[to.clone()].copy_from_slice(&img[sy * g.w..][from.clone()]);
                    out[to.end..].fill(0.0);
                }
            }
        }
    }
}

/// Adds `col [C*k*k, Ho*Wo]` back onto `x [C, H, W]` (im2col's adjoint).
pub(super) fn col2im(col: &[f32], g: Geometry, x: &mut [f32]) {
    let (hw, (ho, wo)) = (g.h * g.w, g.out());
    if wo == 0 {
        return;
    }
    for ci in 0..g.c {
        let img = &mut x[ci * hw..(ci + 1) * hw];
        for ky in 0..g.k {
            let (rows, _) = g.span(ky, g.h, ho);
            for kx in 0..g.k {
                let row = &col[((ci * g.k + ky) * g.k + kx) * ho * wo..][..ho * wo];
                let (from, to) = g.span(kx, g.w, wo);
                for y in rows.clone() {
                    let sy = y + ky - g.p;
                    let dst = &mut img[sy * g.w..][to.clone()];
                    for (d, v) in dst.iter_mut().zip(&row[y * wo..][from.clone()]) {
                        *d += v;
                    }
                }
            }
        }
    }
}
