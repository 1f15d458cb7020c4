//! The CPU side of the 3x3 convolution (`conv.rs`): each sample unfolded
//! (im2col) into a per-thread scratch buffer, folded back (col2im, its
//! adjoint); the products between them are `kernels::mm`, one thread each.

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

/// The column range `(dst, src)` of kernel column `kx` in a row of width
/// `w`: output column `xo` reads input column `xo + kx - 1`.
pub(super) fn shifted(kx: usize, w: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    match kx {
        0 => (1..w, 0..w - 1),
        1 => (0..w, 0..w),
        _ => (0..w - 1, 1..w),
    }
}

/// `x [C, H, W]` unfolded into `col [C*9, H*W]`, zeros outside the image.
pub(super) fn im2col(x: &[f32], c: usize, h: usize, w: usize, col: &mut [f32]) {
    let hw = h * w;
    if w == 0 {
        return;
    }
    for ci in 0..c {
        let img = &x[ci * hw..(ci + 1) * hw];
        for ky in 0..3 {
            for kx in 0..3 {
                let row = &mut col[(ci * 9 + ky * 3 + kx) * hw..][..hw];
                let (to, from) = shifted(kx, w);
                for y in 0..h {
                    let out = &mut row[y * w..(y + 1) * w];
                    let sy = y + ky;
                    if sy == 0 || sy > h {
                        out.fill(0.0);
                        continue;
                    }
                    let src = &img[(sy - 1) * w..sy * w];
                    out[to.clone()].copy_from_slice(&src[from.clone()]);
                    match kx {
                        0 => out[0] = 0.0,
                        2 => out[w - 1] = 0.0,
                        _ => {}
                    }
                }
            }
        }
    }
}

/// Adds `col [C*9, H*W]` back onto `x [C, H, W]` (im2col's adjoint).
pub(super) fn col2im(col: &[f32], c: usize, h: usize, w: usize, x: &mut [f32]) {
    let hw = h * w;
    if w == 0 {
        return;
    }
    for ci in 0..c {
        let img = &mut x[ci * hw..(ci + 1) * hw];
        for ky in 0..3 {
            for kx in 0..3 {
                let row = &col[(ci * 9 + ky * 3 + kx) * hw..][..hw];
                let (from, to) = shifted(kx, w);
                for y in 0..h {
                    let sy = y + ky;
                    if sy == 0 || sy > h {
                        continue;
                    }
                    let dst = &mut img[(sy - 1) * w..sy * w];
                    let src = &row[y * w..(y + 1) * w];
                    for (d, v) in dst[to.clone()].iter_mut().zip(&src[from.clone()]) {
                        *d += v;
                    }
                }
            }
        }
    }
}
