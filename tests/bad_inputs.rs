//! Bad inputs, as a user meets them: each one through the real CLI, with the
//! message it must give (what was wrong, and where: the recipe's file:line,
//! the data file, the sample, the byte offset) and the exit code. Nothing
//! is trained on silently wrong data, and nothing exits 0 having done
//! nothing. (Learning rates are in `tests/cli.rs`, checkpoints and `--resume`
//! in `tests/durable/`.)

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// Writes a safetensors file of samples `x` (f32, `[n, features]`) and
/// targets `y` (given as raw little-endian bytes of `y_dtype`, `[n]`).
fn samples(path: &Path, x: &[f32], features: usize, y: &[u8], y_dtype: Dtype) {
    let n = x.len() / features;
    let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensors = HashMap::from([
        (
            "x".to_string(),
            TensorView::new(Dtype::F32, vec![n, features], &xb).unwrap(),
        ),
        (
            "y".to_string(),
            TensorView::new(y_dtype, vec![n], y).unwrap(),
        ),
    ]);
    safetensors::serialize_to_file(tensors, None, path).unwrap();
}

/// Token windows: inputs `x` and targets `y`, both u32 `[n, context]`.
fn tokens(path: &Path, x: &[u32], y: &[u32], context: usize) {
    let n = x.len() / context;
    let (xb, yb): (Vec<u8>, Vec<u8>) = (
        x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        y.iter().flat_map(|v| v.to_le_bytes()).collect(),
    );
    let tensors = HashMap::from([
        (
            "x".to_string(),
            TensorView::new(Dtype::U32, vec![n, context], &xb).unwrap(),
        ),
        (
            "y".to_string(),
            TensorView::new(Dtype::U32, vec![n, context], &yb).unwrap(),
        ),
    ]);
    safetensors::serialize_to_file(tensors, None, path).unwrap();
}

struct Case {
    name: &'static str,
    /// The recipe (`recipe.lua` in the case's folder, which is the working
    /// directory: data files are named relative to it).
    recipe: &'static str,
    args: &'static [&'static str],
    code: i32,
    says: &'static [&'static str],
}

/// A recipe training an MLP of `inputs` → `outputs` on `data.safetensors`.
const MLP_ON_FILE: &str = r#"local run = taper.run{
  model = taper.model.mlp{ inputs = 2, hidden = { 4 }, outputs = 10 },
  data = taper.data.safetensors{ path = "data.safetensors", scale = 1 }:batch(2),
}
for _ in run:epochs(1) do
  for batch in run:batches() do run:step(batch) end
end
"#;

/// A regression on `data.safetensors`: its `y` tensor as the target.
const MLP_ON_TARGET: &str = r#"local run = taper.run{
  model = taper.model.mlp{ inputs = 2, hidden = { 4 }, outputs = 1 },
  data = taper.data.safetensors{ path = "data.safetensors", target = "y", scale = 1 }:batch(2),
  loss = taper.loss.mse{},
}
for _ in run:epochs(1) do
  for batch in run:batches() do run:step(batch) end
end
"#;

const DIGITS_MLP: &str = r#"local cfg = taper.config{ epochs = 1 }
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 8 }, outputs = 10 },
  data = taper.data.digits{ split = "train" }:batch(64),
  on_oom = function(event) return POLICY end,
}
for _ in run:epochs(cfg.epochs) do
  for batch in run:batches() do run:step(batch) end
end
"#;

/// A generator of 4 batches of 2 samples; the third batch's second sample
/// has input `x` and label `y` (given as Lua expressions by `--set`).
const GENERATOR: &str = r#"local cfg = taper.config{ x = "0.5", y = "1" }
local gen = taper.data.generator(function(epoch)
  return coroutine.wrap(function()
    for i = 1, 4 do
      local third = i == 3
      local x = third and load("return " .. cfg.x)() or 0.5
      local y = third and load("return " .. cfg.y)() or 1
      coroutine.yield{ x = { { 0.1, 0.2 }, { x, 0.4 } }, y = { 0, y } }
    end
  end)
end)
local run = taper.run{ model = taper.model.mlp{ inputs = 2, outputs = 3 }, data = gen }
for _ in run:epochs(1) do for b in run:batches() do run:step(b) end end
"#;

/// `taper.run{}` over digits with `OPTS` added (an optimizer, an option).
const DIGITS_WITH: &str = r#"local run = taper.run{
  model = taper.model.mlp{ inputs = 64, outputs = 10 },
  data = taper.data.digits{}:batch(8),
  OPTS
}
"#;

fn cases() -> Vec<Case> {
    let optim = |name: &'static str, opts: &'static str, says: &'static str| Case {
        name,
        recipe: Box::leak(DIGITS_WITH.replace("OPTS", opts).into_boxed_str()),
        args: &[],
        code: 2,
        says: Box::leak(Box::new([says])),
    };
    vec![
        Case {
            name: "a negative sampling temperature",
            recipe: r#"local run = taper.run{ model = taper.model.gpt{ vocab = 67, context = 8 } }
print(run:generate{ prompt = { 1, 2 }, temperature = -1 })
"#,
            args: &[],
            code: 2,
            says: &["recipe.lua:2: run:generate: temperature -1: it must be 0"],
        },
        Case {
            name: "a prompt id beyond the vocabulary",
            recipe: r#"local run = taper.run{ model = taper.model.gpt{ vocab = 67, context = 8 } }
print(run:generate{ prompt = { 1, 999 } })
"#,
            args: &[],
            code: 2,
            says: &["recipe.lua:2: run:generate: prompt id 999 is out of range: the model's vocabulary has 67 ids"],
        },
        Case {
            name: "a chat's messages to a run on plain text",
            recipe: r#"local run = taper.run{ model = taper.model.gpt{ vocab = 67, context = 8 }, data = taper.data.shakespeare{ context = 8 } }
print(run:generate{ messages = { { role = "user", content = "hi" } } })
"#,
            args: &[],
            code: 2,
            says: &["recipe.lua:2: run:generate: `messages` need a run on chats (taper.data.chat), whose chat template renders them"],
        },
        Case {
            name: "a prompt and messages both",
            recipe: r#"local run = taper.run{ model = taper.model.gpt{ vocab = 67, context = 8 } }
print(run:generate{ prompt = { 1 }, messages = {} })
"#,
            args: &[],
            code: 2,
            says: &["recipe.lua:2: run:generate: give a `prompt` or a chat's `messages`, not both"],
        },
        optim(
            "a step decay every 0 steps",
            "schedule = taper.schedule.step{ lr = 0.1, every = 0, gamma = 0.5 },",
            "recipe.lua:4: taper.schedule.step: option `every` must be at least 1",
        ),
        optim(
            "a batch ramp over 0 steps",
            "schedule = taper.schedule.batch_ramp{ from = 8, to = 32, steps = 0 },",
            "taper.schedule.batch_ramp: option `steps` must be at least 1",
        ),
        optim(
            "a beta of 1 or more",
            "optim = taper.optim.adamw{ betas = { 0.9, 1.0 } },",
            "recipe.lua:4: taper.optim.adamw: option `betas[2]` must be in [0, 1), got 1",
        ),
        optim(
            "a negative weight decay",
            "optim = taper.optim.adamw{ weight_decay = -0.1 },",
            "taper.optim.adamw: option `weight_decay` must be in [0, inf), got -0.1",
        ),
        optim(
            "a momentum that never decays",
            "optim = taper.optim.sgd{ momentum = 1 },",
            "taper.optim.sgd: option `momentum` must be in [0, 1), got 1",
        ),
        optim(
            "Nesterov without momentum",
            "optim = taper.optim.sgd{ nesterov = true },",
            "taper.optim.sgd: nesterov needs a momentum and zero dampening",
        ),
        optim(
            "an offload folder that does not exist",
            "offload = \"no-such-folder\",",
            "recipe.lua:1: taper.run: option `offload`: no-such-folder is not a folder",
        ),
        Case {
            name: "a hidden layer of width 0",
            recipe: "local m = taper.model.mlp{ inputs = 64, hidden = { 0 }, outputs = 10 }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.model.mlp: each hidden width must be at least 1"],
        },
        Case {
            name: "a step without its batch",
            recipe: "local run = taper.run{ model = taper.model.mlp{ inputs = 64, outputs = 10 }, data = taper.data.digits{}:batch(8) }\nfor batch in run:batches() do\n  run:step()\nend\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:3: run:step: argument 1 must be a batch (from run:batches() or data:batches()), got nil"],
        },
        Case {
            name: "a step given the data instead of a batch",
            recipe: "local data = taper.data.digits{}:batch(8)\nlocal run = taper.run{ model = taper.model.mlp{ inputs = 64, outputs = 10 }, data = data }\nrun:step(data)\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:3: run:step: argument 1 must be a batch (from run:batches() or data:batches()), got another kind of taper object"],
        },
        Case {
            name: "a method's option table of another type",
            recipe: "local run = taper.run{ model = taper.model.mlp{ inputs = 64, outputs = 10 } }\nrun:evaluate(taper.data.digits{}, 3)\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:2: run:evaluate: argument 2 must be a table, got an integer"],
        },
        Case {
            name: "a classifier with one output",
            recipe: "local m = taper.model.mlp{ inputs = 4, hidden = { 8 }, outputs = 1 }\nlocal run = taper.run{ model = m }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:2: taper.run: the model has outputs = 1, and its loss is the cross-entropy", "a classifier needs one output per class (outputs = 2 for two classes, labelled 0 and 1)", "To predict a number (regression), train with `loss = taper.loss.mse{}` on a CSV file's or a safetensors file's `target`"],
        },
        Case {
            name: "a convolutional classifier with one output",
            recipe: "local run = taper.run{ model = taper.model.cnn{ input = { 1, 8, 8 }, channels = { 4 }, outputs = 1 } }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.run: the model has outputs = 1"],
        },
        Case {
            name: "class labels trained with the mean squared error",
            recipe: "local run = taper.run{ model = taper.model.mlp{ inputs = 64, outputs = 1 }, loss = taper.loss.mse{}, data = taper.data.digits{} }\nfor _ in run:epochs(1) do for b in run:batches() do run:step(b) end end\n",
            args: &[],
            code: 2,
            says: &["the targets are class labels, and the loss (mse) takes numbers"],
        },
        Case {
            name: "a CSV label and target both",
            recipe: "local d = taper.data.csv{ path = \"x.csv\", label = 0, target = 1 }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.data.csv: give `label` (a class column) or `target` (a numeric column to predict), not both"],
        },
        Case {
            name: "a width the heads do not divide",
            recipe: "local m = taper.model.gpt{ vocab = 65, context = 8, width = 100, heads = 3 }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.model.gpt: width 100 is not divisible by heads 3"],
        },
        Case {
            name: "more pooling stages than the image has pixels",
            recipe: "local m = taper.model.cnn{ input = { 1, 8, 8 }, channels = { 4, 4, 4, 4 }, outputs = 10 }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.model.cnn: 4 conv stages", "shrink a 8x8 input to nothing: stage 4 gets 1x1, which its 3x3 kernel (padding 1) and 2x2 max-pool leave empty"],
        },
        Case {
            name: "a kernel too large for its stage's input",
            recipe: "local m = taper.model.cnn{ input = { 1, 28, 28 }, channels = { 6, 16, 32 }, kernel = 5, padding = 0, outputs = 10 }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.model.cnn: 3 conv stages shrink a 28x28 input to nothing: stage 3 gets 4x4, which its 5x5 kernel (padding 0) and 2x2 max-pool leave empty"],
        },
        Case {
            name: "a pool list of another length than the convolutions",
            recipe: "local m = taper.model.cnn{ input = { 1, 28, 28 }, channels = { 32, 64 }, pool = { true }, outputs = 10 }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.model.cnn: `pool` has 1 entry and `channels` 2: give one per convolution (true: a 2x2 max-pool after it)"],
        },
        Case {
            name: "a dropout list of another length than the dense layers' inputs",
            recipe: "local m = taper.model.cnn{ input = { 1, 28, 28 }, channels = { 8 }, hidden = { 16 }, dropout = { 0.25, 0.5, 0.5 }, outputs = 10 }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.model.cnn: dropout has 3 rates and the model 2 places for them (the flattened features, then each hidden activation): give one rate, or one a place"],
        },
        Case {
            name: "a dropout list with a rate of 1",
            recipe: "local m = taper.model.cnn{ input = { 1, 28, 28 }, channels = { 8 }, hidden = { 16 }, dropout = { 0.25, 1 }, outputs = 10 }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.model.cnn: dropout 1 is not a rate in [0, 1)"],
        },
        Case {
            name: "unpooled stages that shrink the image to nothing",
            recipe: "local m = taper.model.cnn{ input = { 1, 4, 4 }, channels = { 4, 4 }, padding = 0, pool = { false, false }, outputs = 10 }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.model.cnn: 2 conv stages shrink a 4x4 input to nothing: stage 2 gets 2x2, which its 3x3 kernel (padding 0) leaves empty"],
        },
        Case {
            name: "a kernel of size 0",
            recipe: "local m = taper.model.cnn{ input = { 1, 28, 28 }, channels = { 6 }, kernel = 0, outputs = 10 }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.model.cnn: kernel must be at least 1"],
        },
        Case {
            name: "split fractions that do not sum to 1",
            recipe: "local d = taper.data.digits{}\nlocal train, val = d:split{ 0.8, 0.1 }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:2: split: the proportions [0.8, 0.1] are fractions that sum to 0.9, not 1; give fractions that sum to 1 ({ 0.9, 0.1 }) or weights ({ 9, 1 })"],
        },
        Case {
            name: "an infinite split proportion",
            recipe: "local d = taper.data.digits{}\nlocal train, val = d:split{ 1/0, 1 }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:2: split: the proportions [inf, 1.0] must be numbers of 0 or more, not all 0"],
        },
        Case {
            name: "a word in a CSV of numbers",
            recipe: "local data = taper.data.csv{ path = \"data.csv\" }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.data.csv: data.csv: line 2, column 2: `x` is not a number"],
        },
        Case {
            name: "NaN in a CSV of numbers",
            recipe: "local data = taper.data.csv{ path = \"nan.csv\" }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.data.csv: nan.csv: line 2, column 1: a missing value (`nan`); `missing = \"drop\"` leaves such rows out"],
        },
        Case {
            name: "a scale of 0",
            recipe: "local data = taper.data.csv{ path = \"data.csv\", scale = 0 }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.data.csv: option `scale` must be a positive number, got 0"],
        },
        Case {
            name: "a NaN input in a safetensors file",
            recipe: MLP_ON_FILE,
            args: &[],
            code: 2,
            says: &[
                "recipe.lua:6: run:step: safetensors ",
                "epoch 1, batch 2: sample 2 (row 0 of the batch): input value 1 of the sample is NaN: the data holds a number that is not finite",
            ],
        },
        Case {
            name: "an infinite input from a generator",
            recipe: GENERATOR,
            args: &["--set", "x=1/0"],
            code: 2,
            says: &["recipe.lua:13: run:step: the generator at recipe.lua:2: epoch 1, batch 3: sample 1 (row 1 of the batch): input value 0 of the sample is inf"],
        },
        Case {
            name: "a negative label from a generator",
            recipe: GENERATOR,
            args: &["--set", "y=-1"],
            code: 2,
            says: &["generator at recipe.lua:2: y: -1 (sample 1) is not a class index or token id"],
        },
        Case {
            name: "a fractional label from a generator",
            recipe: GENERATOR,
            args: &["--set", "y=2.5"],
            code: 2,
            says: &["generator at recipe.lua:2: y: 2.5 (sample 1) is not a class index or token id"],
        },
        Case {
            name: "an image folder of 2 channels",
            recipe: "local data = taper.data.images{ path = \"images\", channels = 2 }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.data.images: option `channels` must be 1 (grey) or 3 (RGB), got 2"],
        },
        Case {
            name: "an image size of 0",
            recipe: "local data = taper.data.images{ path = \"images\", size = { 0, 4 } }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.data.images: option `size` must be { height, width }, both at least 1, got [0, 4]"],
        },
        Case {
            name: "an image folder that does not exist",
            recipe: "local data = taper.data.images{ path = \"no-such\" }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.data.images: no-such does not exist"],
        },
        Case {
            name: "a file in an image folder that is not an image",
            recipe: "local data = taper.data.images{ path = \"broken\" }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.data.images: broken/cls/b.png: not a readable image"],
        },
        Case {
            name: "a negative label in a safetensors file",
            recipe: MLP_ON_FILE,
            args: &[],
            code: 2,
            says: &[
                "data.safetensors: offset ",
                "tensor `y`, sample 1: -3 is not a class index or token id",
                "recipe.lua:3:",
            ],
        },
        Case {
            name: "a NaN label in a safetensors file",
            recipe: MLP_ON_FILE,
            args: &[],
            code: 2,
            says: &["tensor `y`, sample 2: NaN is not a class index"],
        },
        Case {
            name: "a fractional label in a safetensors file",
            recipe: MLP_ON_FILE,
            args: &[],
            code: 2,
            says: &[
                "recipe.lua:3: taper.data.safetensors: ",
                "tensor `y`, sample 1: 2.5 is not a class index or token id (a whole number, 0 or more); for numbers to predict (a regression), give it as `target = \"y\"`",
            ],
        },
        Case {
            name: "a NaN target in a safetensors file",
            recipe: MLP_ON_TARGET,
            args: &[],
            code: 2,
            says: &["recipe.lua:3: taper.data.safetensors: ", "tensor `y`, sample 2: NaN is not a finite number"],
        },
        Case {
            name: "two targets per sample for a model of one output",
            recipe: MLP_ON_TARGET,
            args: &[],
            code: 2,
            says: &["each sample has 2 target values, and the model gives 1 (its `outputs`)"],
        },
        Case {
            name: "a target of three dimensions in a safetensors file",
            recipe: MLP_ON_TARGET,
            args: &[],
            code: 2,
            says: &["recipe.lua:3: taper.data.safetensors: ", "tensor `y` has shape [2, 1, 2]: a `target` is a number per sample (shape [n]) or a row of them, one per target (shape [n, k])"],
        },
        Case {
            name: "a generator whose function returns a batch, not an iterator",
            recipe: "local g = taper.data.generator(function(epoch)\n  return { x = { { 1.0 } }, y = { 0 } }\nend)\nfor b in g:batches() do end\n",
            args: &[],
            code: 2,
            says: &["taper.data.generator: the function at recipe.lua:1 returned a table for epoch 1; it returns an iterator (a function, or coroutine.wrap(...)) whose calls give one batch each, then nil"],
        },
        Case {
            name: "an empty target list",
            recipe: "local d = taper.data.csv{ path = \"data.csv\", target = {} }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.data.csv: `target` names no column: give a column (`target = \"body_mass_g\"`) or a list of them"],
        },
        Case {
            name: "a target column listed twice",
            recipe: "local d = taper.data.csv{ path = \"data.csv\", target = { 0, -3 } }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.data.csv: ", "data.csv: column 1 is among the targets twice"],
        },
        Case {
            name: "both y and target",
            recipe: "local d = taper.data.safetensors{ path = \"data.safetensors\", y = \"y\", target = \"y\" }\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.data.safetensors: give `y` (class labels) or `target` (numbers to predict), not both"],
        },
        Case {
            name: "class labels given as a target to a classifier",
            recipe: "local run = taper.run{\n  model = taper.model.mlp{ inputs = 2, outputs = 10 },\n  data = taper.data.safetensors{ path = \"data.safetensors\", target = \"y\", scale = 1 }:batch(2),\n}\nfor _ in run:epochs(1) do\n  for batch in run:batches() do run:step(batch) end\nend\n",
            args: &[],
            code: 2,
            says: &["recipe.lua:6: run:step: ", "the targets are numbers (a regression target), and the loss (cross-entropy) takes class labels: train numbers with `loss = taper.loss.mse{}`"],
        },
        Case {
            name: "a label the model has no output for",
            recipe: MLP_ON_FILE,
            args: &[],
            code: 2,
            says: &[
                "recipe.lua:6: run:step: safetensors ",
                "data.safetensors",
                "sample 3 (row 1 of the batch): target 200 is out of range: the model has 10 outputs (0 to 9)",
            ],
        },
        Case {
            name: "samples with fewer features than the model takes",
            recipe: r#"local run = taper.run{
  model = taper.model.mlp{ inputs = 5, hidden = { 4 }, outputs = 10 },
  data = taper.data.safetensors{ path = "data.safetensors", scale = 1 }:batch(2),
}
for _ in run:epochs(1) do
  for batch in run:batches() do run:step(batch) end
end
"#,
            args: &[],
            code: 2,
            says: &["recipe.lua:6: run:step: ", "each sample has 2 input values (shape [2]), the model takes 5"],
        },
        Case {
            name: "a token id beyond the model's vocabulary",
            recipe: r#"local run = taper.run{
  model = taper.model.gpt{ vocab = 16, context = 4, width = 8, layers = 1, heads = 2 },
  data = taper.data.safetensors{ path = "tokens.safetensors" }:batch(2),
}
for _ in run:epochs(1) do
  for batch in run:batches() do run:step(batch) end
end
"#,
            args: &[],
            code: 2,
            says: &[
                "recipe.lua:6: run:step: ",
                "sample 2 (row 0 of the batch): token id 20 is out of range: the model's vocabulary has 16 ids (0 to 15)",
            ],
        },
        Case {
            name: "an evaluation on data the model does not fit",
            recipe: r#"local run = taper.run{
  model = taper.model.mlp{ inputs = 2, hidden = { 4 }, outputs = 10 },
}
run:evaluate(taper.data.safetensors{ path = "data.safetensors", scale = 1 }:batch(2))
"#,
            args: &[],
            code: 2,
            says: &["recipe.lua:4: run:evaluate: ", "target 200 is out of range"],
        },
        Case {
            name: "data that yields no batch",
            recipe: r#"local run = taper.run{
  model = taper.model.mlp{ inputs = 64, outputs = 10 },
  data = taper.data.digits{ split = "train" }:take(0):batch(8),
}
"#,
            args: &[],
            code: 2,
            says: &["recipe.lua:1: taper.run: option `data` yields no batch: ", "holds 0 samples"],
        },
        Case {
            name: "error() given a table",
            recipe: "local x = 1\nerror({ code = 1 })\n",
            args: &[],
            code: 1,
            says: &["recipe.lua:2: error() was given a table, not a message"],
        },
        Case {
            name: "error(nil) in an OOM policy",
            recipe: DIGITS_MLP,
            args: &["--inject-oom", "step=2,phase=forward"],
            code: 1,
            says: &["recipe.lua:5: error() was given nil, not a message"],
        },
        Case {
            name: "an image folder that is not there",
            recipe: r#"local train = taper.data.images{ path = "images/train" }
"#,
            args: &[],
            code: 2,
            // Relative to the folder taper runs in, which the message names.
            says: &[
                "recipe.lua:1: taper.data.images: images/train does not exist (relative to the current folder, ",
                "); images holds `cls`",
            ],
        },
        Case {
            name: "a val folder that lacks a class",
            recipe: r#"local train = taper.data.images{ path = "train", channels = 1 }
local val = taper.data.images{ path = "val", channels = 1 }
local run = taper.run{ model = taper.model.mlp{ inputs = 4, outputs = 2 }, data = train:batch(2) }
for _ in run:epochs(1) do for b in run:batches() do run:step(b) end end
run:evaluate(val)
"#,
            args: &[],
            code: 2,
            says: &[
                "recipe.lua:5: run:evaluate: images val (1 of 1x2x2, 1 class): val's classes (1) are not the run's (2): without `a`; label 0 is `b` in val's and `a` in the run's, so its labels would mean other classes; label it by the run's classes: taper.data.images{ path = ..., classes = train:classes() }",
                "checkpoint written",
            ],
        },
        Case {
            name: "a misspelt method of a run, reached after training",
            recipe: r#"local run = taper.run{ model = taper.model.mlp{ inputs = 64, outputs = 10 }, data = taper.data.digits{}:batch(64) }
for _ in run:epochs(1) do
  for batch in run:batches() do run:step(batch) end
  run:evalute(taper.data.digits{ split = "test" })
end
"#,
            args: &[],
            code: 2,
            says: &[
                "recipe.lua:4: a taper run has no `evalute`; did you mean `evaluate`? Its methods and fields: steps, epoch,",
                "checkpoint written",
            ],
        },
        Case {
            name: "a misspelt field of a batch",
            recipe: r#"local data = taper.data.digits{}:batch(64)
for batch in data:batches() do print(batch.sise) end
"#,
            args: &[],
            code: 2,
            says: &["recipe.lua:2: a taper batch has no `sise`; did you mean `size`?"],
        },
        Case {
            name: "a negative number of epochs",
            recipe: DIGITS_MLP,
            args: &["--set", "epochs=-1"],
            code: 2,
            says: &["recipe.lua:7: run:epochs: the number of epochs must be a whole number, 0 or more, got -1"],
        },
        Case {
            name: "a policy that skips every batch",
            recipe: DIGITS_MLP,
            args: &["--inject-oom", "step=1,phase=forward,times=1000"],
            code: 1,
            says: &["run 1 took no step: its OOM policy skipped all 23 batches it was given"],
        },
        Case {
            name: "an OOM policy stop before the first step",
            recipe: DIGITS_MLP,
            args: &["--inject-oom", "step=1,phase=forward"],
            code: 3,
            says: &["no checkpoint: the run had taken no step"],
        },
    ]
}

/// The data and the policy each case uses.
fn prepare(dir: &Path, case: &Case) -> String {
    let x: Vec<f32> = (0..8).map(|i| i as f32 / 8.0).collect();
    let le = |v: &[i64]| -> Vec<u8> { v.iter().flat_map(|e| e.to_le_bytes()).collect() };
    let file = dir.join("data.safetensors");
    match case.name {
        "a negative label in a safetensors file" => {
            samples(&file, &x, 2, &le(&[1, -3, 2, 0]), Dtype::I64)
        }
        "a NaN input in a safetensors file" => {
            let mut x = x.clone();
            x[5] = f32::NAN;
            samples(&file, &x, 2, &[1, 2, 3, 0], Dtype::U8)
        }
        "a fractional label in a safetensors file" => {
            let y: Vec<u8> = [1.0f32, 2.5, 3.0, 0.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            samples(&file, &x, 2, &y, Dtype::F32)
        }
        "two targets per sample for a model of one output"
        | "a target of three dimensions in a safetensors file" => {
            let y: Vec<u8> = [1.0f32, 2.5, 3.0, 0.5]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let xb: Vec<u8> = x[..4].iter().flat_map(|v| v.to_le_bytes()).collect();
            let shape = match case.name {
                "two targets per sample for a model of one output" => vec![2, 2],
                _ => vec![2, 1, 2],
            };
            let tensors = HashMap::from([
                ("x", TensorView::new(Dtype::F32, vec![2, 2], &xb).unwrap()),
                ("y", TensorView::new(Dtype::F32, shape, &y).unwrap()),
            ]);
            safetensors::serialize_to_file(tensors, None, &file).unwrap()
        }
        "a NaN label in a safetensors file" | "a NaN target in a safetensors file" => {
            let y: Vec<u8> = [1.0f32, 2.0, f32::NAN, 0.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            samples(&file, &x, 2, &y, Dtype::F32)
        }
        _ => samples(&file, &x, 2, &[1, 2, 3, 200], Dtype::U8),
    }
    let ids: Vec<u32> = (0..16).map(|i| if i == 9 { 20 } else { i % 16 }).collect();
    let next: Vec<u32> = ids.iter().map(|i| (i + 1) % 16).collect();
    tokens(&dir.join("tokens.safetensors"), &ids, &next, 4);
    std::fs::write(dir.join("data.csv"), "1,2,3\n4,x,6\n").unwrap();
    std::fs::write(dir.join("nan.csv"), "1,2,3\nnan,5,6\n").unwrap();
    for folder in ["images", "broken"] {
        std::fs::create_dir_all(dir.join(folder).join("cls")).unwrap();
        image::GrayImage::new(2, 2)
            .save(dir.join(folder).join("cls/a.png"))
            .unwrap();
    }
    std::fs::write(dir.join("broken/cls/b.png"), "not a PNG").unwrap();
    for class in ["train/a", "train/b", "val/b"] {
        std::fs::create_dir_all(dir.join(class)).unwrap();
        image::GrayImage::new(2, 2)
            .save(dir.join(class).join("1.png"))
            .unwrap();
    }
    let policy = match case.name {
        "error(nil) in an OOM policy" => "error(nil)",
        "a policy that skips every batch" => "\"skip\"",
        _ => "\"stop\"",
    };
    case.recipe
        .replace("return POLICY", &format!("return {policy}"))
}

#[test]
fn every_bad_input_gets_a_clear_error_and_exit_code() {
    let mut failed = Vec::new();
    for case in cases() {
        let dir = tempfile::tempdir().unwrap();
        let recipe = prepare(dir.path(), &case);
        std::fs::write(dir.path().join("recipe.lua"), recipe).unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_taper"))
            .args(["train", "recipe.lua", "--quiet", "--out", "out"])
            .args(case.args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        let missing: Vec<_> = case.says.iter().filter(|s| !err.contains(**s)).collect();
        if o.status.code() != Some(case.code) || !missing.is_empty() {
            failed.push(format!(
                "{}: exit {:?} (expected {}), missing {missing:?} in:\n{err}",
                case.name,
                o.status.code(),
                case.code
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
