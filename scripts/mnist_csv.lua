-- An MLP on 5,000 real MNIST digits from a CSV file (784 pixels, then the
-- label), split 80/20 into train and test. scripts/fetch-data.sh puts the
-- file in data/mnist/. A few seconds on a 2-core CPU.
--   bash scripts/fetch-data.sh && taper train scripts/mnist_csv.lua
local cfg = taper.config{ epochs = 10, batch = 64, lr = 2e-3, seed = 1, path = "data/mnist/mnist_5k.csv.gz", precision = "f32" }

local all = taper.data.csv{ path = cfg.path, label = -1, scale = 255 }
-- The file is sorted by class: split through a seeded permutation.
local train, test = all:split{ 0.8, 0.2, seed = cfg.seed }
train = train:named("train"):shuffle{ seed = cfg.seed }:batch(cfg.batch)
test = test:named("test")

local run = taper.run{
  model = taper.model.mlp{ inputs = 784, hidden = { 256 }, outputs = 10 },
  optim = taper.optim.adamw{ lr = cfg.lr, weight_decay = 1e-4 },
  data = train,
  seed = cfg.seed,
  precision = cfg.precision,
}
print(("mnist 5k: %d train / %d test rows"):format(#train, #test))

for epoch in run:epochs(cfg.epochs) do
  for batch in run:batches() do
    run:step(batch)
  end
  if epoch % 5 == 0 or epoch == cfg.epochs then
    run:evaluate(test)
  end
end
