-- Magnitude pruning on the digits MLP: train dense, then prune to each
-- target sparsity in turn and fine-tune with the masks kept (pruned weights
-- stay zero through every later update). Prints the held-out accuracy at
-- each sparsity.
--   taper train scripts/digits_prune.lua
--   taper train scripts/digits_prune.lua --set scope=global --set finetune=10
local cfg = taper.config{
  epochs = 20, finetune = 5, batch = 32, lr = 3e-3, seed = 1,
  sparsities = "0.5,0.8", scope = "layer",
}

local train = taper.data.digits{ split = "train" }:shuffle{ seed = cfg.seed }:batch(cfg.batch)
local test = taper.data.digits{ split = "test" }:batch(256)

local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 128, 64 }, outputs = 10 },
  optim = taper.optim.adamw{ lr = cfg.lr, weight_decay = 1e-4 },
  data = train,
  seed = cfg.seed,
}

-- run:epochs(n) counts up to epoch n (so that --resume continues), so each
-- phase trains up to a later epoch.
local function fit_to(epoch)
  for _ in run:epochs(epoch) do
    for batch in run:batches() do run:step(batch) end
  end
end

fit_to(cfg.epochs)
local dense = run:evaluate(test)
results = { { sparsity = 0, accuracy = dense.accuracy } }

-- A reload or a resume runs this top level again, from the start: `run.state`
-- (kept through both) records which phases have pruned, so each prunes once.
run.state.pruned = run.state.pruned or 0
local last, phase = cfg.epochs, 0
for s in cfg.sparsities:gmatch("[^,]+") do
  phase = phase + 1
  local sparsity = tonumber(s)
  if run.state.pruned < phase then
    sparsity = run:prune{ sparsity = sparsity, scope = cfg.scope }.sparsity
    run.state.pruned = phase
    run.state.before = run:evaluate(test).accuracy
  end
  last = last + cfg.finetune
  fit_to(last)
  local after = run:evaluate(test).accuracy
  results[#results + 1] = { sparsity = sparsity, accuracy = after }
  print(("sparsity %.0f%%: %.2f%% right after pruning, %.2f%% after %d fine-tuning epochs")
    :format(sparsity * 100, run.state.before * 100, after * 100, cfg.finetune))
end
