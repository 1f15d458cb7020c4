//! AdamW's moments for one parameter, in the form its update path keeps
//! them (composed tensors, fused host or device f32, 8-bit host or device,
//! offloaded), the moves between those forms, and their checkpoint entries.

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Shape, Tensor, Var};

use super::super::offload::{Offloaded, Place};
use crate::kernels::device_state::{DeviceMoments, DeviceMoments8};
use crate::kernels::quant8::{self, Blockwise};

pub(super) enum Moments {
    Tensors(Tensor, Tensor),
    Host(Shape, Vec<f32>, Vec<f32>),
    Q8(Shape, Blockwise, Blockwise),
    Device(Shape, DeviceMoments),
    Q8Device(Shape, DeviceMoments8),
    Offload(Shape, Offloaded),
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Path {
    Composed,
    Fused,
    Q8,
    FusedDevice,
    Q8Device,
    Offload,
}

impl Moments {
    /// Both moments as f32 host values.
    pub(super) fn dense(self) -> Result<(Vec<f32>, Vec<f32>)> {
        let host = |t: Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
        Ok(match self {
            Moments::Tensors(m, v) => (host(m)?, host(v)?),
            Moments::Host(_, m, v) => (m, v),
            Moments::Q8(_, m, v) => (
                quant8::dequantize(&m, quant8::BLOCK),
                quant8::dequantize(&v, quant8::BLOCK),
            ),
            Moments::Device(_, d) => d.to_host()?,
            Moments::Offload(_, o) => o.to_host()?,
            Moments::Q8Device(_, d) => {
                let (m, v) = d.to_host()?;
                (
                    quant8::dequantize(&m, quant8::BLOCK),
                    quant8::dequantize(&v, quant8::BLOCK),
                )
            }
        })
    }

    /// The same moments in the form `path` updates (zeros if `None`).
    pub(super) fn into_path(
        this: Option<Moments>,
        path: Path,
        var: &Var,
        place: Option<&Place>,
    ) -> Result<Moments> {
        let shape = var.shape().clone();
        let n = var.elem_count();
        let same = matches!(
            (&this, path),
            (Some(Moments::Tensors(..)), Path::Composed)
                | (Some(Moments::Host(..)), Path::Fused)
                | (Some(Moments::Q8(..)), Path::Q8)
                | (Some(Moments::Device(..)), Path::FusedDevice)
                | (Some(Moments::Q8Device(..)), Path::Q8Device)
                | (Some(Moments::Offload(..)), Path::Offload)
        );
        if same {
            return Ok(this.expect("matched"));
        }
        // 8-bit moments move between host and device as they are, codes
        // and maxima, without a round trip through f32.
        let this = match (this, path) {
            (Some(Moments::Q8(s, m, v)), Path::Q8Device) => {
                return Ok(Moments::Q8Device(
                    s,
                    DeviceMoments8::from_host(var.device(), &m, &v)?,
                ))
            }
            (Some(Moments::Q8Device(s, d)), Path::Q8) => {
                let (m, v) = d.to_host()?;
                return Ok(Moments::Q8(s, m, v));
            }
            (this, _) => this,
        };
        let (m, v) = match this {
            Some(st) => st.dense()?,
            None if path == Path::Q8 => {
                return Ok(Moments::Q8(
                    shape,
                    Blockwise::zeros(n, true),
                    Blockwise::zeros(n, false),
                ))
            }
            None if path == Path::Q8Device => {
                let (m, v) = (Blockwise::zeros(n, true), Blockwise::zeros(n, false));
                return Ok(Moments::Q8Device(
                    shape,
                    DeviceMoments8::from_host(var.device(), &m, &v)?,
                ));
            }
            None if path == Path::Offload => {
                return Ok(Moments::Offload(
                    shape,
                    Offloaded::zeros(offload_place(place)?, var.device(), n)?,
                ))
            }
            None => (vec![0f32; n], vec![0f32; n]),
        };
        if m.len() != n || v.len() != n {
            candle_core::bail!("adamw state: {} moments for {n} parameters", m.len());
        }
        Ok(match path {
            Path::Fused => Moments::Host(shape, m, v),
            Path::Offload => {
                let o = Offloaded::from_host(offload_place(place)?, var.device(), &m, &v)?;
                Moments::Offload(shape, o)
            }
            Path::Q8 => Moments::Q8(
                shape,
                quant8::quantize(&m, quant8::BLOCK, true),
                quant8::quantize(&v, quant8::BLOCK, false),
            ),
            Path::FusedDevice => {
                Moments::Device(shape, DeviceMoments::from_host(var.device(), &m, &v)?)
            }
            Path::Q8Device => Moments::Q8Device(
                shape,
                DeviceMoments8::from_host(
                    var.device(),
                    &quant8::quantize(&m, quant8::BLOCK, true),
                    &quant8::quantize(&v, quant8::BLOCK, false),
                )?,
            ),
            Path::Composed => {
                let t = |x: Vec<f32>| {
                    Tensor::from_vec(x, shape.clone(), var.device())?.to_dtype(var.dtype())
                };
                Moments::Tensors(t(m)?, t(v)?)
            }
        })
    }

    /// The checkpoint entries (`m`, `v`, or 8-bit codes and block maxima),
    /// as `push(kind, tensor)`; an error reading device or file moments is
    /// pushed in place of the first.
    pub(super) fn entries(&self, push: &mut dyn FnMut(&str, Result<Tensor>)) {
        let cpu = Device::Cpu;
        let host = |x: &[f32], s: &Shape| Tensor::from_slice(x, s, &cpu);
        let mut dense = |s: &Shape, mv: Result<(Vec<f32>, Vec<f32>)>| match mv {
            Ok((m, v)) => {
                push("m", host(&m, s));
                push("v", host(&v, s));
            }
            Err(e) => push("m", Err(e)),
        };
        match self {
            Moments::Tensors(m, v) => {
                push("m", Ok(m.clone()));
                push("v", Ok(v.clone()));
            }
            Moments::Host(s, m, v) => {
                push("m", host(m, s));
                push("v", host(v, s));
            }
            Moments::Q8(s, m, v) => push_q8(push, s, m, v),
            Moments::Device(s, d) => dense(s, d.to_host()),
            Moments::Offload(s, o) => dense(s, o.to_host()),
            Moments::Q8Device(s, d) => match d.to_host() {
                Ok((m, v)) => push_q8(push, s, &m, &v),
                Err(e) => push("m8", Err(e)),
            },
        }
    }

    /// 8-bit host moments of `name` from checkpoint entries, checked
    /// against the shape of their codes.
    pub(super) fn q8_from_state(state: &HashMap<String, Tensor>, name: &str) -> Result<Moments> {
        let get = |k: &str| -> Result<&Tensor> {
            match state.get(&format!("{k}.{name}")) {
                Some(t) => Ok(t),
                None => candle_core::bail!("adamw state: {k}.{name} is missing"),
            }
        };
        let codes = |k: &str| -> Result<Vec<u8>> { get(k)?.flatten_all()?.to_vec1() };
        let absmax = |k: &str| -> Result<Vec<f32>> { get(k)?.to_dtype(DType::F32)?.to_vec1() };
        let shape = get("m8")?.shape().clone();
        let (m, v) = (
            Blockwise {
                signed: true,
                codes: codes("m8")?,
                absmax: absmax("m8max")?,
            },
            Blockwise {
                signed: false,
                codes: codes("v8")?,
                absmax: absmax("v8max")?,
            },
        );
        let n = shape.elem_count();
        for b in [&m, &v] {
            if b.codes.len() != n || b.absmax.len() != n.div_ceil(quant8::BLOCK) {
                candle_core::bail!("adamw state: 8-bit moments of {name} do not fit {shape:?}");
            }
        }
        Ok(Moments::Q8(shape, m, v))
    }
}

fn offload_place(place: Option<&Place>) -> Result<&Place> {
    place.ok_or_else(|| candle_core::Error::Msg("adamw: offloaded moments need a place".into()))
}

/// The checkpoint entries of 8-bit moments: codes and block maxima.
fn push_q8(push: &mut dyn FnMut(&str, Result<Tensor>), s: &Shape, m: &Blockwise, v: &Blockwise) {
    let cpu = Device::Cpu;
    push("m8", Tensor::from_slice(&m.codes, s, &cpu));
    push("m8max", Tensor::new(m.absmax.as_slice(), &cpu));
    push("v8", Tensor::from_slice(&v.codes, s, &cpu));
    push("v8max", Tensor::new(v.absmax.as_slice(), &cpu));
}
