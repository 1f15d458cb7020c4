-- A CNN on a folder of images, one subfolder per class, as torchvision's
-- ImageFolder reads it: DATA/train/CLASS/*.png and DATA/val/CLASS/*.png (PNG,
-- JPEG, BMP, PPM, WebP or TIFF). The default folder is 12,000 Fashion-MNIST images
-- that scripts/fetch-data.sh writes out as PNG files; point `data` at your own.
-- A folder of classes without train/ and val/ takes `holdout`: that share of
-- it, drawn at random, is the validation set.
--   bash scripts/fetch-data.sh && taper train scripts/image_folder.lua
--   taper train scripts/image_folder.lua --set data=pets --set size=64 --set channels=3
--   taper train scripts/image_folder.lua --set data=pets --set holdout=0.1   (pets/CLASS/*.jpg)
--   taper train scripts/image_folder.lua --set data=pets --set from=runs/fashion   (fine-tuning)
--   taper train scripts/image_folder.lua --set kernel=5 --set padding=0   (5x5 kernels, no padding)
--   taper train scripts/image_folder.lua --set export=fashion.onnx   (the best model, for
--     onnxruntime: input [batch, channels, size, size], pixels / 255; class names in its
--     metadata)
local cfg = taper.config{
  epochs = 3, batch = 64, lr = 2e-3, seed = 1,
  data = "data/fashion-mnist-png",
  size = 28, -- every image is resized to size x size
  channels = 1, -- 1: grey, 3: RGB
  train_samples = 0, -- when > 0: train on that many images only (a shortened run)
  augment = false, -- true: random flips and shifts of the training images
  export = "", -- a file: write the trained model there as ONNX, for onnxruntime
  holdout = 0.0, -- when > 0: DATA is one folder of classes; this share of it is the val set
  from = "", -- a run folder: start from its trained model (fine-tuning)
  standardize = false, -- true: each channel to mean 0, deviation 1 (the training images')
  kernel = 3, -- the convolutions' kernel size (5 with padding 0: the net of PyTorch's CIFAR-10 tutorial)
  padding = -1, -- zeros on each side of a convolution's input; -1: kernel // 2, which keeps the size
}

local function folder(path, opts)
  opts.path = path
  opts.size = { cfg.size, cfg.size }
  opts.channels = cfg.channels
  return taper.data.images(opts)
end

-- torchvision's RandomHorizontalFlip and RandomCrop(size, padding = 2), drawn
-- anew each epoch for each image; for photos, `resized_crop = {}` is
-- RandomResizedCrop.
local augment = cfg.augment and { flip = true, pad_crop = 2, seed = cfg.seed } or nil
local train, val
if cfg.holdout > 0 then
  -- The same seeded draw splits the folder twice: training images from the
  -- augmented reading, the held-out ones from the plain one, none in both.
  local parts = { 1 - cfg.holdout, cfg.holdout, seed = cfg.seed }
  train = folder(cfg.data, { split = "train", augment = augment }):split(parts)
  val = select(2, folder(cfg.data, { split = "val" }):split(parts))
else
  -- DATA/train/CLASS and DATA/val/CLASS (for DATA/CLASS alone: --set holdout=0.1).
  train = folder(cfg.data .. "/train", { augment = augment })
  -- Labelled by the training classes: a val folder that lacks a class still
  -- means by label 3 what training did.
  val = folder(cfg.data .. "/val", { classes = train:classes() })
end
local classes = train:classes()
if cfg.train_samples > 0 then
  -- The folder is in class order: a seeded split draws the images at random.
  train = train:split{ cfg.train_samples, #train - cfg.train_samples, seed = cfg.seed }
end
if cfg.standardize then
  -- torchvision's Normalize(mean, std), with the training images' own mean
  -- and deviation per channel; the val images are read with the same. The
  -- checkpoint keeps them, for taper classify and ONNX exports.
  train = train:standardize()
  val = val:standardize(train)
end
-- The images are decoded as batches are built: prefetch decodes ahead.
train = train:shuffle{ seed = cfg.seed }:batch(cfg.batch):prefetch(4)

-- `from`: start from a model trained before (a run folder), with a new head
-- for these classes when their number differs: fine-tuning.
local model
if cfg.from ~= "" then
  model = taper.model.cnn{ from = cfg.from, outputs = #classes }
else
  model = taper.model.cnn{
    input = { cfg.channels, cfg.size, cfg.size }, channels = { 16, 32 }, hidden = { 128 }, outputs = #classes,
    kernel = cfg.kernel, padding = cfg.padding >= 0 and cfg.padding or nil,
  }
end
local run = taper.run{
  model = model,
  optim = taper.optim.adamw{ lr = cfg.lr, weight_decay = 1e-4 },
  data = train,
  schedule = taper.schedule.warmup_cosine{
    lr = cfg.lr, warmup = 100, total = cfg.epochs * train:num_batches(), min_lr = cfg.lr / 20,
  },
  seed = cfg.seed,
}
print(("%s: %d classes (%s), %d train / %d val images, %d parameters"):format(
  cfg.data, #classes, table.concat(classes, ", "), #train, #val, run.parameters))

for epoch in run:epochs(cfg.epochs) do
  for batch in run:batches() do
    run:step(batch)
  end
  -- The model of the best val accuracy so far is kept in OUT/best.safetensors,
  -- as torchvision's transfer-learning tutorial keeps its best weights:
  -- `taper classify OUT/best.safetensors photo.jpg`.
  run:evaluate(val:batch(500), { keep_best = "accuracy" })
end

if cfg.export ~= "" then
  -- The kept best model, not the last one.
  run:export{ path = cfg.export, format = "onnx", model = "best" }
end
