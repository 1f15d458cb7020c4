-- A CNN on Fashion-MNIST (60,000 + 10,000 images at 28x28), read from the IDX
-- files that scripts/fetch-data.sh puts in data/fashion-mnist/.
--   bash scripts/fetch-data.sh && taper train scripts/fashion_mnist.lua
local cfg = taper.config{
  epochs = 2, batch = 64, lr = 2e-3, seed = 1,
  train_samples = 0, -- when > 0: train on the first n images only (a shortened run)
  data = "data/fashion-mnist",
  precision = "f32", -- or bf16, f16 (see docs/reference/lua-api.md, Mixed precision)
  net = "small", -- or "pytorch": the net of PyTorch's MNIST example (below)
}

local nets = {
  small = { input = { 1, 28, 28 }, channels = { 16, 32 }, hidden = { 128 }, outputs = 10 },
  -- PyTorch's MNIST example (pytorch/examples, mnist/main.py): two 3x3 convolutions without
  -- padding, one max-pool after the second, 1,199,882 parameters; dropout 0.25 on the pooled
  -- features and 0.5 after the dense layer's activation.
  pytorch = {
    input = { 1, 28, 28 }, channels = { 32, 64 }, padding = 0, pool = { false, true },
    hidden = { 128 }, outputs = 10, dropout = { 0.25, 0.5 },
  },
}
local net = nets[cfg.net] or error(("net = %q: use \"small\" or \"pytorch\""):format(cfg.net))

local function split(name)
  return taper.data.idx{
    images = cfg.data .. "/" .. name .. "-images-idx3-ubyte.gz",
    labels = cfg.data .. "/" .. name .. "-labels-idx1-ubyte.gz",
    split = name == "train" and "train" or "test",
  }
end

local train = split("train")
if cfg.train_samples > 0 then train = train:take(cfg.train_samples) end
train = train:shuffle{ seed = cfg.seed }:batch(cfg.batch):prefetch(4)
local test = split("t10k"):batch(500)

local run = taper.run{
  model = taper.model.cnn(net),
  optim = taper.optim.adamw{ lr = cfg.lr, weight_decay = 1e-4 },
  data = train,
  schedule = taper.schedule.warmup_cosine{
    lr = cfg.lr, warmup = 100, total = cfg.epochs * train:num_batches(), min_lr = cfg.lr / 20,
  },
  seed = cfg.seed,
  precision = cfg.precision,
}
print(("fashion-mnist: %d train / %d test images, %d parameters"):format(#train, #test, run.parameters))

for epoch in run:epochs(cfg.epochs) do
  for batch in run:batches() do
    run:step(batch)
  end
  run:evaluate(test)
end
