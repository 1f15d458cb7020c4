-- A small CNN on the built-in 8x8 digits: two 3x3 conv + 2x2 max-pool stages,
-- then a dense head. A few seconds on a 2-core CPU.
--   taper train scripts/digits_cnn.lua
local cfg = taper.config{ epochs = 15, batch = 32, lr = 3e-3, seed = 1, precision = "f32" }

local train = taper.data.digits{ split = "train" }:shuffle{ seed = cfg.seed }:batch(cfg.batch)
local test = taper.data.digits{ split = "test" }

local run = taper.run{
  model = taper.model.cnn{ input = { 1, 8, 8 }, channels = { 16, 32 }, hidden = { 64 }, outputs = 10 },
  optim = taper.optim.adamw{ lr = cfg.lr, weight_decay = 1e-4 },
  data = train,
  seed = cfg.seed,
  precision = cfg.precision,
}

for epoch in run:epochs(cfg.epochs) do
  for batch in run:batches() do
    run:step(batch)
  end
  if epoch % 5 == 0 or epoch == cfg.epochs then
    local ev = run:evaluate(test)
    run:log{ note = "held-out", accuracy = ev.accuracy }
  end
end
