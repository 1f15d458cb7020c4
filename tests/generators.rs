//! Lua generators: batches produced by Lua code train a model like native
//! data, and malformed batches are errors that name the generator.

use anyhow::Result;
use taper::{host::render_error, Host, HostOptions};

fn run(src: &str) -> taper::Result<taper::host::Report> {
    Host::new(HostOptions::default())?.run_source("gen.lua", src)
}

#[test]
fn generator_batches_train_a_model() -> Result<()> {
    // Two Gaussian blobs in 2-D, drawn in Lua with a seeded LCG; each epoch
    // is 20 batches of 32. The held-out set comes from another generator.
    let report = run(r#"
        local function blobs(seed, batches)
          return taper.data.generator(function(epoch)
            local s = seed * 1000 + epoch
            local function rnd() s = (s * 1103515245 + 12345) % 2147483648; return s / 2147483648 end
            local function normal() return math.sqrt(-2 * math.log(1 - rnd())) * math.cos(2 * math.pi * rnd()) end
            return coroutine.wrap(function()
              for _ = 1, batches do
                local x, y = {}, {}
                for i = 1, 32 do
                  local c = i % 2
                  x[i] = { normal() + (c == 1 and 2 or -2), normal() }
                  y[i] = c
                end
                coroutine.yield{ x = x, y = y }
              end
            end)
          end, { split = seed == 1 and "train" or "test" })
        end
        local run = taper.run{
          model = taper.model.mlp{ inputs = 2, hidden = { 8 }, outputs = 2 },
          optim = taper.optim.adamw{ lr = 1e-2 },
          data = blobs(1, 20),
        }
        for epoch in run:epochs(3) do
          for b in run:batches() do run:step(b) end
        end
        local ev = run:evaluate(blobs(2, 10))
        assert(ev.samples == 320 and ev.split == "test")
        assert(run.steps == 60)
    "#)?;
    let ev = report.runs[0].last_eval.clone().expect("evaluated");
    // Blobs 4 standard deviations apart: the Bayes error is 2.3%.
    assert!(ev.accuracy >= 0.95, "accuracy {}", ev.accuracy);
    Ok(())
}

#[test]
fn generator_token_batches_feed_a_gpt() -> Result<()> {
    run(r#"
        local gen = taper.data.generator(function(epoch)
          local n = 0
          return function()
            n = n + 1
            if n > 3 then return nil end
            -- Counting sequences: the next token is always current + 1 (mod 10).
            local x, y = {}, {}
            for b = 1, 8 do
              x[b], y[b] = {}, {}
              for t = 1, 6 do
                x[b][t] = (b + t) % 10
                y[b][t] = (b + t + 1) % 10
              end
            end
            return { x = x, y = y, x_type = "u32" }
          end
        end)
        local run = taper.run{
          model = taper.model.gpt{ vocab = 10, context = 6, width = 16, layers = 1, heads = 2 },
          data = gen,
        }
        for epoch in run:epochs(2) do
          for b in run:batches() do
            assert(b.size == 8)
            run:step(b)
          end
        end
        assert(run.steps == 6)
    "#)?;
    Ok(())
}

/// A sequence's labels may be -100 (PyTorch's `ignore_index`): positions
/// the loss leaves out. Here every other next token is noise the model
/// cannot learn and is ignored; the rest follow a rule. Evaluation scores
/// the labelled positions alone: a run that counted the noise could not
/// pass 55%.
#[test]
fn ignored_positions_are_left_out_of_training_and_evaluation() -> Result<()> {
    let report = run(r#"
        local function data(seed)
          return taper.data.generator(function(epoch)
            local s = seed * 7919 + epoch
            local function noise() s = (s * 1103515245 + 12345) % 2147483648; return s % 10 end
            return coroutine.wrap(function()
              for _ = 1, 8 do
                local x, y = {}, {}
                for b = 1, 16 do
                  x[b], y[b] = {}, {}
                  for t = 1, 8 do x[b][t] = noise() end
                  for t = 1, 8 do
                    -- Odd positions: the next token is this one + 1 (mod 10).
                    y[b][t] = t % 2 == 1 and (x[b][t] + 1) % 10 or -100
                  end
                end
                coroutine.yield{ x = x, y = y, x_type = "u32" }
              end
            end)
          end, { split = seed == 1 and "train" or "val" })
        end
        local run = taper.run{
          model = taper.model.gpt{ vocab = 10, context = 8, width = 32, layers = 1, heads = 2 },
          optim = taper.optim.adamw{ lr = 1e-2 },
          data = data(1),
        }
        for epoch in run:epochs(15) do
          for b in run:batches() do run:step(b) end
        end
        local ev = run:evaluate(data(2))
        -- 8 batches of 16 sequences, 4 labelled positions each.
        assert(ev.samples == 8 * 16 * 4, ev.samples)
    "#)?;
    let ev = report.runs[0].last_eval.clone().expect("evaluated");
    assert!(ev.accuracy >= 0.95, "accuracy {}", ev.accuracy);
    assert!(ev.loss < 0.3, "loss {}", ev.loss);
    Ok(())
}

#[test]
fn malformed_generator_batches_name_the_generator() {
    let cases = [
        (
            "{ x = { {1, 2}, {3} }, y = { 0, 1 } }",
            "x: a row at depth 1 has 1 values, expected 2",
        ),
        (
            "{ x = { {1, 2} }, y = { -100 } }",
            "y: -100 (sample 0) is not a class index or token id: those are whole numbers, 0 or more",
        ),
        (
            "{ x = { {1, 2} }, y = { {1, -1} }, x_type = 'u32' }",
            "y: -1 (sample 0) is not a class index or token id: those are whole numbers, 0 or more (or -100 where the loss leaves a position out)",
        ),
        (
            "{ x = { {1, 2} }, y = { 0, 1 } }",
            "x has 1 samples, y has 2",
        ),
        (
            "{ x = { {1, 2} }, y = { 0 }, z = 1 }",
            "unknown batch key `z`",
        ),
        ("{ x = { {1, 'a'} }, y = { 0 } }", "x: unexpected string"),
        ("42", "expected a batch table or nil, got an integer"),
    ];
    for (batch, expected) in cases {
        let src = format!(
            "local run = taper.run{{ model = taper.model.mlp{{ inputs = 2, outputs = 2 }},\n  data = taper.data.generator(function(epoch)\n    return function() return {batch} end\n  end) }}\nfor epoch in run:epochs(1) do for b in run:batches() do run:step(b) end end"
        );
        let e = run(&src).expect_err(batch);
        let msg = render_error(&e);
        assert!(
            msg.contains("generator at gen.lua:2: ") && msg.contains(expected),
            "{batch}: {msg}"
        );
    }
}

#[test]
fn a_batch_is_released_when_its_iterator_moves_on() {
    let e = run(r#"
        local run = taper.run{ model = taper.model.mlp{ inputs = 64, outputs = 10 }, data = taper.data.digits{}:batch(100) }
        local kept
        for epoch in run:epochs(1) do
          for b in run:batches() do
            if kept then run:step(kept) end
            kept = b
          end
        end
    "#)
    .expect_err("a kept batch is released");
    let msg = render_error(&e);
    assert!(msg.contains("this batch was released"), "{msg}");
}

#[test]
fn map_transforms_native_batches() -> Result<()> {
    // Train on pixel-inverted digits through map(): inverted test digits are
    // recognised, the originals much less so, so the transform was applied.
    run(r#"
        local calls = 0
        local function invert(x, y)
          calls = calls + 1
          assert(#x[1] == 64 and math.type(y[1]) == "integer")
          for i = 1, #x do
            local row = x[i]
            for j = 1, #row do row[j] = 1 - row[j] end
          end
          return { x = x, y = y }
        end
        local train = taper.data.digits{}:shuffle{ seed = 2 }:batch(32):prefetch(2):map(invert)
        local run = taper.run{
          model = taper.model.mlp{ inputs = 64, hidden = { 64 }, outputs = 10 },
          optim = taper.optim.adamw{ lr = 3e-3 },
          data = train,
        }
        for epoch in run:epochs(8) do
          for b in run:batches() do run:step(b) end
        end
        assert(calls == 8 * 45, calls)
        local test = taper.data.digits{ split = "test" }
        local inv = run:evaluate(test:map(invert))
        local plain = run:evaluate(test)
        assert(inv.accuracy > 0.9, inv.accuracy)
        assert(plain.accuracy < inv.accuracy - 0.3, ("%f vs %f"):format(plain.accuracy, inv.accuracy))
        print(tostring(test:map(invert)))
    "#)?;
    Ok(())
}

/// `data:batches([epoch])`, for looking at data without a run, works on
/// generators and mapped data as on native data: the epoch is passed on,
/// batches are sized as given, and each is released when the next comes.
#[test]
fn generators_and_mapped_data_iterate_their_batches_without_a_run() -> Result<()> {
    run(r#"
        local seen = {}
        local gen = taper.data.generator(function(epoch)
          seen[#seen + 1] = epoch
          local n = 0
          return function()
            n = n + 1
            if n > 3 then return nil end
            return { x = { { epoch, n }, { 0, 0 } }, y = { 1, 0 } }
          end
        end)
        local sizes = 0
        for b in gen:batches(4) do sizes = sizes + b.size end
        assert(sizes == 6 and seen[1] == 4, ("%d samples, epoch %s"):format(sizes, seen[1]))
        for b in gen:batches() do end
        assert(seen[2] == 1, seen[2])

        local first
        local mapped = taper.data.digits{ split = "test" }:batch(100):map(function(x, y)
          first = first or x[1][1]
          return { x = x, y = y }
        end)
        local batches, samples, kept = 0, 0, nil
        for b in mapped:batches() do
          batches, samples, kept = batches + 1, samples + #b, b
        end
        assert(batches == 4 and samples == 360, ("%d batches, %d samples"):format(batches, samples))
        assert(first ~= nil)
        assert(not pcall(function() return kept.size end), "the last batch is released")
    "#)?;
    Ok(())
}

/// A generator's `y_type = "f32"` gives numbers to predict: a regression
/// trained with `taper.loss.mse{}` fits y = 2a - b + 1 (R² near 1, in the
/// units the generator gave); a value that is not finite is refused.
#[test]
fn a_generator_of_numbers_trains_a_regression() -> Result<()> {
    let report = run(r#"
        local function line(seed)
          return taper.data.generator(function(epoch)
            local s = seed * 1000 + epoch
            local function rnd() s = (s * 1103515245 + 12345) % 2147483648; return s / 2147483648 end
            return coroutine.wrap(function()
              for _ = 1, 20 do
                local x, y = {}, {}
                for i = 1, 32 do
                  local a, b = rnd() * 2 - 1, rnd() * 2 - 1
                  x[i] = { a, b }
                  y[i] = 2 * a - b + 1
                end
                coroutine.yield{ x = x, y = y, y_type = "f32" }
              end
            end)
          end)
        end
        local run = taper.run{
          model = taper.model.mlp{ inputs = 2, outputs = 1 },
          optim = taper.optim.adamw{ lr = 3e-2 },
          loss = taper.loss.mse{},
          data = line(1),
        }
        for _ in run:epochs(10) do
          for b in run:batches() do run:step(b) end
        end
        local ev = run:evaluate(line(2))
        assert(ev.accuracy == nil and ev.samples == 640)
    "#)?;
    let g = report.runs[0]
        .last_eval
        .clone()
        .unwrap()
        .regression
        .expect("scores");
    // y spans about [-2, 4] (deviation 1.3): a linear fit's errors vanish.
    assert!(g.r2() > 0.99 && g.rmse() < 0.1, "{g:?}");

    let e = run(r#"
        local gen = taper.data.generator(function()
          return coroutine.wrap(function() coroutine.yield{ x = { { 1 } }, y = { 0 / 0 }, y_type = "f32" } end)
        end)
        for b in gen:batches() do end
    "#)
    .expect_err("NaN");
    let msg = render_error(&e);
    assert!(
        msg.contains("y: NaN (sample 0) is not a finite number"),
        "{msg}"
    );
    Ok(())
}

/// `data:map(fn)` over a regression's data: the numbers `fn` is given come
/// back as numbers to predict without saying `y_type`.
#[test]
fn mapped_regression_data_keeps_its_numbers() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let csv = dir.path().join("t.csv");
    std::fs::write(&csv, "a,b,y\n1,2,0.5\n3,4,1.5\n5,6,2.5\n")?;
    run(&format!(
        r#"
        local seen = {{}}
        local d = taper.data.csv{{ path = {:?}, target = "y" }}:batch(2):map(function(x, y)
          for i = 1, #y do seen[#seen + 1] = y[i][1] end
          return {{ x = x, y = y }}
        end)
        local run = taper.run{{ model = taper.model.mlp{{ inputs = 2, outputs = 1 }}, loss = taper.loss.mse{{}}, data = d }}
        for _ in run:epochs(1) do for b in run:batches() do run:step(b) end end
        assert(run.steps == 2 and seen[1] == 0.5 and seen[3] == 2.5, table.concat(seen, ","))
        "#,
        csv.to_str().unwrap()
    ))?;
    Ok(())
}
