//! `taper bench step`'s convolutional models, each as
//! `benches/torch_step.py` builds it (`CNNS` there).

use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::Workload;
use crate::data::Batch;
use crate::engine::rng::Rng;
use crate::{Error, Result};

/// A CNN's shape: input `[c, h, w]`, `kernel x kernel` convolutions with
/// `padding` (each with a 2x2 max-pool, unless `pool` says otherwise),
/// dense hidden widths, 10 classes.
pub(super) struct CnnShape {
    input: [usize; 3],
    channels: &'static [usize],
    hidden: &'static [usize],
    kernel: usize,
    padding: usize,
    pool: Option<&'static [bool]>,
}

/// The CNN of issue 18's comparison: 28x28 inputs, 3x3 convolutions of 8
/// and 16 channels, a dense layer of 64; as `benches/torch_step.py --model
/// cnn`.
pub(super) const CNN: CnnShape = CnnShape {
    input: [1, 28, 28],
    channels: &[8, 16],
    hidden: &[64],
    kernel: 3,
    padding: 1,
    pool: None,
};

/// `scripts/image_folder.lua`'s CNN on RGB photos (`--set size=64 --set
/// channels=3`, the README's pets example): convolutions of 16 and 32
/// channels, a dense layer of 128; as `torch_step.py --model cnn-rgb`.
pub(super) const CNN_RGB: CnnShape = CnnShape {
    input: [3, 64, 64],
    channels: &[16, 32],
    hidden: &[128],
    kernel: 3,
    padding: 1,
    pool: None,
};

/// The net of PyTorch's CIFAR-10 tutorial ("Training a Classifier"), LeNet-5
/// in shape: 3x32x32 inputs, 5x5 convolutions of 6 and 16 channels without
/// padding, dense 120 and 84; as `torch_step.py --model lenet`.
pub(super) const LENET: CnnShape = CnnShape {
    input: [3, 32, 32],
    channels: &[6, 16],
    hidden: &[120, 84],
    kernel: 5,
    padding: 0,
    pool: None,
};

/// The net of PyTorch's MNIST example (pytorch/examples, `mnist/main.py`):
/// 1x28x28 inputs, 3x3 convolutions of 32 and 64 channels without padding,
/// one 2x2 max-pool after the second, dense 128 (1,199,882 parameters;
/// without its dropout, as the other models); as `torch_step.py --model
/// mnist`.
pub(super) const MNIST: CnnShape = CnnShape {
    input: [1, 28, 28],
    channels: &[32, 64],
    hidden: &[128],
    kernel: 3,
    padding: 0,
    pool: Some(&[false, true]),
};

pub(super) fn workload(shape: &CnnShape, b: usize, rng: &mut Rng) -> Result<Workload> {
    let classes = 10;
    let spec = crate::engine::Cnn {
        input: shape.input,
        channels: shape.channels.to_vec(),
        hidden: shape.hidden.to_vec(),
        outputs: classes,
        activation: Default::default(),
        dropout: 0.0.into(),
        kernel: shape.kernel,
        padding: Some(shape.padding),
        pool: shape.pool.map(<[bool]>::to_vec),
    };
    let n: usize = shape.input.iter().product();
    let x: Vec<f32> = (0..b * n).map(|_| rng.normal() as f32).collect();
    let y: Vec<u32> = (0..b).map(|_| rng.below(classes) as u32).collect();
    // Multiply-adds per sample: each conv's k^2 Cin Cout per output
    // position, the dense layers' weights; training is 3x the forward's 2
    // per MAC.
    let mut c = shape.input[0];
    let mut macs = 0.0;
    for stage in spec.stages() {
        let Some(([o, h, w], _)) = stage else {
            return Err(Error::Config(
                "bench step: a CNN stage leaves nothing".into(),
            ));
        };
        macs += (shape.kernel * shape.kernel * c * o * h * w) as f64;
        c = o;
    }
    let mut inputs = spec.flat_features();
    for &width in shape.hidden.iter().chain([classes].iter()) {
        macs += (inputs * width) as f64;
        inputs = width;
    }
    Ok(Workload {
        batch: Batch {
            x: Tensor::from_vec(x, (b, n), &Device::Cpu)?,
            y: Tensor::from_vec(y, b, &Device::Cpu)?,
            indices: (0..b).collect(),
        },
        items: b,
        gpt: None,
        per_item: Some(6.0 * macs),
        spec: Arc::new(spec),
    })
}
