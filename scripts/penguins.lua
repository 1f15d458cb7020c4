-- An MLP on a table: the Palmer penguins (344 birds, 3 species), read from
-- the CSV file as pandas writes it. Columns are chosen by their header
-- names, the species names become classes (sorted: Adelie, Chinstrap,
-- Gentoo), the two rows with missing measurements are left out (and
-- counted), and each feature is standardized with the training part's mean
-- and deviation, as scikit-learn's StandardScaler. Well under a second.
--   bash scripts/fetch-data.sh && taper train scripts/penguins.lua
local cfg = taper.config{
  epochs = 60, batch = 16, lr = 3e-3, seed = 1,
  path = "data/penguins/penguins.csv",
}

local birds = taper.data.csv{
  path = cfg.path,
  label = "species",
  features = { "bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g" },
  missing = "drop",
}
-- The file is sorted by species: split through a seeded permutation.
local train, test = birds:split{ 0.8, 0.2, seed = cfg.seed }
train = train:named("train"):standardize()
test = test:named("test"):standardize(train) -- the training part's statistics
print(("penguins: %d train / %d test rows; classes %s"):format(
  #train, #test, table.concat(birds:classes(), ", ")))

local run = taper.run{
  model = taper.model.mlp{ inputs = 4, hidden = { 32 }, outputs = #birds:classes() },
  optim = taper.optim.adamw{ lr = cfg.lr, weight_decay = 1e-4 },
  data = train:shuffle{ seed = cfg.seed }:batch(cfg.batch),
  -- Chinstraps are a fifth of the birds: each species' samples weigh
  -- n / (3 * count), scikit-learn's class_weight="balanced", so that a rarer
  -- species counts as much in the loss. Evaluation's balanced accuracy and
  -- macro F1 say how each species fares (on these well-separated species
  -- the weights change no prediction; on rarer, overlapping classes they do).
  loss = taper.loss.cross_entropy{ weight = "balanced" },
  seed = cfg.seed,
}

for epoch in run:epochs(cfg.epochs) do
  for batch in run:batches() do
    run:step(batch)
  end
  if epoch % 20 == 0 then
    run:evaluate(test)
  end
end
