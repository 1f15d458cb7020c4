-- The default recipe: an MLP on scikit-learn's 8x8 handwritten digits (built
-- into taper). About a second on a 2-core CPU; about 98% held-out accuracy.
--   taper train scripts/digits.lua
--   taper train scripts/digits.lua --set epochs=5 --set lr=1e-3
--   taper train scripts/digits.lua --set optim_state=8bit   (8-bit AdamW moments)
--   taper train scripts/digits.lua --set precision=bf16     (or f16: loss scaling)
--   taper train scripts/digits.lua --set dropout=0.2        (dropout after each hidden layer)
local cfg = taper.config{
  epochs = 30, batch = 32, lr = 3e-3, weight_decay = 1e-4, seed = 1,
  optim_state = "f32", precision = "f32",
  -- after each hidden layer, in training: 0.2 lowers the held-out loss to
  -- 0.077 / 0.055 / 0.066 from 0.089 / 0.084 / 0.068 (seeds 1-3), accuracy
  -- 97.78 / 98.33 / 98.06% from 97.78 / 98.06 / 97.78%
  dropout = 0.0,
}

local train = taper.data.digits{ split = "train" }:shuffle{ seed = cfg.seed }:batch(cfg.batch)
local test = taper.data.digits{ split = "test" }:batch(256)

local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 128, 64 }, outputs = 10, dropout = cfg.dropout },
  optim = taper.optim.adamw{ lr = cfg.lr, weight_decay = cfg.weight_decay, state = cfg.optim_state },
  data = train,
  seed = cfg.seed,
  precision = cfg.precision,
}
print(("digits: %d train / %d test samples, %d parameters"):format(#train, #test, run.parameters))

for epoch in run:epochs(cfg.epochs) do
  for batch in run:batches() do
    run:step(batch)
  end
  if epoch % 5 == 0 or epoch == cfg.epochs then
    run:evaluate(test)
  end
end
