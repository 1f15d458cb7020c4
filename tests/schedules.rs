//! Schedules from Lua: built-in and Lua-function schedules drive the learning
//! rate and the micro-batch; micro-batching does not change the training.

use anyhow::Result;
use taper::{host::render_error, Host, HostOptions};

fn run(src: &str) -> taper::Result<taper::host::Report> {
    Host::new(HostOptions::default())?.run_source("recipe.lua", src)
}

#[test]
fn builtin_schedules_plan_learning_rates() -> Result<()> {
    run(r#"
        local s = taper.schedule.warmup_cosine{ lr = 1.0, warmup = 10, total = 110, min_lr = 0.1 }
        assert(math.abs(s:plan(0).lr - 0.1) < 1e-12)
        assert(math.abs(s:plan(60).lr - 0.55) < 1e-12)
        local d = taper.schedule.step{ lr = 1.0, every = 2, gamma = 0.5 }
        assert(d:plan(4).lr == 0.25)
        local c = taper.schedule.constant{ micro_batch = 8 }
        assert(c:plan(0).micro_batch == 8 and c:plan(0).lr == nil)
    "#)?;
    Ok(())
}

#[test]
fn lua_schedule_sets_lr_and_sees_its_state() -> Result<()> {
    run(r#"
        local seen = {}
        local run = taper.run{
          model = taper.model.mlp{ inputs = 64, outputs = 10 },
          data = taper.data.digits{}:batch(64),
          schedule = function(step, epoch, state)
            state.calls = (state.calls or 0) + 1
            seen[#seen + 1] = { step = step, epoch = epoch, calls = state.calls }
            return { lr = 0.01 * (step + 1) }
          end,
        }
        for epoch in run:epochs(1) do
          for b in run:batches() do
            run:step(b)
            if run.steps == 3 then break end
          end
        end
        assert(#seen == 3 and seen[3].step == 2 and seen[3].epoch == 1 and seen[3].calls == 3)
        assert(math.abs(run:lr() - 0.03) < 1e-12)
    "#)?;
    Ok(())
}

#[test]
fn micro_batching_does_not_change_training() -> Result<()> {
    // Two runs, same seed and batches; one computes each step as micro-batches
    // of 24 (64 = 24 + 24 + 16), one as the whole batch. Evaluation agrees.
    run(r#"
        local function make(extra)
          local o = {
            model = taper.model.mlp{ inputs = 64, hidden = { 32 }, outputs = 10 },
            optim = taper.optim.adamw{ lr = 3e-3 },
            data = taper.data.digits{}:shuffle{ seed = 5 }:batch(64),
            seed = 3,
          }
          for k, v in pairs(extra) do o[k] = v end
          return taper.run(o)
        end
        local whole = make{}
        local micro = make{ schedule = taper.schedule.constant{ micro_batch = 24 } }
        local per_step = make{ micro_batch = 8 }
        for _, r in ipairs{ whole, micro, per_step } do
          for epoch in r:epochs(2) do
            for b in r:batches() do r:step(b) end
          end
        end
        local test = taper.data.digits{ split = "test" }
        local a, b, c = whole:evaluate(test), micro:evaluate(test), per_step:evaluate(test)
        assert(math.abs(a.loss - b.loss) < 1e-5 and math.abs(a.loss - c.loss) < 1e-5,
          ("losses %.8f %.8f %.8f"):format(a.loss, b.loss, c.loss))
        assert(a.accuracy == b.accuracy and a.accuracy == c.accuracy)
    "#)?;
    Ok(())
}

#[test]
fn bad_schedule_return_names_the_function() {
    let e = run(r#"
        local run = taper.run{
          model = taper.model.mlp{ inputs = 64, outputs = 10 },
          data = taper.data.digits{}:batch(64),
          schedule = function(step)
            return { lr = 1e-3, micro = 8 }
          end,
        }
        for epoch in run:epochs(1) do
          for b in run:batches() do run:step(b) end
        end
    "#)
    .expect_err("the schedule returns an unknown key");
    let msg = render_error(&e);
    assert!(
        msg.contains("schedule function at recipe.lua:5: bad return value: unknown field `micro`"),
        "{msg}"
    );
    let e = run("taper.run{ model = taper.model.mlp{ inputs = 2, outputs = 2 }, schedule = 3 }")
        .expect_err("not a schedule");
    assert!(
        render_error(&e).contains("option `schedule` must be"),
        "{}",
        render_error(&e)
    );
}
