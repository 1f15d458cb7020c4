-- Regression of two targets: a penguin's body mass (grams) and flipper
-- length (millimetres) from its species, its sex and its bill. `target`
-- lists the number columns to predict, and the model has an output per
-- target, in that order. `standardize()` scales each target with its own
-- mean and deviation, so the mean squared error weighs grams and
-- millimetres alike, and evaluation gives each target's errors back in its
-- own units: RMSE, MAE and R² per target (`per_target`), and their means.
-- Well under a second.
--   bash scripts/fetch-data.sh && taper train scripts/penguins_size.lua
local cfg = taper.config{
  epochs = 80, batch = 16, lr = 3e-3, seed = 1,
  path = "data/penguins/penguins.csv",
}

local birds = taper.data.csv{
  path = cfg.path,
  target = { "body_mass_g", "flipper_length_mm" },
  features = { "species", "sex", "bill_length_mm", "bill_depth_mm" },
  categorical = { "species", "sex" },
  missing = "drop", -- 11 birds: 9 whose sex is not recorded, 2 not measured
}
-- The file is sorted by species: split through a seeded permutation.
local train, test = birds:split{ 0.8, 0.2, seed = cfg.seed }
train = train:named("train"):standardize()
test = test:named("test"):standardize(train) -- the training part's statistics

local run = taper.run{
  model = taper.model.mlp{ inputs = #birds:feature_names(), hidden = { 32 }, outputs = 2 },
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
    local e = run:evaluate(test)
    if epoch == cfg.epochs then
      print(("mass within %.0f g, flipper within %.1f mm (RMSE)"):format(
        e.per_target.body_mass_g.rmse, e.per_target.flipper_length_mm.rmse))
    end
  end
end
