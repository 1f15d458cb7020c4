-- Chat fine-tuning: teach SmolLM2-135M-Instruct (a llama.cpp GGUF, its
-- weights frozen in Q4_1/Q8_0) new replies with low-rank adapters, on
-- conversations in a JSON Lines file in TRL's format, one per line:
--   {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
-- Each is rendered with the model's own chat template (from its GGUF file),
-- and the loss learns the assistant's replies only: the prompt's and the
-- padding's positions are ignored, as TRL's `assistant_only_loss` does.
-- Needs `bash scripts/fetch-data.sh` (the model and its tokenizer.json).
-- Out of the box it writes a small task of its own (sums asked and answered
-- in words, held-out sums to check) and trains on it in about two minutes on 2
-- CPU cores:
--   taper train scripts/smollm2_chat.lua
--   taper train scripts/smollm2_chat.lua --set data=chats.jsonl   (your conversations)
--   taper train scripts/smollm2_chat.lua --set layers=2 --set chats=64   (a quick check)
--   taper train scripts/smollm2_chat.lua --set export=out/   (then, for llama.cpp,
--     out/adapter.gguf over the original file, or out/merged-q8_0.gguf alone;
--     for transformers and PEFT, the adapter folder out/peft)
local cfg = taper.config{
  data = "", -- a JSON Lines file of conversations; "" writes the built-in task
  chats = 200, -- conversations in the built-in task
  epochs = 2, batch = 8, context = 64, lr = 2e-3, rank = 8, alpha = 16,
  group = false, -- true: batches of conversations of like lengths (less padding computed)
  layers = 0, -- > 0: only the first n blocks (a smaller, quicker model)
  val = 0.1, -- the share held out, to score the replies before and after
  answers = 10, -- held-out questions the model then answers, greedily
  seed = 1,
  export = "", -- a folder: write the adapters for llama.cpp, and a merged model
}

local dir = "data/smollm2/"
local model_file = dir .. "SmolLM2-135M-Instruct.Q4_1.gguf"

-- The built-in task: "What is 17 plus 25?" answered "17 plus 25 is 42.",
-- drawn with a seeded generator, so every run (and a reload) writes the same.
local function sums(n)
  local s = cfg.seed
  local function draw() s = (s * 1103515245 + 12345) % 2147483648; return 1 + s % 50 end
  local tmp = os.tmpname()
  os.remove(tmp)
  local path = tmp .. "-sums.jsonl"
  local f = assert(io.open(path, "w"))
  local questions = {}
  for _ = 1, n do
    local a, b = draw(), draw()
    local q = ("What is %d plus %d?"):format(a, b)
    f:write(('{"messages": [{"role": "user", "content": "%s"}, {"role": "assistant", "content": "%d plus %d is %d."}]}\n')
      :format(q, a, b, a + b))
    questions[#questions + 1] = { q = q, sum = a + b }
  end
  f:close()
  return path, questions
end

local path, questions = cfg.data, nil
if path == "" then path, questions = sums(cfg.chats) end
local chats = taper.data.chat{
  path = path, tokenizer = dir .. "tokenizer.json", template = model_file, context = cfg.context,
}
if cfg.data == "" then os.remove(path) end
print(chats)
-- Held out: the last `val` of the file.
local n_val = math.max(1, math.floor(#chats * cfg.val + 0.5))
local train = chats:take(#chats - n_val):named("train")
local val = chats:skip(#chats - n_val):named("val")

local run = taper.run{
  model = taper.model.llama_gguf{
    path = model_file, context = cfg.context,
    lora_rank = cfg.rank, lora_alpha = cfg.alpha, layers = cfg.layers > 0 and cfg.layers or nil,
  },
  optim = taper.optim.adamw{ lr = cfg.lr, weight_decay = 0 },
  loss = taper.loss.cross_entropy{ chunk = 256 },
  -- A batch is computed as far as its longest conversation goes; with
  -- `group`, conversations of like lengths are batched together, as
  -- transformers' `group_by_length` batches them.
  data = train:shuffle{ seed = cfg.seed, group_by_length = cfg.group }:batch(cfg.batch),
  seed = cfg.seed,
}
print(("%s: %d trained parameters"):format(tostring(run), run.parameters))

-- run.state survives reloads and resumes: the score before any training.
if not run.state.before then
  local e = run:evaluate(val:batch(16))
  run.state.before = { loss = e.loss, accuracy = e.accuracy }
end
for _ in run:epochs(cfg.epochs) do
  for batch in run:batches() do
    run:step(batch)
    if run.steps % 10 == 0 then run:reload_point() end
  end
end
local after = run:evaluate(val:batch(16))
print(("held-out replies: cross-entropy %.4f -> %.4f, next-token accuracy %.1f%% -> %.1f%%"):format(
  run.state.before.loss, after.loss, 100 * run.state.before.accuracy, 100 * after.accuracy))

-- The model answers held-out questions of the built-in task, greedily:
-- `messages` are rendered with the model's chat template, and the reply
-- ends at its end token. (`taper sample RUN --chat "What is 3 plus 4?"`
-- asks the trained run from the command line.)
local right, asked = 0, 0
if questions then
  for i = #questions - n_val + 1, math.min(#questions, #questions - n_val + cfg.answers) do
    local q = questions[i]
    local reply = run:generate{ messages = { { role = "user", content = q.q } }, tokens = 16, temperature = 0 }
    local said = tonumber(reply:match("is (%d+)"))
    asked, right = asked + 1, right + (said == q.sum and 1 or 0)
    if asked <= 3 then print(("%s -> %s"):format(q.q, reply)) end
  end
  if asked > 0 then print(("held-out sums answered right: %d of %d"):format(right, asked)) end
end
results = {
  before = run.state.before.loss, after = after.loss,
  accuracy_before = run.state.before.accuracy, accuracy_after = after.accuracy,
  right = right, asked = asked,
}

if cfg.export ~= "" then
  if cfg.layers == 0 then
    run:export{ path = cfg.export .. "/adapter.gguf", format = "gguf-lora" }
    -- For transformers: PeftModel.from_pretrained(model, "<export>/peft").
    run:export{ path = cfg.export .. "/peft", format = "peft" }
  end
  run:export{ path = cfg.export .. "/merged-q8_0.gguf", format = "gguf", type = "q8_0" }
end
