-- A character-level GPT on 1 MB of Shakespeare (built into taper), with a
-- learning-rate warmup and cosine decay written in Lua. A few minutes on a
-- 2-core CPU; prints a generated sample at the end.
--   taper train scripts/shakespeare.lua
--   taper train scripts/shakespeare.lua --set steps=100 --set sample=0   (a short run)
local cfg = taper.config{
  epochs = 3, batch = 32, context = 64, lr = 6e-3,
  steps = 0, -- when > 0: the number of batches per epoch (a shortened run)
  width = 64, layers = 2, heads = 4, seed = 1,
  sample = 300, temperature = 0.8,
  precision = "f32", -- or bf16, f16 (see docs/reference/lua-api.md, Mixed precision)
  val_windows = 512, val_batch = 64, -- held-out windows evaluated, and per batch
  micro_batch = 0, -- when > 0: forward and backward this many windows at a time (same gradient)
}

local train = taper.data.shakespeare{ split = "train", context = cfg.context }
if cfg.steps > 0 then train = train:take(cfg.steps * cfg.batch) end
train = train:shuffle{ seed = cfg.seed }:batch(cfg.batch)
-- A fixed slice of the held-out text keeps evaluation quick. An evaluation
-- batch that does not fit is evaluated in smaller pieces (an OOM in `eval`).
local val = taper.data.shakespeare{ split = "val", context = cfg.context }
  :take(cfg.val_windows):batch(cfg.val_batch)

-- Linear warmup, then cosine decay to a tenth of the peak: a schedule written
-- in Lua (taper.schedule.warmup_cosine{} is the built-in equivalent).
local total = cfg.epochs * train:num_batches()
local warmup = math.max(1, math.min(100, total // 10))
local function lr_at(step)
  if step < warmup then return cfg.lr * (step + 1) / warmup end
  local progress = (step - warmup) / math.max(1, total - warmup)
  return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
end

local run = taper.run{
  model = taper.model.gpt{
    vocab = train:vocab_size(), context = cfg.context,
    width = cfg.width, layers = cfg.layers, heads = cfg.heads,
  },
  optim = taper.optim.adamw{ lr = cfg.lr, weight_decay = 0.1, clip_grad_norm = 1.0 },
  data = train,
  schedule = function(step) return { lr = lr_at(step) } end,
  seed = cfg.seed,
  precision = cfg.precision,
  micro_batch = cfg.micro_batch > 0 and cfg.micro_batch or nil,
}
print(("shakespeare: %d windows of %d characters, vocabulary %d, %d parameters")
  :format(#train, cfg.context, train:vocab_size(), run.parameters))

for epoch in run:epochs(cfg.epochs) do
  for batch in run:batches() do
    run:step(batch)
  end
  run:evaluate(val)
end

if cfg.sample > 0 then
  print(run:generate{ prompt = "ROMEO:\n", tokens = cfg.sample, temperature = cfg.temperature, seed = cfg.seed })
end
