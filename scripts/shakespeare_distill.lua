-- Knowledge distillation: a character-level GPT teacher (the shape of
-- scripts/shakespeare.lua) is distilled into a student with half the width
-- and one layer. A second student with the same seed and data trains on the
-- labels alone, so the two can be compared. Prints the held-out
-- cross-entropy of all three, and each student's distillation objective
-- (T^2 KL to the teacher, mixed with the cross-entropy) against the teacher.
--   taper train scripts/shakespeare_distill.lua
--   taper train scripts/shakespeare_distill.lua --set steps=60 --set teacher_epochs=1
local cfg = taper.config{
  steps = 400, batch = 32, context = 64, lr = 6e-3, seed = 1,
  teacher_epochs = 2, student_epochs = 1,
  teacher_width = 64, teacher_layers = 2, student_width = 32, student_layers = 1,
  temperature = 2.0, alpha = 0.5,
}

local train = taper.data.shakespeare{ split = "train", context = cfg.context }
  :take(cfg.steps * cfg.batch):shuffle{ seed = cfg.seed }:batch(cfg.batch)
local val = taper.data.shakespeare{ split = "val", context = cfg.context }:take(512):batch(64)

local function new_run(width, layers, loss)
  return taper.run{
    model = taper.model.gpt{
      vocab = train:vocab_size(), context = cfg.context,
      width = width, layers = layers, heads = 4,
    },
    optim = taper.optim.adamw{ lr = cfg.lr, weight_decay = 0.1, clip_grad_norm = 1.0 },
    data = train,
    loss = loss,
    seed = cfg.seed,
  }
end

local function fit(run, epochs)
  for _ in run:epochs(epochs) do
    for batch in run:batches() do run:step(batch) end
  end
end

local teacher = new_run(cfg.teacher_width, cfg.teacher_layers)
fit(teacher, cfg.teacher_epochs)
local t_eval = teacher:evaluate(val)

-- The teacher is frozen as it is now.
local distill = taper.loss.distill{ teacher = teacher, temperature = cfg.temperature, alpha = cfg.alpha }
local student = new_run(cfg.student_width, cfg.student_layers, distill)
fit(student, cfg.student_epochs)
local s_eval = student:evaluate(val)

local plain = new_run(cfg.student_width, cfg.student_layers)
fit(plain, cfg.student_epochs)
local p_eval = plain:evaluate(val, { loss = distill })

results = { teacher = t_eval, distilled = s_eval, plain = p_eval,
  parameters = { teacher = teacher.parameters, student = student.parameters } }
print(("teacher   %7d parameters: held-out cross-entropy %.4f"):format(teacher.parameters, t_eval.loss))
print(("distilled %7d parameters: held-out cross-entropy %.4f, distillation objective %.4f")
  :format(student.parameters, s_eval.loss, s_eval.objective))
print(("plain     %7d parameters: held-out cross-entropy %.4f, distillation objective %.4f")
  :format(plain.parameters, p_eval.loss, p_eval.objective))
