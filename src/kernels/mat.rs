//! Where a matrix operand of a batched product lies in its buffer: the
//! form in which taper's CUDA ops hand operands to cuBLAS (`blas.rs`), and
//! in which the attention's plans (`attention_plan.rs`) describe them.

/// A matrix operand: row-major at `off` with row stride `ld` or, with `t`,
/// the transpose of such a matrix; the next matrix of a batch is `stride`
/// further on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Mat {
    pub(super) off: usize,
    pub(super) ld: usize,
    pub(super) t: bool,
    pub(super) stride: usize,
}

impl Mat {
    pub(super) fn new(off: usize, ld: usize, stride: usize) -> Self {
        Mat {
            off,
            ld,
            t: false,
            stride,
        }
    }

    pub(super) fn t(self) -> Self {
        Mat { t: true, ..self }
    }

    /// The buffer index of element `(i, j)` of the `z`-th matrix.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) fn at(&self, z: usize, i: usize, j: usize) -> usize {
        let (r, c) = if self.t { (j, i) } else { (i, j) };
        self.off + z * self.stride + r * self.ld + c
    }
}
