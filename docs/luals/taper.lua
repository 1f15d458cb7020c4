---@meta taper
-- LuaLS annotations for the `taper` module that recipes see. Editors that use
-- lua-language-server pick them up through the `.luarc.json` at the root of
-- the repository (or add this folder to `workspace.library`).
-- Reference: docs/reference/lua-api.md.

---@class taper
---@field version string taper's version
---@field device string the device runs train on (`cpu`, `Cuda(0)`, ...)
---@field generation integer the recipe's version: 0 at start, +1 per applied reload
taper = {}

---Seconds since the host started (monotonic), for timing loops.
---@return number
function taper.clock() end

---Declares the recipe's tunables with defaults; `taper train R --set key=value`
---overrides them, typed by the default. An unknown key or a type mismatch is
---an error. Call it once per recipe.
---@generic T: table
---@param defaults T
---@return T
function taper.config(defaults) end

---@class taper.RunOptions
---@field model taper.Model required
---@field optim? taper.Optim default `taper.optim.adamw{}`
---@field data? taper.Data|taper.Generator training data for `run:batches()`
---@field loss? taper.Loss default `taper.loss.cross_entropy{}`
---@field seed? integer parameter init seed (default 0), mixed with `--seed`
---@field schedule? taper.Schedule|taper.Plugin|fun(step: integer, epoch: integer, state: table): taper.Plan?
---@field micro_batch? integer default micro-batch size (gradients accumulated; same mean gradient)
---@field on_oom? taper.Policy|taper.Plugin|fun(event: taper.OomEvent): taper.OomAction?
---@field mem_limit? string|integer memory budget, e.g. "512MiB" (soft OOM above it)
---@field state? table the initial `run.state` (kept across reloads)
---@field on_reload? fun(old_state: table): table? migrates `run.state` when this version takes over
---@field watch? boolean watch the recipe and its modules, as `--watch` does
---@field precision? "f32"|"bf16"|"f16" forward and backward type (f32 master weights; f16 adds loss scaling)
---@field recompute? boolean|integer recompute every (n-th) transformer block in the backward instead of keeping its activations
---@field offload? boolean|string keep AdamW's f32 moments out of the memory that runs out: true: host memory (pinned for a CUDA model; a removed file in the system's temporary folder for a CPU one); a folder: a memory-mapped file there
---@field checkpoint_every? integer|string save every n steps, every so long ("10m"), or "never" (default 5 minutes; --checkpoint-every overrides)
---@field keep_checkpoints? integer how many of the run's checkpoints stay in the output folder (default 2; --keep-checkpoints overrides)

---Creates a run: a model's parameters, its optimizer and its place in training.
---@param opts taper.RunOptions
---@return taper.Run
function taper.run(opts) end

---@class taper.Run
---@field steps integer optimizer steps taken
---@field epoch integer the epoch in progress, or the last one started (0 before any)
---@field parameters integer trainable parameter count
---@field precision "f32"|"bf16"|"f16" the precision forward and backward run in now (the recipe's, or an OOM policy's choice)
---@field recompute integer every how many blocks the backward recomputes now (0: none)
---@field offload boolean whether AdamW's moments are offloaded now
---@field state table the recipe's own table; survives reloads
---@field best? taper.Best the best evaluation so far (nil before an evaluation with `keep_best`)
local Run = {}

---The best evaluation of a run that keeps its best model
---(`run:evaluate(data, { keep_best = ... })`); checkpoints carry it.
---@class taper.Best
---@field metric string the score that decides (`loss`, `accuracy`, ...)
---@field split string the evaluated data's split name
---@field value number its best value
---@field step integer steps taken when it was evaluated
---@field epoch integer the epoch then
---@field evals_since integer evaluations since, none better
---@field patience? integer the `patience` last given
---@field min_delta number the `min_delta` last given (0: any improvement counts)
---@field path? string the checkpoint that holds its model (`OUT/best.safetensors`)
---@field stopped boolean whether `evals_since` reached `patience`: the run stopped early

---Iterates epoch numbers up to `n` (continuing after the resumed epoch under
---`--resume`). Ending an epoch writes an `epoch` record. Yields nothing under
---`taper check`.
---The end of each epoch is a safe point where `--watch` applies edits.
---@param n integer
---@return fun(): integer?
function Run:epochs(n) end

---A safe point inside an epoch: applies saved edits to the recipe and its
---modules now. With `wait`, waits up to that many seconds for a change.
---Returns true when this call applied a reload.
---@param opts? {wait?: number}
---@return boolean
function Run:reload_point(opts) end

---Iterates the batches of the current epoch of `data` (default: the run's
---`data`). Each epoch has its own seeded order.
---@param data? taper.Data|taper.Generator
---@return fun(): taper.Batch?
function Run:batches(data) end

---Forward, loss, backward and one optimizer update. A step whose loss is NaN or
---infinite (or, checked every 10 steps, weights that hold one) is an error: the
---training diverged, the run stops there, and its model is not saved over the
---last good checkpoint (an f16 step that the loss scaler skipped is not one).
---@param batch taper.Batch
---@return number? loss the batch's mean loss (nil when the OOM policy skipped it)
---@return integer step the step count after this update
function Run:step(batch) end

---Mean cross-entropy and accuracy over `data`, with no gradient graph. Writes an
---`eval` record. `objective` is the mean of `opts.loss` when given, or of the
---run's own loss when it is not plain cross-entropy (distillation). A run
---trained with `taper.loss.mse{}` gets the mean squared error as `loss`, and
---`rmse`, `mae` (in the target's units) and `r2` instead of `accuracy`; with
---several targets, these are the means over the targets, and `per_target` (by
---target name) holds each one's. A
---classifier of one label per sample (up to 100 classes) also gets
---`balanced_accuracy`, `macro_f1`, `per_class` (by class name, or label without names: `precision`,
---`recall`, `f1`, `support`) and `confusion` (rows: classes, columns:
---predictions, label 0 first). A multi-label classifier (`taper.loss.bce{}`)
---gets `exact_match`, `f1_micro`, `f1_macro` and `per_label`.
---With `keep_best` (a score's name: `"loss"`, `"accuracy"`, `"r2"`, ...), an
---evaluation better than every earlier one (lower for `loss`, `objective`,
---`rmse`, `mae`; higher for the others) writes the run's model to
---`OUT/best.safetensors` (`best-2.safetensors` for the recipe's second run)
---and a `best` record, and `improved` says whether it was (with `min_delta`,
---better by more than that); with `patience`,
---that many evaluations in a row without a better one stop the run early:
---`run:epochs()` and `run:batches()` give no more (an `early_stop` record),
---and a resumed run that had stopped trains no more. `model = "best"` evaluates
---the kept best model instead of the run's own (which is back afterwards; under
---`taper check`, which keeps no best, the run's own).
---@param data taper.Data|taper.Generator
---@param opts? {loss?: taper.Loss, keep_best?: string, patience?: integer, min_delta?: number, model?: "best"|"last"}
---@return {loss: number, accuracy?: number, exact_match?: number, f1_micro?: number, f1_macro?: number, per_label?: table<string, {precision: number, recall: number, f1: number, support: integer}>, improved?: boolean, balanced_accuracy?: number, macro_f1?: number, per_class?: table<string|integer, {precision: number, recall: number, f1: number, support: integer}>, confusion?: integer[][], rmse?: number, mae?: number, r2?: number, per_target?: table<string, {rmse: number, mae: number, r2: number}>, samples: integer, split: string, objective?: number}
function Run:evaluate(data, opts) end

---Writes a `log` record to metrics.jsonl (with `step` and `epoch` added) and
---prints it.
---@param fields table<string, any>
function Run:log(fields) end

---@class taper.GenerateOptions
---@field prompt? string|integer[] text (needs text data on the run) or token ids
---@field messages? {role: string, content: string}[] a chat's messages (a run on `taper.data.chat`): the reply to them, rendered with the run's chat template and ended at its end token
---@field tokens? integer how many to generate (default 200)
---@field temperature? number 0 is greedy (default 1.0)
---@field seed? integer (default 0)

---Samples a continuation from a sequence model (`taper.model.gpt`). Returns
---text for a text prompt or a chat's messages, token ids for an id prompt.
---@param opts taper.GenerateOptions
---@return string|integer[]
function Run:generate(opts) end

---Injects an OOM at step `step` (numbered from 1), `times` times in all; with
---`rank`, only on that rank of a data-parallel run (`taper launch`).
---@param opts {step: integer, phase?: "upload"|"forward"|"backward"|"accumulate"|"optimizer"|"eval", times?: integer, rank?: integer}
function Run:inject_oom(opts) end

---Magnitude pruning (as torch.nn.utils.prune.l1_unstructured, or global_unstructured
---with `scope = "global"`): zeroes the `round(sparsity * n)` smallest weights of the
---selected tensors (a Lua pattern over parameter names; default: every tensor of rank
---2 or more). The masks stay through training and in checkpoints.
---@param opts {sparsity: number, params?: string, scope?: "layer"|"global"}
---@return {pruned: integer, total: integer, sparsity: number}
function Run:prune(opts) end

---Writes the model for other tools, atomically. `format = "gguf"` (default): a GPT as
---llama.cpp's `gpt2` architecture with its tokenizer, a GGUF llama as its base file
---with the training merged in (`merge = true` says so), other models as architecture
---`taper`; weight matrices in `type` (post-training quantization), vectors f32.
---`format = "hf"`: a GPT as a transformers GPT-2 folder (model.safetensors,
---config.json, tokenizer.json). `format = "gguf-lora"`: a QLoRA run's adapters as a
---llama.cpp LoRA adapter. `format = "peft"`: the adapters as a PEFT adapter folder
---(adapter_model.safetensors, adapter_config.json). `format = "onnx"`: an MLP or CNN classifier as an ONNX
---model for onnxruntime (input `[batch, channels, height, width]` for a CNN, output
---`logits`; class names in its metadata when the data knows them).
---`format = "q8_0"` (a type) is the older spelling of `format = "gguf", type = "q8_0"`.
---`model = "best"` exports the model an evaluation with `keep_best` kept (under
---`taper check`, the run's own).
---@param opts {path: string, format?: "gguf"|"hf"|"gguf-lora"|"peft"|"onnx"|"f32"|"f16"|"q8_0"|"q4_0"|"q4_1", type?: "f32"|"f16"|"q8_0"|"q4_0"|"q4_1", merge?: boolean, model?: "best"|"last"}
---@return {bytes: integer, f32_bytes?: integer, quantized?: integer, kept_f32?: integer}
function Run:export(opts) end

---The optimizer's learning rate.
---@return number
function Run:lr() end

---Sets the learning rate for the next steps (schedules in Lua use this).
---@param lr number
function Run:set_lr(lr) end

---Writes a checkpoint (safetensors: weights, optimizer state, step, epoch),
---atomically.
---@param path string
function Run:save(path) end

---@class taper.Batch
---@field size integer samples in the batch
---@field indices integer[] sample indices (0-based, in the data's order)

---@class taper.Data
---@field split_name string the split the source reads (`train`, `test`, ...)
local Data = {}

---A new permutation of the samples every epoch, from `seed` (0 when not given;
---`--seed` is mixed in) and the epoch number. `group_by_length = true`: batches of
---samples of like lengths (a chat file's conversations), each run of 50 batches
---sorted longest first, as transformers' `group_by_length`.
---@param opts? {seed?: integer, group_by_length?: boolean}
---@return taper.Data
function Data:shuffle(opts) end

---Batches of `n` samples (the last one may be smaller unless `drop_last`).
---@param n integer|{size: integer, drop_last?: boolean}
---@return taper.Data
function Data:batch(n) end

---The first `n` samples only (before any shuffle).
---@param n integer
---@return taper.Data
function Data:take(n) end

---Drops the first `n` samples (before any shuffle).
---@param n integer
---@return taper.Data
function Data:skip(n) end

---Parts in these proportions: `local train, val = data:split{ 0.9, 0.1 }`; contiguous, or
---with `seed = n`, drawn through a fixed seeded permutation. Fractions (each below 1)
---must sum to 1; weights such as `{ 9, 1 }` are normalised.
---@param parts table proportions, and optionally `seed`
---@return taper.Data ...
function Data:split(parts) end

---Passes every batch through a transform plugin, natively, where batches
---are built (on the prefetch thread with prefetch); or through `fn(x, y)`
---(nested tables), which returns a batch table, on the main thread after
---native batching: a generator, to which the combinators no longer apply.
---@param fn taper.Plugin
---@return taper.Data
---@overload fun(self: taper.Data, fn: fun(x: number[][], y: integer[]): taper.BatchTable): taper.Generator
function Data:map(fn) end

---Samples shifted and scaled to mean 0 and deviation 1: each feature
---(population deviation, as scikit-learn's StandardScaler; a constant feature
---is only shifted), or each channel of an image folder's samples (torchvision's
---Normalize with the images' own statistics). The statistics are `from`'s
---(what it applies, when standardized itself), the given `{ mean, std }`, or
---else this data's own: `train = train:standardize()`, then
---`test = test:standardize(train)`. A regression target (a CSV or safetensors `target`) is
---standardized too, and evaluation reports errors in its units. The
---checkpoint keeps them.
---`{ target = false }`: this data's statistics, the features alone (a multi-label
---classifier's 0/1 targets stay as they are).
---@param from? taper.Data|{mean: number[], std: number[]}|{target: boolean}
---@return taper.Data
function Data:standardize(from) end

---Sets the split name reported in `eval` records.
---@param name string
---@return taper.Data
function Data:named(name) end

---Builds up to `depth` batches ahead on a background thread.
---@param depth integer
---@return taper.Data
function Data:prefetch(depth) end

---Iterates the batches of an epoch (default 1) without a run.
---@param epoch? integer
---@return fun(): taper.Batch?
function Data:batches(epoch) end

---Number of samples.
---@return integer
function Data:len() end

---Number of batches per epoch.
---@return integer
function Data:num_batches() end

---Text data: vocabulary size.
---@return integer
function Data:vocab_size() end

---Text data: characters to token ids.
---@param text string
---@return integer[]
function Data:encode(text) end

---Text data: token ids to characters.
---@param ids integer[]
---@return string
function Data:decode(ids) end

---Class names, label 0 first (`classes[label + 1]`), for data that knows them
---(an image folder, a CSV file with class names), or a CSV column of label
---sets' labels (`label_sep`); nil otherwise.
---@return string[]?
function Data:classes() end

---A CSV file's model inputs by name: each feature column's, and for a column
---of categories one per category (`sex_female`); nil for other data.
---`#data:feature_names()` is the model's `inputs`.
---@return string[]?
function Data:feature_names() end

---A CSV file's columns of categories and their categories in order,
---`{ sex = { "female", "male" } }`, as another file's `categorical` takes
---them; nil when it has none.
---@return table<string|integer, string[]>?
function Data:categories() end

taper.data = {}

---scikit-learn's 8x8 handwritten digits, built in: 64 features in [0, 1], 10 classes.
---`train` 1,437 samples, `test` 360 (every fifth), or `all`.
---@param opts? {split?: "train"|"test"|"all"}
---@return taper.Data
function taper.data.digits(opts) end

---1 MB of Shakespeare, built in, as character windows of `context` tokens
---(targets shifted by one), `stride` apart (default: `context`). With
---`tokenizer` (a `tokenizer.json`), windows of its tokens instead.
---@param opts? {split?: "train"|"val", context?: integer, stride?: integer, tokenizer?: string}
---@return taper.Data
function taper.data.shakespeare(opts) end

---@class taper.BatchTable
---@field x number[][]|integer[][] samples first; every row the same length
---@field y integer[]|integer[][]|number[]|number[][] class labels, token ids (-100: a position the loss leaves out), or (with `y_type = "f32"`) numbers to predict
---@field x_type? "f32"|"u32" `u32` for token ids (default f32)
---@field y_type? "u32"|"f32" `f32` for numbers to predict (a regression; default u32: labels or token ids)

---Batches made by Lua (`taper.data.generator`) or passed through a Lua
---function (`data:map(fn)`): a run's data, `run:batches(gen)` and
---`run:evaluate(gen)` take it. It makes its own batches, so the pipeline
---combinators (shuffle, batch, prefetch, ...) do not apply.
---@class taper.Generator
---@field split_name string the split reported in `eval` records
local Generator = {}

---Iterates the batches of an epoch (default 1) without a run.
---@param epoch? integer
---@return fun(): taper.Batch?
function Generator:batches(epoch) end

---Data made by Lua: `fn(epoch)` returns an iterator whose calls return one
---batch table each, then nil. Yield whole batches; every number crosses into Rust.
---@param fn fun(epoch: integer): (fun(): taper.BatchTable?)
---@param opts? {split?: string}
---@return taper.Generator
function taper.data.generator(fn, opts) end

---MNIST-format IDX files (gzipped or raw), pixels divided by `scale` (default 255).
---@param opts {images: string, labels: string, split?: string, scale?: number}
---@return taper.Data
function taper.data.idx(opts) end

---A CSV file (gzipped or plain; quoted cells, CRLF, a byte-order mark), one
---sample per row; or several read as one table, in order (`path` a pattern,
---`"data/train-*.csv"`, or a list of files and patterns), with the first's
---columns (`taper.data.parquet` and `taper.data.json` take them too). `label` is the label column: an index (0 the first, -1 the
---last, the default) or a header name; `features` the feature columns, in
---order (default: every other). Naming a column implies `header = true`.
---Labels are class indices, or, when any is not a number, class names
---(sorted; `data:classes()`), or the names of `classes`. `target` instead of
---`label`: a number column to predict (a regression, `taper.loss.mse{}`), or a
---list of them (`{ "body_mass_g", "flipper_length_mm" }`: a model output per
---target, in this order). Features are numbers,
---divided by `scale`. A missing value (empty, `NA`, `NaN`, `null`, ...) is an
---error naming its line and column; `missing = "drop"` leaves its row out and
---counts it. `delimiter` defaults to "," (a tab for `.tsv`); `decimal` is
---the numbers' decimal mark, "." or "," (a European spreadsheet's `2,5`,
---with `delimiter = ";"`). `categorical`
---names feature columns of categories, each one-hot encoded in place (one
---input per category: those the file holds, sorted, or the list given under
---the column's name, `{ sex = { "female", "male" } }`). `text` instead of
---`features`: a column of text, the input, each cell tokenized with
---`tokenizer` (a tokenizer.json) and its special tokens, cut at `context`
---ids (default 128) and padded with its padding token: for
---`taper.model.bert` (the header is then implied). Two columns,
---`{ "premise", "hypothesis" }`, are a text pair: `[CLS] a [SEP] b [SEP]`.
---`label_sep` ("|"): the label column holds each sample's set of labels
---(`gentoo|female`; empty: none), the 0/1 targets of `taper.loss.bce{}`, one per
---label (`classes`, or the file's, sorted: `data:classes()`). A file with a
---header whose first row holds lists, as pandas' `to_csv` writes a column of
---them (`"[0.12 -0.5 ...]"`, `"[2, 27]"`), is read as a Parquet file is: a
---list column of numbers a column a number (`embedding[0]` ...), a label
---column of lists label sets.
---@param opts {path: string|string[], label?: integer|string, target?: integer|string|(integer|string)[], features?: (integer|string)[], text?: integer|string|(integer|string)[], tokenizer?: string, context?: integer, header?: boolean, delimiter?: string, decimal?: "."|",", scale?: number, split?: string, classes?: string[], label_sep?: string, missing?: "error"|"drop", categorical?: table<integer|string, integer|string|(string|number)[]>}
---@return taper.Data
function taper.data.csv(opts) end

---A Parquet file's rows (pandas' `to_parquet`, Hugging Face datasets' files;
---snappy, zstd, gzip or lz4), read as `taper.data.csv` reads a CSV file, with
---its options but `header`, `delimiter` and `decimal` (its columns have names
---and types). A null is a missing value; a float64 column gives its values as
---f32; a label column of lists (`[2, 27]`) is a multi-label classifier's label
---sets; another column of lists of numbers, as many a row (an embedding), is a
---column a number, `embedding[0]` ... (`features = { "embedding" }` names
---them all). Errors name the row (1 the first).
---@param opts {path: string|string[], label?: integer|string, target?: integer|string|(integer|string)[], features?: (integer|string)[], text?: integer|string|(integer|string)[], tokenizer?: string, context?: integer, scale?: number, split?: string, classes?: string[], label_sep?: string, missing?: "error"|"drop", categorical?: table<integer|string, integer|string|(string|number)[]>}
---@return taper.Data
function taper.data.parquet(opts) end

---JSON records, an object a row: JSON Lines (`.jsonl`, `.ndjson`: pandas'
---`to_json(orient="records", lines=True)`, Hugging Face datasets' `to_json`)
---or one JSON array of objects (`.json`); gzipped or plain. Read as
---`taper.data.csv` reads a CSV file, with its options but `header`,
---`delimiter` and `decimal` (the keys name the columns, in the order they
---first appear). A null or an absent key is a missing value; booleans are 0
---and 1; a label column of lists (`[2, 27]`) is a multi-label classifier's
---label sets, another key's lists of numbers, as many a row (an embedding),
---a column a number (`embedding[0]` ...). Errors name the line (an array's records: their place, 1 the
---first).
---@param opts {path: string|string[], label?: integer|string, target?: integer|string|(integer|string)[], features?: (integer|string)[], text?: integer|string|(integer|string)[], tokenizer?: string, context?: integer, scale?: number, split?: string, classes?: string[], label_sep?: string, missing?: "error"|"drop", categorical?: table<integer|string, integer|string|(string|number)[]>}
---@return taper.Data
function taper.data.json(opts) end

---A UTF-8 text file as token windows: its characters, or the ids of `tokenizer`
---(a tokenizer.json); `val_fraction` of the end is `val`.
---@param opts {path: string, tokenizer?: string, split?: "train"|"val"|"all", context?: integer, stride?: integer, val_fraction?: number}
---@return taper.Data
function taper.data.text(opts) end

---Conversations to fine-tune a chat model on: a JSON Lines file, one per line, in
---TRL's formats (`{"messages": [{"role": "user", "content": ...}, ...]}`, or a
---`prompt` and its `completion` as lists of messages). Each is rendered with the
---chat `template` (a GGUF model's, a tokenizer_config.json's, or a .jinja file), as
---transformers' apply_chat_template renders it, and tokenized whole; one sample of
---`context` positions (default 512) each, cut or padded. The loss learns the replies
---(`train_on = "assistant"`: the assistant's messages, or the completion) or every
---token (`"all"`); the other positions are ignored.
---@param opts {path: string, tokenizer: string, template: string, context?: integer, split?: string, train_on?: "assistant"|"all"}
---@return taper.Data
function taper.data.chat(opts) end

---A folder of images, one subfolder per class (torchvision's ImageFolder layout):
---classes in sorted order, pixels channel first divided by `scale` (default 255).
---`size` ({height, width}) resizes every image (bilinear, as PIL); `channels` is 3
---(RGB) or 1 (grey); `split` defaults to the folder's name. `augment` draws, per
---epoch and image, torchvision's RandomResizedCrop (`resized_crop`, needs `size`),
---RandomCrop with zero padding (`pad_crop = n`) and RandomHorizontalFlip (`flip`).
---`classes` (as `train:classes()`) labels the folder by those names: a validation
---folder that lacks a class keeps the training labels.
---@param opts {path: string, size?: integer[], channels?: 1|3, scale?: number, split?: string, classes?: string[], augment?: {flip?: boolean, pad_crop?: integer, resized_crop?: {scale?: number[], ratio?: number[]}, seed?: integer}}
---@return taper.Data
function taper.data.images(opts) end

---A safetensors file of samples: tensors `x` and `y` (default names), sample first.
---`target` instead of `y` names a tensor of numbers to predict (`[n]`, one per
---sample, or `[n, k]`, k targets), for `taper.loss.mse{}`.
---@param opts {path: string, x?: string, y?: string, target?: string, scale?: number, split?: string}
---@return taper.Data
function taper.data.safetensors(opts) end

---NumPy arrays: `path` an .npz archive (np.savez, np.savez_compressed) whose arrays
---`x` and `y` (default names) are the inputs and the targets; without `path`, `x`
---and `y` are .npy files (np.save). `target` instead of `y` names numbers to
---predict (`[n]` or `[n, k]`), for `taper.loss.mse{}`.
---@param opts {path?: string, x?: string, y?: string, target?: string, scale?: number, split?: string}
---@return taper.Data
function taper.data.numpy(opts) end

---A memory-mapped file of little-endian u16/u32 token ids, as windows.
---@param opts {path: string, dtype?: "u16"|"u32", context?: integer, stride?: integer, split?: string}
---@return taper.Data
function taper.data.tokens(opts) end

---@class taper.Model
local Model = {}
---@return integer
function Model:parameters() end
---@return string
function Model:describe() end

---@alias taper.Activation "relu"|"gelu"|"tanh"|"silu"

taper.model = {}

---A multi-layer perceptron; shaped samples are read flat. `{from = RUN, outputs?, dropout?}`: the model a run trained, from its
---checkpoint, with a new head when `outputs` differs (fine-tuning). `dropout` (default 0, or
---the checkpoint's): after each hidden activation, in training; a reload or resume may change it.
---@param opts {inputs?: integer, hidden?: integer[], outputs?: integer, activation?: taper.Activation, dropout?: number, from?: string}
---@return taper.Model
function taper.model.mlp(opts) end

---Convolutions (`kernel` x `kernel`, default 3, stride 1, `padding` zeros on each side, default
---`kernel // 2`; then activation and 2x2 max-pool) and a dense head. PyTorch's `Conv2d(c, o, 5)`
---is `kernel = 5, padding = 0`. `pool` (one boolean per entry of `channels`, default all true):
---which convolutions a max-pool follows (PyTorch's MNIST example: `{false, true}`). `input` is `{channels, height, width}`; flat samples are reshaped to it (channels-last
---samples, `[n, H, W, C]`, are refused: transpose them).
---`{from = RUN, outputs?, dropout?}`: the model a run trained, from its checkpoint, with a new
---head when `outputs` differs (fine-tuning). `dropout` (default 0, or the checkpoint's):
---before each dense layer, in training: one rate, or a list of one a layer (the flattened
---features first: PyTorch's MNIST example is `{0.25, 0.5}`); a reload or resume may change it.
---@param opts {input?: integer[], channels?: integer[], hidden?: integer[], outputs?: integer, activation?: taper.Activation, dropout?: number|number[], kernel?: integer, padding?: integer, pool?: boolean[], from?: string}
---@return taper.Model
function taper.model.cnn(opts) end

---A GPT-2 style causal language model (pre-norm, learned positions, tied embeddings).
---With `from` (a transformers GPT-2 folder, or its model.safetensors with config.json
---beside it; shards are read through model.safetensors.index.json), the architecture comes from its config.json and the run starts from its
---weights; only `context` (to keep the first positions) and `dropout` may be given too.
---`dropout` (default 0; with `from`, the config's) drops out the embeddings' sum, the
---attention weights and each block's outputs in training, as GPT-2 and nanoGPT do.
---@param opts {vocab?: integer, context?: integer, width?: integer, layers?: integer, heads?: integer, mlp?: integer, dropout?: number, from?: string}
---@return taper.Model
function taper.model.gpt(opts) end

---A llama-architecture GGUF model (e.g. SmolLM2) with frozen quantized weights and
---trainable low-rank adapters (QLoRA). `lora_dropout` (default 0) drops out each
---adapter's input in training, as PEFT's.
---@param opts {path: string, lora_rank?: integer, lora_alpha?: number, lora_targets?: string[], lora_dropout?: number, layers?: integer, context?: integer, base?: "q8_0"|"q4_0"|"q4_1"|"f16", train?: "lora"|"full"}
---@return taper.Model
function taper.model.llama_gguf(opts) end

---A transformers BERT (its folder: config.json and model.safetensors, or shards and
---model.safetensors.index.json; MiniLM,
---bert-base, or a BertForSequenceClassification) with a classification head of
---`outputs` (new unless the file's has as many), computed as transformers'
---BertForSequenceClassification: the `[CLS]` position through the pooler and the
---head; padding (the config's `pad_token_id`) is masked. Every weight is trained.
---`context` keeps the first positions (default: the config's). Training applies
---dropout at the config's rates (`hidden_dropout_prob`, `attention_probs_dropout_prob`,
---`classifier_dropout`; transformers' 0.1 where it says none); `dropout` sets every
---site's rate, `attention_dropout` and `classifier_dropout` one site's. Evaluation and
---`taper classify` apply none. A DistilBERT or RoBERTa (XLM-RoBERTa) folder is
---computed as its own transformers classifier (DistilBertForSequenceClassification,
---RobertaForSequenceClassification) and exported as one.
---@param opts {from: string, outputs: integer, context?: integer, dropout?: number, attention_dropout?: number, classifier_dropout?: number}
---@return taper.Model
function taper.model.bert(opts) end

---@class taper.Optim

taper.optim = {}

---AdamW with PyTorch's semantics and defaults.
---`state = "8bit"` keeps the moments of parameters with at least 4096 elements
---in blockwise 8-bit form (bitsandbytes' AdamW8bit): 2 bytes per parameter instead of 8.
---@param opts? {lr?: number, betas?: number[], eps?: number, weight_decay?: number, clip_grad_norm?: number, state?: "f32"|"8bit"}
---@return taper.Optim
function taper.optim.adamw(opts) end

---SGD with PyTorch's semantics and defaults.
---@param opts? {lr?: number, momentum?: number, dampening?: number, nesterov?: boolean, weight_decay?: number, clip_grad_norm?: number}
---@return taper.Optim
function taper.optim.sgd(opts) end

---@class taper.Plan
---@field lr? number learning rate for this step
---@field micro_batch? integer samples per micro-batch for this step
---@field batch_size? integer samples in this step's batch (a batch-size schedule)

---@class taper.Schedule
local Schedule = {}

---The plan a schedule gives for `step` (0-based) in `epoch` (default 1).
---@param step integer
---@param epoch? integer
---@return taper.Plan
function Schedule:plan(step, epoch) end

taper.schedule = {}

---The same plan every step.
---@param opts {lr?: number, micro_batch?: integer}
---@return taper.Schedule
function taper.schedule.constant(opts) end

---Linear warmup to `lr` over `warmup` steps, then cosine decay to `min_lr` at `total`.
---@param opts {lr: number, warmup?: integer, total: integer, min_lr?: number, micro_batch?: integer}
---@return taper.Schedule
function taper.schedule.warmup_cosine(opts) end

---The batch size grows linearly from `from` to `to` over `steps` steps.
---@param opts {from: integer, to: integer, steps: integer, multiple?: integer, lr?: number, micro_batch?: integer}
---@return taper.Schedule
function taper.schedule.batch_ramp(opts) end

---`lr * gamma ^ floor(step / every)` (or finished epochs, with `per_epoch`).
---@param opts {lr: number, every: integer, gamma: number, per_epoch?: boolean, micro_batch?: integer}
---@return taper.Schedule
function taper.schedule.step(opts) end

---@class taper.OomEvent
---@field phase "upload"|"forward"|"backward"|"accumulate"|"optimizer"|"eval"
---@field cause "device"|"budget"|"injected"
---@field step integer
---@field epoch integer
---@field batch_size integer
---@field micro_batch integer
---@field attempt integer
---@field precision "f32"|"bf16"|"f16" the run's precision when it ran out of memory
---@field recompute integer every how many blocks the backward recomputed (0: none)
---@field offload boolean whether AdamW's moments were offloaded
---@field live {name: string, part: string, bytes: integer}[] the largest tensors the run holds, largest first
---@field live_bytes integer bytes of all the tensors the run holds
---@field ranks? integer[] in a data-parallel run, the ranks that ran out (the figures are the first one's)
---@field error string
---@field requested integer? bytes the failed allocation asked for, when known
---@field memory {used: integer, peak: integer?, limit: integer?, free: integer?, total: integer?, pool_reserved: integer?, pool_used: integer?} heap {used, peak, limit} on the CPU; device {used, free, total, pool_reserved, pool_used} on a GPU

---@alias taper.OomAction "split"|"retry"|"skip"|"stop"|"recompute"|"offload"|{action: "split"|"retry"|"skip"|"stop"|"precision"|"recompute"|"offload", micro_batch?: integer, precision?: "f32"|"bf16"|"f16", every?: integer, reason?: string}

---@class taper.Policy
---@field on_oom fun(self: taper.Policy, event: taper.OomEvent): taper.OomAction?
---@field on_step? fun(self: taper.Policy, info: {step: integer, micro_batch: integer, batch_size: integer, clean_steps: integer, peak: integer?, limit: integer?}): {micro_batch: integer}?

taper.policy = {}

---Halve the micro-batch; at `min_micro`, stop (with a checkpoint).
---@param opts? {min_micro?: integer}
---@return taper.Policy
function taper.policy.split_then_stop(opts) end

---Halve and keep the smaller size; stop after `max_attempts` OOMs on one step.
---@param opts? {max_attempts?: integer}
---@return taper.Policy
function taper.policy.composer_like(opts) end

---Halve on OOM; after `after` clean steps grow back, never to the size that failed.
---@param opts? {after?: integer, margin?: number}
---@return taper.Policy
function taper.policy.grow_back(opts) end

---Escalate, cheapest first: split down to `min_micro`, then recompute every block
---(a GPT), then switch to `precision` (default bf16; false to stay), then stop; grow
---the micro-batch back after `after` clean steps, never to a size that failed.
---@param opts? {min_micro?: integer, after?: integer, recompute?: boolean, offload?: boolean, precision?: "bf16"|"f16"|false}
---@return taper.Policy
function taper.policy.escalate(opts) end

---Ask each policy in turn; the first non-nil answer decides.
---@param policies (taper.Policy|fun(event: taper.OomEvent): taper.OomAction?)[]
---@return taper.Policy
function taper.policy.chain(policies) end

---@class taper.Loss

taper.loss = {}

---Cross-entropy over the last dimension, with optional label smoothing. `chunk = n`
---(GPT models; a GGUF llama on the CPU) fuses the head with the loss, n positions at a time
---(no full logits).
---`weight`: class weights (PyTorch's `weight=`): one number per class (label 0
---first), numbers by class name (others weigh 1), or "balanced"
---(n / (k * count) over the run's training data, as scikit-learn). The mean
---divides by the batch's weight sum, whatever the micro-batch split.
---@param opts? {label_smoothing?: number, chunk?: integer, weight?: number[]|table<string, number>|"balanced"}
---@return taper.Loss
function taper.loss.cross_entropy(opts) end

---The mean squared error (torch.nn.MSELoss), for a regression: one output per
---target value, against number targets (a CSV or safetensors file's `target`). Evaluation
---reports `rmse`, `mae` (in the target's units) and `r2` instead of `accuracy`
---(several targets: each target's in `per_target`, and their means).
---@param opts? {}
---@return taper.Loss
function taper.loss.mse(opts) end

---Multi-label classification: each output a label's yes or no, against 0/1 targets (a
---CSV file's `target = { ... }` columns), through the binary cross-entropy on the
---logits (torch.nn.BCEWithLogitsLoss, mean). `pos_weight` weighs each label's positives
---(one number, or one per label). Evaluation reports `accuracy` (of the label
---decisions), `exact_match`, `f1_micro`, `f1_macro` and `per_label`.
---@param opts? {pos_weight?: number|number[]}
---@return taper.Loss
function taper.loss.bce(opts) end

---Knowledge distillation from a teacher run (frozen as it is now):
---`alpha * T^2 * KL(softmax(teacher/T) || softmax(student/T)) + (1 - alpha) * cross_entropy`.
---@param opts {teacher: taper.Run, temperature?: number, alpha?: number, label_smoothing?: number}
---@return taper.Loss
function taper.loss.distill(opts) end

---A native strategy plugin (a shared library; see plugins/README.md).
---@class taper.Plugin
---@field name string
---@field version string
---@field kinds string[] the slots it fills: `on_oom`, `schedule`, `transform`
local Plugin = {}

---Its OOM policy, called as a Lua policy would be (e.g. from taper.policy.chain).
---@param event taper.OomEvent
---@return taper.OomAction?
function Plugin:on_oom(event) end

---Its growth hook after a clean step (nil when it has none).
---@param info {step: integer, micro_batch: integer, batch_size: integer, clean_steps: integer}
---@return {micro_batch: integer}?
function Plugin:on_step(info) end

---Its schedule's plan for a step.
---@param step integer
---@param epoch? integer
---@return taper.Plan
function Plugin:plan(step, epoch) end

taper.plugin = {}

---Loads a plugin library (never unloaded; a changed file is loaded as a copy)
---and creates an instance with `options` (passed to it as JSON). Errors say
---which check failed: missing file, not a library, no taper entry symbol, ABI
---version, or the plugin's own `create` message.
---@param path string
---@param options? table
---@return taper.Plugin
function taper.plugin.load(path, options) end

return taper
