//! Sums across CPU threads that repeat bit for bit. rayon's `reduce` and
//! `fold` group the partial sums as the work happened to be split and
//! stolen, so float rounding varied from run to run once the command ran
//! on a pool worker (`engine::run_on_workers`): the Shakespeare recipe's
//! validation loss differed in its seventh digit between two runs. Here
//! the partials are computed in parallel and added in their order.

use rayon::prelude::*;

/// The sum of `parts` vectors of `len` floats, `part(i)` computed in
/// parallel and added in the order of `i`: the same bits whatever the
/// timing or the number of threads.
pub(super) fn sum_in_order(
    parts: usize,
    len: usize,
    part: impl Fn(usize) -> Vec<f32> + Sync,
) -> Vec<f32> {
    let partials: Vec<Vec<f32>> = (0..parts).into_par_iter().map(&part).collect();
    let mut partials = partials.into_iter();
    let mut sum = partials.next().unwrap_or_else(|| vec![0f32; len]);
    for p in partials {
        sum.iter_mut().zip(&p).for_each(|(a, b)| *a += b);
    }
    sum
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Result, Tensor, Var};

    /// Every CPU gradient summed over rows or samples: the bias gradient,
    /// the layer norm's weight and bias gradients and the 3x3 convolution's
    /// weight gradient, in pools of 1 to 4 threads with the caller on a
    /// worker (as the binary runs), repeated: all the same bits.
    #[test]
    fn row_sums_repeat_bit_for_bit_whatever_the_pool() -> Result<()> {
        let dev = Device::Cpu;
        let vals = |n: usize, m: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * m) % 10007) as f32 / 3001.7 - 1.6)
                .collect()
        };
        let (rows, n) = (64 * 37 + 5, 96);
        let g = Tensor::from_vec(vals(rows * n, 7919), (rows, n), &dev)?;
        let x = Tensor::from_vec(vals(rows * n, 104_729), (rows, n), &dev)?;
        let w = Tensor::from_vec(vals(n, 31), n, &dev)?;
        let (b, c, o, h) = (29, 3, 5, 6);
        let img = Tensor::from_vec(vals(b * c * h * h, 613), (b, c, h, h), &dev)?;
        let probe = Tensor::from_vec(vals(b * o * h * h, 211), (b, o, h, h), &dev)?;
        let kw = Var::from_tensor(&Tensor::from_vec(vals(o * c * 9, 17), (o, c, 3, 3), &dev)?)?;
        let kb = Tensor::from_vec(vals(o, 5), o, &dev)?;
        let bits = |t: &Tensor| -> Result<Vec<u32>> {
            Ok(t.flatten_all()?
                .to_vec1::<f32>()?
                .iter()
                .map(|v| v.to_bits())
                .collect())
        };
        let sums = || -> Result<Vec<Vec<u32>>> {
            let (_, dw, db) = super::super::layer_norm_grad(&x, &w, &g, 1e-5)?;
            let y = super::super::conv3x3(&img, kw.as_tensor(), &kb)?;
            let grads = (y * &probe)?.sum_all()?.backward()?;
            let dk = grads.get(kw.as_tensor()).expect("kernel gradient");
            [super::super::bias_grad(&g)?, dw, db, dk.clone()]
                .iter()
                .map(bits)
                .collect()
        };
        let pool = |t: usize| rayon::ThreadPoolBuilder::new().num_threads(t).build();
        let want = pool(1).expect("a pool").install(sums)?;
        for t in [2, 3, 4] {
            let pool = pool(t).expect("a pool");
            for _ in 0..4 {
                assert!(pool.install(sums)? == want, "{t} threads");
            }
        }
        Ok(())
    }
}
