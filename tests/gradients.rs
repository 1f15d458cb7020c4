//! Gradient checks for every built-in model: after one backward pass every
//! trainable variable has a finite, non-zero gradient, and the gradient agrees
//! with central finite differences (float64, tiny instances). This is what
//! catches candle ops that record no backward (candle #2168).

use anyhow::{anyhow, Result};
use candle_core::{DType, Device, Tensor};
use taper::engine::loss::CrossEntropy;
use taper::engine::{Activation, Bert, Cnn, Draw, Gpt, Mlp, ModelSpec, ParamStore, TrainModule};

/// The model's forward pass: training's with dropout drawn from `draw`,
/// else evaluation's.
fn forward(model: &dyn TrainModule, x: &Tensor, draw: Option<Draw>) -> Result<Tensor> {
    Ok(match draw {
        Some(d) => model.forward_train(x, d)?,
        None => model.forward(x)?,
    })
}

fn loss_value(model: &dyn TrainModule, x: &Tensor, y: &Tensor, draw: Option<Draw>) -> Result<f64> {
    let l = CrossEntropy::default().loss(&forward(model, x, draw)?, y)?;
    Ok(l.to_scalar::<f64>()?)
}

/// Dropout's draw for step `step` of seed `seed`, the piece's first sample
/// at the batch's place `first`.
fn draw(seed: u64, step: u64, first: usize) -> Draw {
    Draw { seed, step, first }
}

fn grad_check(spec: &dyn ModelSpec, x: &Tensor, y: &Tensor) -> Result<()> {
    grad_check_drawn(spec, x, y, None)
}

/// [`grad_check`] of the training forward with dropout drawn from `draw`:
/// its masks are a function of the draw, so finite differences see the
/// same ones.
fn grad_check_drawn(
    spec: &dyn ModelSpec,
    x: &Tensor,
    y: &Tensor,
    draw: Option<Draw>,
) -> Result<()> {
    let store = ParamStore::new(11);
    let model = spec.build_train(store.var_builder(DType::F64, &Device::Cpu))?;
    let loss = CrossEntropy::default().loss(&forward(model.as_ref(), x, draw)?, y)?;
    let grads = loss.backward()?;
    let vars = store.vars();
    assert!(!vars.is_empty());
    for (name, var) in &vars {
        let g = grads
            .get(var)
            .ok_or_else(|| anyhow!("{}: {name} got no gradient", spec.describe()))?;
        let g: Vec<f64> = g.flatten_all()?.to_vec1()?;
        assert!(
            g.iter().all(|v| v.is_finite()),
            "{name}: non-finite gradient"
        );
        assert!(g.iter().any(|v| *v != 0.0), "{name}: gradient is all zero");
        // Finite differences on the largest-gradient element and two others.
        let orig: Vec<f64> = var.flatten_all()?.to_vec1()?;
        let imax = (0..g.len())
            .max_by(|&a, &b| g[a].abs().total_cmp(&g[b].abs()))
            .unwrap_or(0);
        for i in [imax, 0, g.len() / 2] {
            let eps = 1e-6;
            let probe = |delta: f64| -> Result<f64> {
                let mut v = orig.clone();
                v[i] += delta;
                var.set(&Tensor::from_vec(v, var.shape(), &Device::Cpu)?)?;
                loss_value(model.as_ref(), x, y, draw)
            };
            let numeric = (probe(eps)? - probe(-eps)?) / (2.0 * eps);
            var.set(&Tensor::from_vec(orig.clone(), var.shape(), &Device::Cpu)?)?;
            let tol = 1e-6 + 1e-4 * g[i].abs().max(numeric.abs());
            assert!(
                (numeric - g[i]).abs() <= tol,
                "{}: {name}[{i}]: analytic {} vs numeric {numeric}",
                spec.describe(),
                g[i]
            );
        }
    }
    Ok(())
}

fn features(b: usize, n: usize, seed: u64) -> Result<Tensor> {
    let mut r = taper::engine::rng::Rng::new(seed);
    let v: Vec<f64> = (0..b * n).map(|_| r.normal()).collect();
    Ok(Tensor::from_vec(v, (b, n), &Device::Cpu)?)
}

#[test]
fn mlp_gradients_match_finite_differences() -> Result<()> {
    let y = Tensor::new(&[0u32, 2, 1, 2], &Device::Cpu)?;
    for act in [
        Activation::Relu,
        Activation::Gelu,
        Activation::Tanh,
        Activation::Silu,
    ] {
        let mut spec = Mlp {
            inputs: 5,
            hidden: vec![4, 3],
            outputs: 3,
            activation: act,
            dropout: 0.0,
        };
        grad_check(&spec, &features(4, 5, 1)?, &y)?;
        // In training, with dropout after each hidden layer.
        spec.dropout = 0.3;
        let draw = draw(1, 3, 2);
        grad_check_drawn(&spec, &features(4, 5, 1)?, &y, Some(draw))?;
    }
    Ok(())
}

#[test]
fn cnn_gradients_match_finite_differences() -> Result<()> {
    let mut spec = Cnn {
        input: [1, 6, 6],
        channels: vec![2, 3],
        hidden: vec![4],
        outputs: 3,
        activation: Activation::Tanh,
        dropout: 0.0.into(),
        kernel: 3,
        padding: None,
        pool: None,
    };
    let y = Tensor::new(&[0u32, 2, 1], &Device::Cpu)?;
    grad_check(&spec, &features(3, 36, 2)?, &y)?;
    // Other kernels: 5x5 without padding (PyTorch's Conv2d(c, o, 5)) on
    // 16x16 (16, 12, 6, 2, 1), an even 4x4 with padding 1 on 9x7, and
    // PyTorch's MNIST example's stages on 8x8: two 3x3 without padding, the
    // pool after the second only (8, 6, 4, 2).
    for (input, kernel, padding, pool) in [
        ([1, 16, 16], 5, 0, None),
        ([2, 9, 7], 4, 1, None),
        ([1, 8, 8], 3, 0, Some(vec![false, true])),
    ] {
        let other = Cnn {
            input,
            kernel,
            padding: Some(padding),
            pool,
            ..spec.clone()
        };
        let n = input.iter().product();
        grad_check(&other, &features(3, n, 2)?, &y)?;
    }
    spec.dropout = 0.3.into();
    let draw = draw(1, 4, 0);
    grad_check_drawn(&spec, &features(3, 36, 2)?, &y, Some(draw))?;
    // A rate a place: the flattened features' and the hidden activation's.
    spec.dropout = taper::engine::dropout::Rates::Each(vec![0.25, 0.5]);
    grad_check_drawn(&spec, &features(3, 36, 2)?, &y, Some(draw))
}

/// In evaluation, and in training with dropout.
#[test]
fn gpt_gradients_match_finite_differences() -> Result<()> {
    let mut spec = Gpt {
        vocab: 7,
        context: 5,
        width: 8,
        layers: 2,
        heads: 2,
        mlp: 2,
        dropout: 0.0,
        from: None,
        initial: None,
    };
    let x = Tensor::new(&[[1u32, 4, 2, 6, 0], [3, 3, 5, 1, 2]], &Device::Cpu)?;
    let y = Tensor::new(&[[4u32, 2, 6, 0, 5], [3, 5, 1, 2, 2]], &Device::Cpu)?;
    grad_check(&spec, &x, &y)?;
    spec.dropout = 0.3;
    let draw = draw(4, 2, 0);
    grad_check_drawn(&spec, &x, &y, Some(draw))
}

/// Texts of three lengths, padded with id 0, one a pair: the padding is
/// masked, and the batch is computed as wide as its longest text; in evaluation, and in
/// training with dropout at every site (rates high enough that each mask
/// drops some of these few values).
#[test]
fn bert_gradients_match_finite_differences() -> Result<()> {
    let mut spec = Bert {
        family: Default::default(),
        vocab: 11,
        context: 7,
        width: 8,
        layers: 2,
        heads: 2,
        intermediate: 12,
        type_vocab: 2,
        eps: 1e-12,
        pad: 0,
        outputs: 3,
        dropout: 0.0,
        attention_dropout: 0.0,
        classifier_dropout: 0.0,
        sep: Some(3),
        from: None,
        initial: None,
    };
    // The last is a pair (`[CLS] a [SEP] b [SEP]`): its second text's ids
    // are type 1.
    let x = Tensor::new(
        &[
            [2u32, 5, 9, 3, 0, 0, 0],
            [2, 7, 3, 0, 0, 0, 0],
            [2, 4, 3, 8, 10, 3, 0],
        ],
        &Device::Cpu,
    )?;
    let y = Tensor::new(&[0u32, 2, 1], &Device::Cpu)?;
    grad_check(&spec, &x, &y)?;
    (
        spec.dropout,
        spec.attention_dropout,
        spec.classifier_dropout,
    ) = (0.3, 0.3, 0.3);
    let draw = draw(3, 5, 2);
    grad_check_drawn(&spec, &x, &y, Some(draw))
}

#[test]
fn gpt_is_causal() -> Result<()> {
    // Changing a later token must not change the logits at earlier positions.
    let spec = Gpt {
        vocab: 7,
        context: 6,
        width: 8,
        layers: 2,
        heads: 2,
        mlp: 2,
        dropout: 0.0,
        from: None,
        initial: None,
    };
    let store = ParamStore::new(5);
    let model = spec.build(store.var_builder(DType::F64, &Device::Cpu))?;
    let a = model.forward(&Tensor::new(&[[1u32, 2, 3, 4, 5, 6]], &Device::Cpu)?)?;
    let b = model.forward(&Tensor::new(&[[1u32, 2, 3, 0, 0, 0]], &Device::Cpu)?)?;
    let diff = (a.narrow(1, 0, 3)? - b.narrow(1, 0, 3)?)?
        .abs()?
        .max_all()?;
    assert_eq!(diff.to_scalar::<f64>()?, 0.0);
    let later = (a.narrow(1, 3, 3)? - b.narrow(1, 3, 3)?)?
        .abs()?
        .max_all()?;
    assert!(later.to_scalar::<f64>()? > 0.0);
    Ok(())
}

#[test]
fn init_is_seeded_and_order_independent() -> Result<()> {
    let spec = Mlp {
        inputs: 3,
        hidden: vec![4],
        outputs: 2,
        activation: Activation::Relu,
        dropout: 0.0,
    };
    let (a, b) = (ParamStore::new(9), ParamStore::new(9));
    spec.build(a.var_builder(DType::F32, &Device::Cpu))?;
    spec.build(b.var_builder(DType::F32, &Device::Cpu))?;
    for ((na, va), (nb, vb)) in a.vars().iter().zip(b.vars().iter()) {
        assert_eq!(na, nb);
        let d = (va.as_tensor() - vb.as_tensor())?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert_eq!(d, 0.0, "{na}");
    }
    assert_eq!(a.num_params(), 3 * 4 + 4 + 4 * 2 + 2);
    Ok(())
}

#[test]
fn max_pool_matches_candle_forward() -> Result<()> {
    // Same values as candle's fused forward (whose backward is wrong).
    let x = features(2 * 3 * 7, 5, 4)?.reshape((2, 3, 7, 5))?;
    let ours = taper::engine::max_pool_2x2(&x)?;
    let theirs = x.max_pool2d(2)?;
    assert_eq!(ours.dims(), theirs.dims());
    let d = (ours - theirs)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f64>()?;
    assert_eq!(d, 0.0);
    Ok(())
}

/// Activation recomputation (every block, every other block) gives the
/// gradients of the plain backward, in float64, for every parameter; with
/// dropout too (a recomputed block draws its masks again, the same ones).
#[test]
fn recomputed_gpt_blocks_give_the_same_gradients() -> Result<()> {
    use taper::engine::recompute::merge_parameter_grads;
    let spec = Gpt {
        vocab: 11,
        context: 6,
        width: 8,
        layers: 3,
        heads: 2,
        mlp: 2,
        dropout: 0.3,
        from: None,
        initial: None,
    };
    let x = Tensor::new(&[[1u32, 4, 2, 6, 0, 9], [3, 3, 5, 1, 2, 10]], &Device::Cpu)?;
    let y = Tensor::new(&[[4u32, 2, 6, 0, 5, 7], [3, 5, 1, 2, 2, 8]], &Device::Cpu)?;
    let store = ParamStore::new(5);
    let model = spec.build_train(store.var_builder(DType::F64, &Device::Cpu))?;
    let grads = |every: usize| -> Result<(f64, Vec<Vec<f64>>)> {
        assert!(model.set_recompute(every));
        let draw = draw(2, 7, 1);
        let loss = CrossEntropy::default().loss(&model.forward_train(&x, draw)?, &y)?;
        let mut g = loss.backward()?;
        merge_parameter_grads(&mut g)?;
        let per_var = store
            .vars()
            .iter()
            .map(|(name, v)| {
                let t = g.get(v).ok_or_else(|| anyhow!("{name}: no gradient"))?;
                Ok(t.flatten_all()?.to_vec1::<f64>()?)
            })
            .collect::<Result<_>>()?;
        Ok((loss.to_scalar::<f64>()?, per_var))
    };
    let (loss0, plain) = grads(0)?;
    for every in [1, 2] {
        let (loss, recomputed) = grads(every)?;
        assert_eq!(loss, loss0, "every {every}: the forward changed");
        for (a, b) in plain.iter().flatten().zip(recomputed.iter().flatten()) {
            let rel = (a - b).abs() / a.abs().max(1e-12);
            assert!(
                rel < 1e-6 || (a - b).abs() < 1e-12,
                "every {every}: {a} vs {b}"
            );
        }
    }
    Ok(())
}
