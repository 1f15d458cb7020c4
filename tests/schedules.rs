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

const RAMP: &str = r#"
local cfg = taper.config{ epochs = 2, fail_at = 0 }
local run = taper.run{
  model = taper.model.mlp{ inputs = 64, hidden = { 32 }, outputs = 10 },
  optim = taper.optim.adamw{ lr = 3e-3 },
  data = taper.data.digits{}:shuffle{ seed = 9 }:batch(64),
  schedule = taper.schedule.batch_ramp{ from = 16, to = 128, steps = 12, multiple = 16 },
  seed = 5,
}
sizes, seen = {}, {}
for epoch in run:epochs(cfg.epochs) do
  for b in run:batches() do
    sizes[#sizes + 1] = b.size
    for _, i in ipairs(b.indices) do seen[i] = (seen[i] or 0) + 1 end
    run:step(b)
    if run.steps == cfg.fail_at then error("stop here") end
  end
end
"#;

fn ramp(
    dir: &std::path::Path,
    set: &[(&str, &str)],
    resume: Option<std::path::PathBuf>,
) -> taper::Result<Host> {
    let opts = HostOptions {
        out_dir: Some(dir.to_path_buf()),
        overrides: set
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        resume,
        ..HostOptions::default()
    };
    let mut host = Host::new(opts)?;
    host.run_source("ramp.lua", RAMP)?;
    Ok(host)
}

#[test]
fn batch_ramp_grows_batches_and_still_covers_every_sample() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let host = ramp(dir.path(), &[("epochs", "1")], None)?;
    let sizes: Vec<usize> = host.globals()?.get("sizes")?;
    // 16 + 112 * s / 12, rounded down to a multiple of 16.
    assert_eq!(&sizes[..7], &[16, 16, 32, 32, 48, 48, 64]);
    assert!(
        sizes[12..sizes.len() - 1].iter().all(|&s| s == 128),
        "{sizes:?}"
    );
    assert_eq!(sizes.iter().sum::<usize>(), 1437);
    let counts: Vec<usize> = host
        .lua()
        .load("local c = {} for i = 0, 1436 do c[#c + 1] = seen[i] or 0 end return c")
        .set_environment(host.globals()?)
        .eval()?;
    assert!(
        counts.iter().all(|&c| c == 1),
        "every sample once per epoch"
    );
    Ok(())
}

#[test]
fn batch_ramp_resumes_exactly_mid_epoch() -> Result<()> {
    use candle_core::Device;
    use taper::engine::checkpoint;
    let (a, b, c) = (
        tempfile::tempdir()?,
        tempfile::tempdir()?,
        tempfile::tempdir()?,
    );
    ramp(a.path(), &[], None)?;
    // Fail in the middle of epoch 1, with batch sizes still ramping.
    assert!(ramp(b.path(), &[("fail_at", "7")], None).is_err());
    let ckpt = b.path().join("checkpoint.safetensors");
    let (_, meta) = checkpoint::load(&ckpt, &Device::Cpu)?;
    assert_eq!((meta.step, meta.epoch_complete), (7, false));
    assert_eq!(
        meta.epoch_samples,
        (16 + 16 + 32 + 32 + 48 + 48 + 64) as u64
    );
    ramp(c.path(), &[], Some(ckpt))?;
    let (ta, ma) = checkpoint::load(&a.path().join("checkpoint.safetensors"), &Device::Cpu)?;
    let (tc, mc) = checkpoint::load(&c.path().join("checkpoint.safetensors"), &Device::Cpu)?;
    assert_eq!(ma.step, mc.step);
    for (k, t) in ta.iter().filter(|(k, _)| k.starts_with("model.")) {
        let d = (t - &tc[k])?
            .abs()?
            .flatten_all()?
            .max(0)?
            .to_scalar::<f32>()?;
        assert_eq!(d, 0.0, "{k} differs after resume");
    }
    Ok(())
}
