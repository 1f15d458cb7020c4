//! Optimizers against references: PyTorch results pasted from candle-nn's own
//! tests (tests/optim.rs, with the PyTorch script below), and float64
//! implementations of the PyTorch update rules for the options candle lacks.

use anyhow::Result;
use candle_core::{Device, Tensor, Var};
use taper::engine::optim::{
    clip_grad_norm, AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig, StateFormat, MIN_8BIT,
};

const XS: [[f32; 2]; 4] = [[2., 1.], [7., 4.], [-4., 12.], [5., 8.]];

fn ys() -> [f32; 4] {
    XS.map(|x| 3.0 * x[0] + x[1] - 2.0)
}

/// Linear regression y = 3 x1 + x2 - 2 from zero weights, loss = sum of
/// squared errors.
struct Regression {
    w: Var,
    b: Var,
    vars: Vec<(String, Var)>,
    xs: Tensor,
    ys: Tensor,
}

impl Regression {
    fn new() -> Result<Self> {
        let dev = Device::Cpu;
        let w = Var::new(&[[0f32, 0.]], &dev)?;
        let b = Var::new(0f32, &dev)?;
        let vars = vec![("b".to_string(), b.clone()), ("w".to_string(), w.clone())];
        Ok(Regression {
            w,
            b,
            vars,
            xs: Tensor::new(&XS, &dev)?,
            ys: Tensor::new(&ys(), &dev)?,
        })
    }

    fn step(&self, opt: &mut dyn Optimizer, clip: Option<f64>) -> Result<()> {
        let pred = self.xs.matmul(&self.w.as_tensor().t()?)?.squeeze(1)?;
        let pred = pred.broadcast_add(self.b.as_tensor())?;
        let loss = (pred - &self.ys)?.sqr()?.sum_all()?;
        let mut grads = loss.backward()?;
        if let Some(max) = clip {
            clip_grad_norm(&self.vars, &mut grads, max)?;
        }
        opt.step(&self.vars, &grads)?;
        Ok(())
    }

    fn weights(&self) -> Result<(Vec<f32>, f32)> {
        Ok((
            self.w.as_tensor().flatten_all()?.to_vec1()?,
            self.b.to_scalar()?,
        ))
    }
}

/// `steps` updates of `opt` on a fresh regression problem.
fn regress(opt: &mut dyn Optimizer, steps: usize, clip: Option<f64>) -> Result<(Vec<f32>, f32)> {
    let p = Regression::new()?;
    for _ in 0..steps {
        p.step(opt, clip)?;
    }
    p.weights()
}

/// Gradient of the regression loss in float64: (dw, db).
fn grad64(w: &[f64; 2], b: f64) -> ([f64; 2], f64) {
    let (mut dw, mut db) = ([0.0; 2], 0.0);
    for (x, y) in XS.iter().zip(ys()) {
        let r = w[0] * x[0] as f64 + w[1] * x[1] as f64 + b - y as f64;
        dw[0] += 2.0 * r * x[0] as f64;
        dw[1] += 2.0 * r * x[1] as f64;
        db += 2.0 * r;
    }
    (dw, db)
}

fn close(a: &[f32], b: &[f64], rel: f64) {
    for (x, y) in a.iter().zip(b) {
        assert!(
            (*x as f64 - y).abs() <= rel * y.abs().max(1.0),
            "{a:?} vs reference {b:?}"
        );
    }
}

/* PyTorch (as pasted in candle-nn tests/optim.rs):
    m = torch.nn.Linear(2, 1); zero weight and bias
    optimizer = optim.AdamW(m.parameters(), lr=0.1)   # weight_decay 0.01
    for _step in range(100): loss = ((m(sample_xs) - sample_ys)**2).sum(); step
    print(m.weight)  # [[2.7257, 0.7097]]
    print(m.bias)    # [0.7873]
*/
#[test]
fn adamw_matches_pytorch() -> Result<()> {
    // Both the fused kernel and the composed tensor ops.
    for fused in [true, false] {
        let mut opt = AdamW::new(AdamWConfig {
            lr: 0.1,
            ..Default::default()
        })
        .with_fused(fused);
        let (w, b) = regress(&mut opt, 100, None)?;
        close(&w, &[2.7257, 0.7097], 1e-4);
        close(&[b], &[0.7873], 1e-4);
    }
    Ok(())
}

/* PyTorch (as pasted in candle-nn tests/optim.rs):
    optimizer = optim.SGD(m.parameters(), lr=0.004, momentum=0.)
    for _step in range(1000): ...
    # weight [[2.9983196, 0.99790204]], bias -1.9796902
*/
#[test]
fn sgd_matches_pytorch() -> Result<()> {
    let mut opt = Sgd::new(SgdConfig {
        lr: 0.004,
        ..Default::default()
    });
    let (w, b) = regress(&mut opt, 1000, None)?;
    close(&w, &[2.9983196, 0.99790204], 1e-5);
    close(&[b], &[-1.9796902], 1e-5);
    Ok(())
}

/// torch.optim.SGD's rule in float64 (weight decay, momentum, dampening, nesterov).
fn sgd64(c: &SgdConfig, steps: usize) -> ([f64; 2], f64) {
    let (mut w, mut b) = ([0.0f64; 2], 0.0f64);
    let mut buf: Option<([f64; 2], f64)> = None;
    for _ in 0..steps {
        let (mut dw, mut db) = grad64(&w, b);
        for i in 0..2 {
            dw[i] += c.weight_decay * w[i];
        }
        db += c.weight_decay * b;
        let nb = match buf {
            None => (dw, db),
            Some((bw, bb)) => (
                [
                    c.momentum * bw[0] + (1.0 - c.dampening) * dw[0],
                    c.momentum * bw[1] + (1.0 - c.dampening) * dw[1],
                ],
                c.momentum * bb + (1.0 - c.dampening) * db,
            ),
        };
        buf = Some(nb);
        if c.nesterov {
            dw = [dw[0] + c.momentum * nb.0[0], dw[1] + c.momentum * nb.0[1]];
            db += c.momentum * nb.1;
        } else {
            (dw, db) = nb;
        }
        w = [w[0] - c.lr * dw[0], w[1] - c.lr * dw[1]];
        b -= c.lr * db;
    }
    (w, b)
}

#[test]
fn sgd_momentum_weight_decay_nesterov_match_float64() -> Result<()> {
    for nesterov in [false, true] {
        let c = SgdConfig {
            lr: 0.002,
            momentum: 0.9,
            dampening: if nesterov { 0.0 } else { 0.1 },
            nesterov,
            weight_decay: 0.05,
            clip_grad_norm: None,
        };
        let (w, b) = regress(&mut Sgd::new(c.clone()), 60, None)?;
        let (rw, rb) = sgd64(&c, 60);
        close(&w, &rw, 1e-4);
        close(&[b], &[rb], 1e-4);
    }
    Ok(())
}

/// torch.optim.AdamW's rule in float64.
fn adamw64(c: &AdamWConfig, steps: usize, clip: Option<f64>) -> ([f64; 3], f64) {
    let mut p = [0.0f64; 3]; // w0, w1, b
    let (mut m, mut v) = ([0.0f64; 3], [0.0f64; 3]);
    let (b1, b2) = c.betas;
    for t in 1..=steps {
        let (dw, db) = grad64(&[p[0], p[1]], p[2]);
        let mut g = [dw[0], dw[1], db];
        if let Some(max) = clip {
            let norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
            let s = max / (norm + 1e-6);
            if s < 1.0 {
                g = g.map(|x| x * s);
            }
        }
        for i in 0..3 {
            p[i] *= 1.0 - c.lr * c.weight_decay;
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            let mh = m[i] / (1.0 - b1.powi(t as i32));
            let vh = v[i] / (1.0 - b2.powi(t as i32));
            p[i] -= c.lr * mh / (vh.sqrt() + c.eps);
        }
    }
    (p, 0.0)
}

#[test]
fn adamw_options_and_clipping_match_float64() -> Result<()> {
    let c = AdamWConfig {
        lr: 0.05,
        betas: (0.8, 0.99),
        eps: 1e-6,
        weight_decay: 0.3,
        clip_grad_norm: None,
        state: StateFormat::F32,
    };
    for (clip, fused) in [
        (None, true),
        (Some(5.0), true),
        (None, false),
        (Some(5.0), false),
    ] {
        let (w, b) = regress(&mut AdamW::new(c.clone()).with_fused(fused), 50, clip)?;
        let (p, _) = adamw64(&c, 50, clip);
        close(&w, &p[..2], 2e-4);
        close(&[b], &p[2..], 2e-4);
    }
    Ok(())
}

#[test]
fn optimizer_state_round_trips() -> Result<()> {
    // 30 steps straight == 10 steps, save state, restore into a new optimizer, 20 steps.
    let c = AdamWConfig {
        lr: 0.05,
        ..Default::default()
    };
    let straight = regress(&mut AdamW::new(c.clone()), 30, None)?;
    let p = Regression::new()?;
    let mut opt = AdamW::new(c.clone());
    for i in 0..30 {
        if i == 10 {
            let state: std::collections::HashMap<_, _> = opt.state().into_iter().collect();
            opt = AdamW::new(c.clone());
            opt.load_state(&state)?;
        }
        p.step(&mut opt, None)?;
    }
    assert_eq!(p.weights()?, straight);
    Ok(())
}

/// A separable least-squares problem over `MIN_8BIT` weights (so that
/// `state = "8bit"` applies): minimise mean_i (a_i w_i - y_i)^2 with a_i in
/// [0.5, 1.5] and y_i in [-1, 1].
fn wide_problem(opt: &mut AdamW, steps: usize, restore_at: Option<usize>) -> Result<Vec<f32>> {
    let dev = Device::Cpu;
    let n = MIN_8BIT;
    let a: Vec<f32> = (0..n)
        .map(|i| 1.0 + 0.5 * ((i as f32) * 0.618).sin())
        .collect();
    let y: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.131).cos()).collect();
    let (a, y) = (Tensor::new(a, &dev)?, Tensor::new(y, &dev)?);
    let w = Var::from_tensor(&Tensor::zeros(n, candle_core::DType::F32, &dev)?)?;
    let vars = vec![("w".to_string(), w.clone())];
    for i in 0..steps {
        if Some(i) == restore_at {
            // Through a checkpoint's tensors and back into a new optimizer.
            let state: std::collections::HashMap<_, _> = opt.state().into_iter().collect();
            let cfg = AdamWConfig {
                lr: 1e-2,
                state: StateFormat::Q8,
                ..Default::default()
            };
            *opt = AdamW::new(cfg);
            opt.load_state(&state)?;
        }
        let loss = ((&a * w.as_tensor())? - &y)?.sqr()?.mean_all()?;
        opt.step(&vars, &loss.backward()?)?;
    }
    Ok(w.as_tensor().to_vec1()?)
}

#[test]
fn eight_bit_state_tracks_f32_state_and_round_trips() -> Result<()> {
    let cfg = |state| AdamWConfig {
        lr: 1e-2,
        state,
        ..Default::default()
    };
    let full = wide_problem(&mut AdamW::new(cfg(StateFormat::F32)), 40, None)?;
    let mut q8 = AdamW::new(cfg(StateFormat::Q8));
    let eight = wide_problem(&mut q8, 40, None)?;
    // 2 bytes per parameter plus two f32 maxima per block of 256.
    let vars = vec![(
        "w".to_string(),
        Var::from_tensor(&Tensor::zeros(
            MIN_8BIT,
            candle_core::DType::F32,
            &Device::Cpu,
        )?)?,
    )];
    assert_eq!(
        q8.state_bytes(&vars),
        2 * MIN_8BIT + 2 * 4 * (MIN_8BIT / 256)
    );
    assert!(q8
        .state()
        .iter()
        .any(|(k, t)| k == "m8.w" && t.dtype() == candle_core::DType::U8));
    // The 8-bit run follows the f32 one closely (relative distance of the
    // weight vectors), and saving and loading its state changes nothing.
    let d: f64 = full
        .iter()
        .zip(&eight)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let r: f64 = full.iter().map(|a| (*a as f64).powi(2)).sum();
    assert!(
        d.sqrt() / r.sqrt() < 0.05,
        "8-bit vs f32: relative distance {}",
        d.sqrt() / r.sqrt()
    );
    let resumed = wide_problem(&mut AdamW::new(cfg(StateFormat::Q8)), 40, Some(15))?;
    assert_eq!(resumed, eight);
    Ok(())
}
