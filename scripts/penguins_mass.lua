-- Regression on a table: a penguin's body mass in grams from its species,
-- its sex and its bill and flipper measurements (the Palmer penguins CSV
-- file, as pandas writes it). `target` names the number column to predict;
-- `categorical` one-hot encodes the columns of names (an input per species
-- and per sex, as pandas' get_dummies); `standardize()` scales the numbers
-- and the target with the training part's mean and deviation (as
-- scikit-learn's StandardScaler, and its TransformedTargetRegressor for the
-- target), the model has one output, and the loss is the mean squared error.
-- Evaluation gives the errors back in grams: RMSE, MAE, and R². Well under a
-- second.
--   bash scripts/fetch-data.sh && taper train scripts/penguins_mass.lua
local cfg = taper.config{
  epochs = 80, batch = 16, lr = 3e-3, seed = 1,
  path = "data/penguins/penguins.csv",
}

local birds = taper.data.csv{
  path = cfg.path,
  target = "body_mass_g",
  features = { "species", "sex", "bill_length_mm", "bill_depth_mm", "flipper_length_mm" },
  categorical = { "species", "sex" },
  missing = "drop", -- 11 birds: 9 whose sex is not recorded, 2 not measured
}
-- The file is sorted by species: split through a seeded permutation.
local train, test = birds:split{ 0.8, 0.2, seed = cfg.seed }
train = train:named("train"):standardize()
test = test:named("test"):standardize(train) -- the training part's statistics
print(("penguins: %d train / %d test rows; inputs %s"):format(
  #train, #test, table.concat(birds:feature_names(), ", ")))

local run = taper.run{
  model = taper.model.mlp{ inputs = #birds:feature_names(), hidden = { 32 }, outputs = 1 },
  optim = taper.optim.adamw{ lr = cfg.lr, weight_decay = 1e-4 },
  loss = taper.loss.mse{},
  data = train:shuffle{ seed = cfg.seed }:batch(cfg.batch),
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
