//! The launches of the cuBLAS causal attention (`attention_cuda.rs`) as
//! data: which batched products and row kernels run, on which buffers, at
//! which offsets. Plain data, so the CPU can check a plan's geometry
//! (`tests` below runs plans against candle's CPU attention).
//!
//! The (batch element, head) pairs go to the products in groups that
//! cuBLAS takes as one strided batch: either every head of one element
//! (heads `hd` apart in `qkv`), or one head of several elements (`t x 3c`
//! apart). Of the two, the one with fewer launches: a small model with a
//! large batch (the Shakespeare GPT: batch 32, 4 heads) issues its products
//! once per head rather than once per element, 8 times fewer. Scores of a
//! group, `[count, t, t]`, go to a scratch buffer that the next group
//! reuses; it holds at most `max(heads, SCRATCH / (t x t))` squares.

use super::attention::Dims;
use super::mat::Mat;

/// Scratch values a group of elements may use beyond one element's heads.
const SCRATCH: usize = 1 << 22;

/// The buffers a plan names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Buf {
    /// The input, `[b, t, 3c]`.
    Qkv,
    /// The output's gradient, `[b, t, c]` (backward).
    Dy,
    /// The output: `y [b, t, c]` forward, `dqkv [b, t, 3c]` backward.
    Out,
    /// Scratch: the weights `P` of one group.
    P,
    /// Scratch: their gradient (backward).
    Dp,
}

/// One launch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Step {
    /// Row-major `c = alpha a b` (`a` m x k, `b` k x n) for `batch`
    /// matrices, as `blas::product` computes it.
    Product {
        batch: usize,
        mnk: (usize, usize, usize),
        alpha: f64,
        a: (Buf, Mat),
        b: (Buf, Mat),
        c: (Buf, Mat),
    },
    /// `causal_softmax` over `rows` rows of `P` (`kernels/attention.cu`).
    Softmax { rows: usize },
    /// `causal_softmax_grad`: `Dp = P (Dp - rowsum(Dp P))` over `rows` rows.
    SoftmaxGrad { rows: usize },
}

#[derive(Debug)]
pub(super) struct Plan {
    /// Values in each scratch buffer.
    pub(super) scratch: usize,
    pub(super) steps: Vec<Step>,
}

/// Pairs that one strided batch covers.
#[derive(Clone, Copy, Debug)]
struct Group {
    count: usize,
    /// The first pair's q in `qkv` (k and v are `c` and `2c` further),
    /// and from one pair's to the next.
    qkv: usize,
    qkv_stride: usize,
    /// The first pair's columns in `[b, t, c]`, and from one to the next.
    y: usize,
    y_stride: usize,
}

impl Group {
    fn q(&self, d: Dims, part: usize) -> Mat {
        Mat::new(self.qkv + part * d.c(), 3 * d.c(), self.qkv_stride)
    }
    fn y(&self, d: Dims) -> Mat {
        Mat::new(self.y, d.c(), self.y_stride)
    }
}

fn groups(b: usize, d: Dims) -> Vec<Group> {
    let (t, c, hd) = (d.t, d.c(), d.hd);
    let square = (t * t).max(1);
    let per = (SCRATCH.max(d.heads * square) / square).clamp(1, b.max(1));
    if d.heads * b.div_ceil(per) < b {
        let mut out = Vec::new();
        for h in 0..d.heads {
            for e in (0..b).step_by(per) {
                out.push(Group {
                    count: per.min(b - e),
                    qkv: e * t * 3 * c + h * hd,
                    qkv_stride: t * 3 * c,
                    y: e * t * c + h * hd,
                    y_stride: t * c,
                });
            }
        }
        out
    } else {
        (0..b)
            .map(|e| Group {
                count: d.heads,
                qkv: e * t * 3 * c,
                qkv_stride: hd,
                y: e * t * c,
                y_stride: hd,
            })
            .collect()
    }
}

fn scratch(groups: &[Group], t: usize) -> usize {
    groups.iter().map(|g| g.count).max().unwrap_or(0) * t * t
}

/// The group's scores `scale Q K^T` into `P`, then their causal softmax.
fn weights(steps: &mut Vec<Step>, d: Dims, g: &Group) {
    let t = d.t;
    steps.push(Step::Product {
        batch: g.count,
        mnk: (t, t, d.hd),
        alpha: f64::from(d.scale()),
        a: (Buf::Qkv, g.q(d, 0)),
        b: (Buf::Qkv, g.q(d, 1).t()),
        c: (Buf::P, Mat::new(0, t, t * t)),
    });
    steps.push(Step::Softmax { rows: g.count * t });
}

/// `qkv [b, t, 3c]` to `y [b, t, c]`: `Y = P V`.
pub(super) fn forward(b: usize, d: Dims) -> Plan {
    let groups = groups(b, d);
    let mut steps = Vec::new();
    let square = Mat::new(0, d.t, d.t * d.t);
    for g in &groups {
        weights(&mut steps, d, g);
        steps.push(Step::Product {
            batch: g.count,
            mnk: (d.t, d.hd, d.t),
            alpha: 1.0,
            a: (Buf::P, square),
            b: (Buf::Qkv, g.q(d, 2)),
            c: (Buf::Out, g.y(d)),
        });
    }
    Plan {
        scratch: scratch(&groups, d.t),
        steps,
    }
}

/// `(qkv, dy)` to `dqkv`: `dV = P^T dY`, `dP = dY V^T`, `dS = P (dP -
/// rowsum(dP P))` in place, `dQ = scale dS K`, `dK = scale dS^T Q`.
pub(super) fn backward(b: usize, d: Dims) -> Plan {
    let groups = groups(b, d);
    let mut steps = Vec::new();
    let (t, hd) = (d.t, d.hd);
    let square = Mat::new(0, t, t * t);
    let scale = f64::from(d.scale());
    for g in &groups {
        weights(&mut steps, d, g);
        let (q, k, v, dy) = (g.q(d, 0), g.q(d, 1), g.q(d, 2), g.y(d));
        let product = |mnk, alpha, a, b, c| Step::Product {
            batch: g.count,
            mnk,
            alpha,
            a,
            b,
            c,
        };
        steps.extend([
            product(
                (t, hd, t),
                1.0,
                (Buf::P, square.t()),
                (Buf::Dy, dy),
                (Buf::Out, v),
            ),
            product(
                (t, t, hd),
                1.0,
                (Buf::Dy, dy),
                (Buf::Qkv, v.t()),
                (Buf::Dp, square),
            ),
            Step::SoftmaxGrad { rows: g.count * t },
            product(
                (t, hd, t),
                scale,
                (Buf::Dp, square),
                (Buf::Qkv, k),
                (Buf::Out, q),
            ),
            product(
                (t, hd, t),
                scale,
                (Buf::Dp, square.t()),
                (Buf::Qkv, q),
                (Buf::Out, k),
            ),
        ]);
    }
    Plan {
        scratch: scratch(&groups, t),
        steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Result, Tensor, Var};

    /// The buffers of a plan run on the CPU in f64.
    struct Bufs {
        qkv: Vec<f64>,
        dy: Vec<f64>,
        out: Vec<f64>,
        p: Vec<f64>,
        dp: Vec<f64>,
    }

    impl Bufs {
        fn get(&self, b: Buf) -> &[f64] {
            match b {
                Buf::Qkv => &self.qkv,
                Buf::Dy => &self.dy,
                Buf::Out => &self.out,
                Buf::P => &self.p,
                Buf::Dp => &self.dp,
            }
        }
        fn get_mut(&mut self, b: Buf) -> &mut Vec<f64> {
            match b {
                Buf::Qkv => &mut self.qkv,
                Buf::Dy => &mut self.dy,
                Buf::Out => &mut self.out,
                Buf::P => &mut self.p,
                Buf::Dp => &mut self.dp,
            }
        }
    }

    /// What the launches compute: `blas::product`'s contract and the row
    /// kernels of `kernels/attention.cu`, in f64.
    fn run(plan: &Plan, t: usize, bufs: &mut Bufs) {
        for step in &plan.steps {
            match *step {
                Step::Product {
                    batch,
                    mnk: (m, n, k),
                    alpha,
                    a: (ab, am),
                    b: (bb, bm),
                    c: (cb, cm),
                } => {
                    assert!(cb != ab && cb != bb, "{step:?} writes what it reads");
                    let mut c = std::mem::take(bufs.get_mut(cb));
                    let (a, b) = (bufs.get(ab), bufs.get(bb));
                    for z in 0..batch {
                        for i in 0..m {
                            for j in 0..n {
                                let s: f64 =
                                    (0..k).map(|l| a[am.at(z, i, l)] * b[bm.at(z, l, j)]).sum();
                                c[cm.at(z, i, j)] = alpha * s;
                            }
                        }
                    }
                    *bufs.get_mut(cb) = c;
                }
                Step::Softmax { rows } => {
                    for r in 0..rows {
                        let row = &mut bufs.p[r * t..(r + 1) * t];
                        let live = r % t + 1;
                        let m = row[..live]
                            .iter()
                            .cloned()
                            .fold(f64::NEG_INFINITY, f64::max);
                        let sum: f64 = row[..live].iter().map(|x| (x - m).exp()).sum();
                        for (i, x) in row.iter_mut().enumerate() {
                            *x = if i < live { (*x - m).exp() / sum } else { 0.0 };
                        }
                    }
                }
                Step::SoftmaxGrad { rows } => {
                    for r in 0..rows {
                        let (p, g) = (
                            &bufs.p[r * t..(r + 1) * t],
                            &mut bufs.dp[r * t..(r + 1) * t],
                        );
                        let dot: f64 = p.iter().zip(g.iter()).map(|(p, g)| p * g).sum();
                        for (x, p) in g.iter_mut().zip(p) {
                            *x = p * (*x - dot);
                        }
                    }
                }
            }
        }
    }

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i + seed) * 7919 % 2003) as f32 / 2003.0 - 0.5) * 2.0)
            .collect()
    }

    /// Both plans, run in f64, against candle's CPU attention and its
    /// backward (f32): every value of `y` and `dqkv` is written (the
    /// outputs start as NaN) and matches. The shapes take both groupings
    /// (per element; per head, whole and in chunks of elements).
    #[test]
    fn plans_match_the_cpu_attention() -> Result<()> {
        // (b, t, heads, hd): per element, per head (batch 32, 4 heads, as
        // the Shakespeare GPT), per head in chunks of elements, per element
        // because heads outnumber elements.
        for (b, t, heads, hd) in [(2, 5, 3, 4), (32, 6, 4, 2), (5, 1024, 2, 2), (3, 7, 12, 2)] {
            let d = Dims { t, heads, hd };
            let c = heads * hd;
            let (fwd, bwd) = (forward(b, d), backward(b, d));
            let launches = |p: &Plan| p.steps.len();
            let groups = groups(b, d);
            assert_eq!(launches(&fwd), 3 * groups.len());
            assert_eq!(launches(&bwd), 7 * groups.len());
            assert!(groups.len() <= b, "{b} {heads}: {} groups", groups.len());
            if (b, heads) == (32, 4) {
                assert_eq!(groups.len(), 4, "one group per head");
            }
            if t == 1024 {
                assert_eq!(groups.len(), 2 * b.div_ceil(4), "chunks of 4 elements");
            }

            let qkv32 = values(b * t * 3 * c, 1);
            let dy32 = values(b * t * c, 2);
            let qkv = Var::from_vec(qkv32.clone(), (b, t, 3 * c), &Device::Cpu)?;
            let dy = Tensor::from_vec(dy32.clone(), (b, t, c), &Device::Cpu)?;
            let y = crate::kernels::causal_attention(qkv.as_tensor(), heads)?;
            let grads = (&y * &dy)?.sum_all()?.backward()?;
            let want_y: Vec<f32> = y.flatten_all()?.to_vec1()?;
            let want_dqkv: Vec<f32> = grads.get(&qkv).unwrap().flatten_all()?.to_vec1()?;

            let f64s = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
            for (plan, out_len, want) in
                [(&fwd, b * t * c, want_y), (&bwd, b * t * 3 * c, want_dqkv)]
            {
                let mut bufs = Bufs {
                    qkv: f64s(&qkv32),
                    dy: f64s(&dy32),
                    out: vec![f64::NAN; out_len],
                    p: vec![f64::NAN; plan.scratch],
                    dp: vec![f64::NAN; plan.scratch],
                };
                run(plan, t, &mut bufs);
                for (i, (&got, &want)) in bufs.out.iter().zip(&want).enumerate() {
                    assert!(
                        (got - f64::from(want)).abs() <= 1e-4 * (1.0 + f64::from(want).abs()),
                        "{b}x{t}, {heads} heads of {hd}, value {i} of {out_len}: {got} vs {want}"
                    );
                }
            }
        }
        Ok(())
    }
}
