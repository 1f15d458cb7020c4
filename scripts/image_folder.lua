-- A CNN on a folder of images, one subfolder per class, as torchvision's
-- ImageFolder reads it: DATA/train/CLASS/*.png and DATA/val/CLASS/*.png (PNG,
-- JPEG, BMP, PPM or WebP). The default folder is 12,000 Fashion-MNIST images
-- that scripts/fetch-data.sh writes out as PNG files; point `data` at your own.
--   bash scripts/fetch-data.sh && taper train scripts/image_folder.lua
--   taper train scripts/image_folder.lua --set data=pets --set size=64 --set channels=3
--   taper train scripts/image_folder.lua --set export=fashion.onnx   (for onnxruntime:
--     input [batch, channels, size, size], pixels / 255; class names in its metadata)
local cfg = taper.config{
  epochs = 3, batch = 64, lr = 2e-3, seed = 1,
  data = "data/fashion-mnist-png",
  size = 28, -- every image is resized to size x size
  channels = 1, -- 1: grey, 3: RGB
  train_samples = 0, -- when > 0: train on that many images only (a shortened run)
  augment = false, -- true: random flips and shifts of the training images
  export = "", -- a file: write the trained model there as ONNX, for onnxruntime
}

local function folder(split, opts)
  opts.path = cfg.data .. "/" .. split
  opts.size = { cfg.size, cfg.size }
  opts.channels = cfg.channels
  return taper.data.images(opts)
end

-- torchvision's RandomHorizontalFlip and RandomCrop(size, padding = 2), drawn
-- anew each epoch for each image; for photos, `resized_crop = {}` is
-- RandomResizedCrop.
local train = folder("train", { augment = cfg.augment and { flip = true, pad_crop = 2, seed = cfg.seed } or nil })
local classes = train:classes()
-- Labelled by the training classes: a val folder that lacks a class still
-- means by label 3 what training did.
local val = folder("val", { classes = classes })
if cfg.train_samples > 0 then
  -- The folder is in class order: a seeded split draws the images at random.
  train = train:split{ cfg.train_samples, #train - cfg.train_samples, seed = cfg.seed }
end
-- The images are decoded as batches are built: prefetch decodes ahead.
train = train:shuffle{ seed = cfg.seed }:batch(cfg.batch):prefetch(4)

local run = taper.run{
  model = taper.model.cnn{
    input = { cfg.channels, cfg.size, cfg.size }, channels = { 16, 32 }, hidden = { 128 }, outputs = #classes,
  },
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
  run:evaluate(val:batch(500))
end

if cfg.export ~= "" then
  run:export{ path = cfg.export, format = "onnx" }
end
