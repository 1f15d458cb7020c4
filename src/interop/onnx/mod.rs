//! The classifiers (`taper.model.mlp`, `taper.model.cnn`) as ONNX models,
//! for onnxruntime and everything that reads ONNX. The graph is the one the
//! model computes: `Conv` (its kernel and padding), the activation and `MaxPool`
//! (2x2, stride 2) per stage, then `Flatten` and one `Gemm` per dense layer.
//! The input is `input`, `[batch, features]` for an MLP and
//! `[batch, channels, height, width]` for a CNN; the output is `logits`,
//! `[batch, classes]`; the batch size is free. Weights are f32 initializers
//! under taper's parameter names. The messages are ONNX's (onnx.proto,
//! IR version 8/9), written with prost's derive as the TensorBoard records are.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Tensor};
use prost::Message;

use crate::engine::{Activation, Cnn, Mlp};
use crate::{Error, Result};

mod proto;

use proto::*;

const FLOAT: i32 = 1;
const INT: i32 = 2;
const STRING: i32 = 3;
const INTS: i32 = 7;

/// A classifier to write: its architecture, as the model builds it.
#[derive(Clone, Copy)]
pub enum Classifier<'a> {
    Mlp(&'a Mlp),
    Cnn(&'a Cnn),
}

/// What goes in the model's `metadata_props` besides taper's own keys.
pub struct Meta<'a> {
    pub describe: String,
    pub step: u64,
    /// Class names, label 0 first, where the run's data knew them.
    pub classes: Option<&'a [String]>,
    /// How an image file becomes the input, for a run on an image folder.
    pub image_input: Option<&'a crate::data::ImageInput>,
    /// How a CSV row becomes the input, for a run on a CSV file: its scale
    /// and standardization go in the graph, which then takes raw values.
    pub table_input: Option<&'a crate::data::TableInput>,
    /// How other data's samples were standardized (a safetensors or IDX
    /// file's): the graph applies it, and takes the samples as their source
    /// gives them.
    pub sample_input: Option<&'a crate::data::SampleInput>,
    /// How a sample of a safetensors file or NumPy arrays was read (its
    /// name, shape, type and the divisor of bytes), for the metadata.
    pub array_input: Option<&'a crate::data::ArrayInput>,
}

/// Writes `net` with its weights (`params`, by taper's names) to `path`
/// (synced, then renamed into place). Returns the bytes written.
pub fn export(
    path: &Path,
    net: Classifier,
    params: &HashMap<String, Tensor>,
    meta: &Meta,
) -> Result<u64> {
    let model = model(net, params, meta)?;
    let bytes = model.encode_to_vec();
    crate::engine::checkpoint::write_atomically(path, |tmp| {
        std::fs::write(tmp, &bytes).map_err(|e| Error::io(tmp, e))
    })?;
    Ok(bytes.len() as u64)
}

fn model(net: Classifier, params: &HashMap<String, Tensor>, meta: &Meta) -> Result<ModelProto> {
    let mut g = Builder {
        params,
        graph: GraphProto {
            name: "taper".into(),
            ..GraphProto::default()
        },
        gelu: false,
    };
    let (input_shape, outputs) = match net {
        Classifier::Mlp(m) => {
            let mut sizes = vec![m.inputs];
            sizes.extend(&m.hidden);
            sizes.push(m.outputs);
            let x = match (meta.table_input, meta.image_input) {
                (Some(t), _) => g.table_input(t, m.inputs)?,
                (None, Some(i)) => g.standardize(i.standardize.as_ref(), &[m.inputs])?,
                (None, None) => {
                    g.standardize(meta.sample_input.map(|s| &s.standardize), &[m.inputs])?
                }
            };
            let mut y = g.dense(x, &sizes, m.activation)?;
            let target = meta
                .table_input
                .and_then(|t| t.target_standardize.as_ref())
                .or(meta
                    .sample_input
                    .and_then(|s| s.target_standardize.as_ref()));
            if let Some(m) = target {
                // A regression's standardized target, back in its units.
                let std = g.constant("target_std", &[m.std.len()], &m.std);
                let mean = g.constant("target_mean", &[m.mean.len()], &m.mean);
                y = g.node("Mul", &[&y, &std], vec![]);
                y = g.node("Add", &[&y, &mean], vec![]);
            }
            g.rename_output(y);
            (vec![m.inputs], m.outputs)
        }
        Classifier::Cnn(c) => {
            let moments = match meta.image_input {
                Some(i) => i.standardize.as_ref(),
                None => meta.sample_input.map(|s| &s.standardize),
            };
            let x = g.standardize(moments, &c.input)?;
            let y = g.cnn(c, x)?;
            g.rename_output(y);
            (c.input.to_vec(), c.outputs)
        }
    };
    let free_batch = || Dimension {
        value: Some(Dim::Param("batch".into())),
    };
    let value_info = |name: &str, dims: &[usize]| ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorType {
                elem_type: FLOAT,
                shape: Some(TensorShapeProto {
                    dim: std::iter::once(free_batch())
                        .chain(dims.iter().map(|&d| Dimension {
                            value: Some(Dim::Value(d as i64)),
                        }))
                        .collect(),
                }),
            }),
        }),
    };
    g.graph.input.push(value_info("input", &input_shape));
    g.graph.output.push(value_info("logits", &[outputs]));
    // Gelu(approximate = "tanh") came with opset 20 (IR 9); the other ops
    // are all in opset 17, which older runtimes read.
    let (opset, ir) = if g.gelu { (20, 9) } else { (17, 8) };
    let mut props = vec![
        entry("taper.model", &meta.describe),
        entry("taper.step", &meta.step.to_string()),
    ];
    if let Some(classes) = meta.classes {
        props.push(entry("taper.classes", &json(&classes)?));
    }
    if let Some(input) = meta.image_input {
        // The graph standardizes: the input is the pixels divided by the
        // scale, as without a standardization.
        let read = crate::data::ImageInput {
            standardize: None,
            ..input.clone()
        };
        props.push(entry("taper.image_input", &json(&read)?));
    }
    if let Some(input) = meta.array_input {
        // The graph standardizes; bytes are divided by `scale` before it.
        props.push(entry("taper.array_input", &json(input)?));
    }
    if let Some(input) = meta.table_input {
        // The graph applies the scale and standardization itself.
        let mut columns = serde_json::json!({
            "columns": input.columns,
            "header": input.header,
            "delimiter": input.delimiter,
        });
        if input.decimal != "." {
            columns["decimal"] = serde_json::json!(input.decimal);
        }
        if !input.categories.is_empty() {
            // The input holds each column of categories one-hot encoded,
            // as `inputs` names them (pandas' get_dummies names).
            columns["categories"] = serde_json::json!(input.categories);
            columns["inputs"] = serde_json::json!(input.input_names());
        }
        props.push(entry("taper.table_input", &json(&columns)?));
        match &input.targets[..] {
            [] => {}
            // A regression: `logits` holds the target's predicted value...
            [t] => props.push(entry("taper.target", &json(t)?)),
            // ...or each target's, in this order.
            many => props.push(entry("taper.target", &json(many)?)),
        }
    }
    Ok(ModelProto {
        ir_version: ir,
        producer_name: "taper".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        doc_string: meta.describe.clone(),
        graph: Some(g.graph),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        metadata_props: props,
    })
}

fn json<T: serde::Serialize + ?Sized>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::Config(format!("format onnx: metadata: {e}")))
}

fn entry(key: &str, value: &str) -> StringStringEntryProto {
    StringStringEntryProto {
        key: key.into(),
        value: value.into(),
    }
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        ints: v.to_vec(),
        r#type: INTS,
        ..AttributeProto::default()
    }
}

fn int(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        i,
        r#type: INT,
        ..AttributeProto::default()
    }
}

struct Builder<'a> {
    params: &'a HashMap<String, Tensor>,
    graph: GraphProto,
    gelu: bool,
}

impl Builder<'_> {
    /// Adds `op` on `inputs`; returns its output's name.
    fn node(&mut self, op: &str, inputs: &[&str], attribute: Vec<AttributeProto>) -> String {
        let name = format!("{}_{}", op.to_lowercase(), self.graph.node.len());
        self.graph.node.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![name.clone()],
            name: name.clone(),
            op_type: op.into(),
            attribute,
        });
        name
    }

    /// The last node's output becomes the graph's `logits`.
    fn rename_output(&mut self, last: String) {
        if let Some(n) = self
            .graph
            .node
            .iter_mut()
            .rev()
            .find(|n| n.output[0] == last)
        {
            n.output[0] = "logits".into();
        }
    }

    /// Adds f32 `values` of `shape` as the initializer `name`.
    fn constant(&mut self, name: &str, shape: &[usize], values: &[f32]) -> String {
        self.graph.initializer.push(TensorProto {
            dims: shape.iter().map(|&d| d as i64).collect(),
            data_type: FLOAT,
            name: name.into(),
            raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        });
        name.into()
    }

    /// A CSV run's reading of raw values (a column of categories one-hot
    /// encoded), as `TableInput::read` applies it: numbers divided by the
    /// scale, then standardized (each an f32 operation, so
    /// the results are taper's to the bit).
    fn table_input(&mut self, t: &crate::data::TableInput, inputs: usize) -> Result<String> {
        if t.width() != inputs {
            return Err(Error::Config(format!(
                "format onnx: the run read {} CSV columns for a model of {inputs} inputs",
                t.width()
            )));
        }
        let mut x = "input".to_string();
        if t.scale != 1.0 {
            // One-hot categories are not scaled.
            let one_hot = t.one_hot_inputs();
            let scale = match one_hot.contains(&true) {
                false => self.constant("input_scale", &[1], &[t.scale]),
                true => {
                    let each: Vec<f32> = one_hot
                        .iter()
                        .map(|&h| if h { 1.0 } else { t.scale })
                        .collect();
                    self.constant("input_scale", &[inputs], &each)
                }
            };
            x = self.node("Div", &[&x, &scale], vec![]);
        }
        if let Some(m) = &t.standardize {
            let mean = self.constant("input_mean", &[inputs], &m.mean);
            let std = self.constant("input_std", &[inputs], &m.std);
            x = self.node("Sub", &[&x, &mean], vec![]);
            x = self.node("Div", &[&x, &std], vec![]);
        }
        Ok(x)
    }

    /// The run's standardization of the input (of `shape` without the
    /// batch: an image's pixels divided by the scale, as `ImageInput::read`
    /// applies it, or another source's samples); the input itself when
    /// there is none.
    fn standardize(&mut self, m: Option<&crate::data::Moments>, shape: &[usize]) -> Result<String> {
        let Some(m) = m else {
            return Ok("input".into());
        };
        let values: usize = shape.iter().product();
        let groups = m.mean.len();
        if groups == 0 || !values.is_multiple_of(groups) {
            return Err(Error::Config(format!(
                "format onnx: {groups} standardization means for inputs of {values} values"
            )));
        }
        // One per channel of a [C, H, W] input broadcasts as [C, 1, 1];
        // otherwise each value gets its own.
        let (dims, mean, std) = if shape.len() == 3 && groups == shape[0] {
            (vec![groups, 1, 1], m.mean.clone(), m.std.clone())
        } else {
            let span = values / groups;
            let every = |v: &[f32]| (0..values).map(|k| v[k / span]).collect::<Vec<f32>>();
            (shape.to_vec(), every(&m.mean), every(&m.std))
        };
        let mean = self.constant("input_mean", &dims, &mean);
        let std = self.constant("input_std", &dims, &std);
        let x = self.node("Sub", &["input", &mean], vec![]);
        Ok(self.node("Div", &[&x, &std], vec![]))
    }

    /// Adds the parameter `name` as an f32 initializer, checking its shape.
    fn weight(&mut self, name: &str, shape: &[usize]) -> Result<String> {
        let t = self.params.get(name).ok_or_else(|| {
            Error::Config(format!("format onnx: the model has no parameter `{name}`"))
        })?;
        if t.dims() != shape {
            return Err(Error::Config(format!(
                "format onnx: parameter `{name}` is {:?}, the architecture says {shape:?}",
                t.dims()
            )));
        }
        let values = t
            .to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| Error::Config(format!("format onnx: reading `{name}`: {e}")))?;
        Ok(self.constant(name, shape, &values))
    }

    fn activation(&mut self, x: &str, act: Activation) -> String {
        match act {
            Activation::Relu => self.node("Relu", &[x], vec![]),
            Activation::Tanh => self.node("Tanh", &[x], vec![]),
            Activation::Gelu => {
                // candle's gelu, and taper's kernel, are the tanh form.
                self.gelu = true;
                let approximate = AttributeProto {
                    name: "approximate".into(),
                    s: b"tanh".to_vec(),
                    r#type: STRING,
                    ..AttributeProto::default()
                };
                self.node("Gelu", &[x], vec![approximate])
            }
            Activation::Silu => {
                let s = self.node("Sigmoid", &[x], vec![]);
                self.node("Mul", &[x, &s], vec![])
            }
        }
    }

    /// `sizes[0] -> ... -> sizes[n]` dense layers `fc0, fc1, ...` with the
    /// activation between them (none after the last), as `Dense` computes.
    fn dense(&mut self, mut x: String, sizes: &[usize], act: Activation) -> Result<String> {
        for (i, w) in sizes.windows(2).enumerate() {
            let weight = self.weight(&format!("fc{i}.weight"), &[w[1], w[0]])?;
            let bias = self.weight(&format!("fc{i}.bias"), &[w[1]])?;
            x = self.node("Gemm", &[&x, &weight, &bias], vec![int("transB", 1)]);
            if i + 2 < sizes.len() {
                x = self.activation(&x, act);
            }
        }
        Ok(x)
    }

    /// The convolution stages (as `CnnNet::forward`), flattened, then the
    /// dense head.
    fn cnn(&mut self, c: &Cnn, mut x: String) -> Result<String> {
        let (k, p) = (c.kernel, c.pad());
        let mut in_c = c.input[0];
        for (i, stage) in c.stages().into_iter().enumerate() {
            let Some((_, [out_c, ..])) = stage else {
                let what = crate::engine::ModelSpec::describe(c);
                return Err(Error::Config(format!(
                    "export: {what} leaves nothing to its head"
                )));
            };
            let weight = self.weight(&format!("conv{i}.weight"), &[out_c, in_c, k, k])?;
            let bias = self.weight(&format!("conv{i}.bias"), &[out_c])?;
            let (k, p) = (k as i64, p as i64);
            let conv = vec![
                ints("kernel_shape", &[k, k]),
                ints("pads", &[p, p, p, p]),
                ints("strides", &[1, 1]),
            ];
            x = self.node("Conv", &[&x, &weight, &bias], conv);
            x = self.activation(&x, c.activation);
            if c.pools(i) {
                // Floor mode (ONNX's default) drops an odd last row or
                // column, as taper's pool does.
                let pool = vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])];
                x = self.node("MaxPool", &[&x], pool);
            }
            in_c = out_c;
        }
        x = self.node("Flatten", &[&x], vec![int("axis", 1)]);
        let mut sizes = vec![c.flat_features()];
        sizes.extend(&c.hidden);
        sizes.push(c.outputs);
        self.dense(x, &sizes, c.activation)
    }
}
