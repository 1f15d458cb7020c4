//! The Lua API's option decoding: unknown keys, wrong types and defaults give
//! errors that name the key and the recipe's file and line.

use anyhow::Result;
use taper::{host::render_error, Host, HostOptions};

fn run(src: &str) -> taper::Result<taper::host::Report> {
    Host::new(HostOptions::default())?.run_source("recipe.lua", src)
}

fn run_with(overrides: &[(&str, &str)], src: &str) -> taper::Result<taper::host::Report> {
    let opts = HostOptions {
        overrides: overrides
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..HostOptions::default()
    };
    Host::new(opts)?.run_source("recipe.lua", src)
}

/// The rendered error, asserting it is a recipe error (CLI exit code 2).
fn recipe_error(r: taper::Result<taper::host::Report>) -> String {
    let e = r.expect_err("the recipe should fail");
    let msg = render_error(&e);
    assert_eq!(e.exit_code(), 2, "not a recipe error: {msg}");
    msg
}

#[test]
fn unknown_option_names_key_file_and_line() {
    let msg = recipe_error(run(
        "local x = 1\nlocal o = taper.optim.adamw{ lr = 1e-3, wieght_decay = 0.1 }\n",
    ));
    assert!(
        msg.starts_with("recipe.lua:2: taper.optim.adamw: unknown field `wieght_decay`"),
        "{msg}"
    );
    assert!(msg.contains("expected one of"), "{msg}");
}

#[test]
fn wrong_type_names_the_nested_key() {
    let msg = recipe_error(run(
        "taper.model.mlp{ inputs = 64, hidden = { 128, 'wide' }, outputs = 10 }",
    ));
    assert!(
        msg.starts_with("recipe.lua:1: taper.model.mlp: option `hidden[1]`"),
        "{msg}"
    );
    let msg = recipe_error(run("taper.optim.sgd{ lr = 'fast' }"));
    assert!(msg.contains("option `lr`"), "{msg}");
    let msg = recipe_error(run(
        "taper.model.mlp{ inputs = 64, outputs = 10, activation = 'relu6' }",
    ));
    assert!(
        msg.contains("option `activation`") && msg.contains("relu6"),
        "{msg}"
    );
}

#[test]
fn precision_and_optimizer_state_are_checked() {
    let msg = recipe_error(run(
        "local m = taper.model.mlp{ inputs = 2, outputs = 2 }\ntaper.run{ model = m, precision = 'fp8' }",
    ));
    assert!(
        msg.starts_with(
            "recipe.lua:2: taper.run: option `precision`: unknown precision `fp8` (f32, bf16, f16)"
        ),
        "{msg}"
    );
    let msg = recipe_error(run("taper.optim.adamw{ state = '4bit' }"));
    assert!(
        msg.contains("option `state`") && msg.contains("4bit"),
        "{msg}"
    );
}

#[test]
fn distill_options_are_checked() {
    let msg = recipe_error(run("taper.loss.distill{ alpha = 0.5 }"));
    assert!(
        msg.contains("option `teacher` (a run) is required"),
        "{msg}"
    );
    let msg = recipe_error(run(
        "local r = taper.run{ model = taper.model.mlp{ inputs = 2, outputs = 2 } }\ntaper.loss.distill{ teacher = r, alpha = 2 }",
    ));
    assert!(
        msg.starts_with("recipe.lua:2: taper.loss.distill: alpha 2 must be in [0, 1]"),
        "{msg}"
    );
    let msg = recipe_error(run("taper.loss.distill{ teacher = 3 }"));
    assert!(
        msg.contains("option `teacher` must be a taper.run"),
        "{msg}"
    );
}

#[test]
fn missing_required_option_is_named() {
    let msg = recipe_error(run("taper.model.mlp{ inputs = 64 }"));
    assert!(
        msg.contains("taper.model.mlp: option `outputs` is required"),
        "{msg}"
    );
}

#[test]
fn run_options_are_checked() {
    let msg = recipe_error(run(
        "local m = taper.model.mlp{ inputs = 2, outputs = 2 }\ntaper.run{ model = m, optimiser = 1 }",
    ));
    assert!(
        msg.starts_with("recipe.lua:2: taper.run: unknown option `optimiser`"),
        "{msg}"
    );
    let msg = recipe_error(run("taper.run{ model = 3 }"));
    assert!(
        msg.contains("option `model` must be a taper.model, got an integer"),
        "{msg}"
    );
    let msg = recipe_error(run(
        "taper.run{ model = taper.model.mlp{ inputs = 2, outputs = 2 }, optim = taper.data.digits{} }",
    ));
    assert!(
        msg.contains("option `optim` must be a taper.optim"),
        "{msg}"
    );
    let msg = recipe_error(run(
        "taper.run{ model = taper.model.mlp{ inputs = 2, outputs = 2 }, seed = 1.5 }",
    ));
    assert!(
        msg.contains("option `seed` must be a non-negative integer"),
        "{msg}"
    );
    let msg = recipe_error(run("taper.run{}"));
    assert!(msg.contains("option `model` is required"), "{msg}");
}

#[test]
fn defaults_follow_pytorch() -> Result<()> {
    run(r#"
        assert(tostring(taper.optim.adamw{}) ==
          "taper.optim(adamw lr 0.001 betas (0.9, 0.999) eps 0.00000001 weight_decay 0.01)",
          tostring(taper.optim.adamw{}))
        assert(tostring(taper.optim.sgd{}) == "taper.optim(sgd lr 0.001 momentum 0 weight_decay 0)")
        assert(tostring(taper.model.gpt{ vocab = 10, context = 8 }) ==
          "taper.model(gpt vocab 10 context 8 width 128 layers 4 heads 4)")
        assert(tostring(taper.model.gpt{ vocab = 10, context = 8, dropout = 0.2 }) ==
          "taper.model(gpt vocab 10 context 8 width 128 layers 4 heads 4 dropout 0.2)")
        assert(tostring(taper.model.mlp{ inputs = 4, hidden = { 3 }, outputs = 2, dropout = 0.5 }) ==
          "taper.model(mlp 4-3-2 relu dropout 0.5)")
        local m = taper.model.mlp{ inputs = 3, hidden = { 4 }, outputs = 2 }
        assert(m:parameters() == 3 * 4 + 4 + 4 * 2 + 2)
        assert(#taper.data.digits{} == 1437 and #taper.data.digits{ split = "test" } == 360)
    "#)?;
    Ok(())
}

/// The net of PyTorch's CIFAR-10 tutorial ("Training a Classifier"):
///   conv1 = nn.Conv2d(3, 6, 5); pool = nn.MaxPool2d(2, 2); conv2 = nn.Conv2d(6, 16, 5)
///   fc1 = nn.Linear(16 * 5 * 5, 120); fc2 = nn.Linear(120, 84); fc3 = nn.Linear(84, 10)
///   sum(p.numel() for p in Net().parameters())  # 62006 (torch 2.15)
/// as `kernel = 5, padding = 0`; the default keeps 3x3 with padding 1.
#[test]
fn cnn_kernels_and_padding_build_pytorchs_tutorial_net() -> Result<()> {
    run(r#"
        local tutorial = taper.model.cnn{ input = { 3, 32, 32 }, channels = { 6, 16 },
          kernel = 5, padding = 0, hidden = { 120, 84 }, outputs = 10 }
        assert(tutorial:parameters() == 62006, tutorial:parameters())
        assert(tostring(tutorial) ==
          "taper.model(cnn 3x32x32 conv[6, 16] 5x5 pad 0 hidden[120, 84] -> 10 relu)", tostring(tutorial))
        -- Padding defaults to kernel // 2, which keeps the size: 32, 16, 8.
        local same = taper.model.cnn{ input = { 3, 32, 32 }, channels = { 6, 16 }, kernel = 5,
          hidden = {}, outputs = 10 }
        assert(same:parameters() == (3 * 25 + 1) * 6 + (6 * 25 + 1) * 16 + 16 * 8 * 8 * 10 + 10)
        assert(tostring(same) == "taper.model(cnn 3x32x32 conv[6, 16] 5x5 pad 2 hidden[] -> 10 relu)")
        assert(tostring(taper.model.cnn{ input = { 1, 8, 8 }, channels = { 4 }, outputs = 10, padding = 1 }) ==
          "taper.model(cnn 1x8x8 conv[4] hidden[] -> 10 relu)")
    "#)?;
    Ok(())
}

/// The net of PyTorch's MNIST example (pytorch/examples, mnist/main.py):
///   conv1 = nn.Conv2d(1, 32, 3, 1); conv2 = nn.Conv2d(32, 64, 3, 1)
///   fc1 = nn.Linear(9216, 128); fc2 = nn.Linear(128, 10)
///   forward: conv1, relu, conv2, relu, max_pool2d(2), ..., fc1, relu, fc2
///   sum(p.numel() for p in Net().parameters())  # 1199882 (torch 2.15)
/// as `padding = 0, pool = { false, true }` (its `Dropout(0.25)` and
/// `Dropout(0.5)`: `dropout = { 0.25, 0.5 }`); and the CNN of TensorFlow's
/// CIFAR-10 tutorial (three valid 3x3 Conv2D of 32, 64, 64, a
/// MaxPooling2D after the first two, Dense 64: 122,570 parameters in its
/// `model.summary()`) as `pool = { true, true, false }`. A pool after
/// every convolution is the default, and is described as before the
/// option.
#[test]
fn cnn_pool_builds_pytorchs_mnist_example() -> Result<()> {
    run(r#"
        local example = taper.model.cnn{ input = { 1, 28, 28 }, channels = { 32, 64 },
          padding = 0, pool = { false, true }, hidden = { 128 }, outputs = 10, dropout = { 0.25, 0.5 } }
        assert(example:parameters() == 1199882, example:parameters())
        assert(tostring(example) ==
          "taper.model(cnn 1x28x28 conv[32, 64] 3x3 pad 0 pool[false, true] hidden[128] -> 10 relu dropout [0.25, 0.5])",
          tostring(example))
        -- One rate is written as before lists were taken.
        assert(tostring(taper.model.cnn{ input = { 1, 8, 8 }, channels = { 4 }, outputs = 10, dropout = 0.5 }) ==
          "taper.model(cnn 1x8x8 conv[4] hidden[] -> 10 relu dropout 0.5)")
        local keras = taper.model.cnn{ input = { 3, 32, 32 }, channels = { 32, 64, 64 },
          padding = 0, pool = { true, true, false }, hidden = { 64 }, outputs = 10 }
        assert(keras:parameters() == 122570, keras:parameters())
        local every = taper.model.cnn{ input = { 1, 8, 8 }, channels = { 4 }, pool = { true }, outputs = 10 }
        assert(tostring(every) == "taper.model(cnn 1x8x8 conv[4] hidden[] -> 10 relu)", tostring(every))
        assert(every:parameters() == (9 + 1) * 4 + 4 * 4 * 4 * 10 + 10, every:parameters())
    "#)?;
    Ok(())
}

/// The escalating policy grows back as grow_back does: after `after` clean
/// steps, doubling, but never to a size that ran out of memory (75% of it).
#[test]
fn the_escalating_policy_grows_back_below_its_ceiling() -> Result<()> {
    run(r#"
        local p = taper.policy.escalate{ min_micro = 4, after = 2 }
        local info = function(clean, micro) return { clean_steps = clean, micro_batch = micro, batch_size = 32 } end
        assert(p:on_step(info(1, 8)) == nil, "not yet")
        assert(p:on_step(info(2, 8)).micro_batch == 16, "doubles")
        local a = p:on_oom{ micro_batch = 16, recompute = 0, offload = false, precision = "f32" }
        assert(a.action == "split" and a.micro_batch == 8)
        assert(p:on_step(info(2, 8)).micro_batch == 12, "75% of the ceiling of 16")
        assert(p:on_step(info(2, 32)) == nil, "the whole batch")
    "#)?;
    Ok(())
}

#[test]
fn errors_keep_their_type_through_pcall() {
    // An error raised in Rust, caught and re-raised by the script, is still a
    // recipe error (exit code 2), not a flattened string.
    let msg = recipe_error(run(
        "local ok, err = pcall(taper.optim.adamw, { bad = 1 })\nassert(not ok)\nerror(err)",
    ));
    assert!(msg.contains("unknown field `bad`"), "{msg}");
}

#[test]
fn config_overrides_are_typed_by_default() -> Result<()> {
    run_with(
        &[
            ("epochs", "2"),
            ("lr", "0.5"),
            ("name", "x"),
            ("wide", "true"),
        ],
        r#"
        local cfg = taper.config{ epochs = 20, lr = 3e-3, name = "digits", wide = false, batch = 64 }
        assert(math.type(cfg.epochs) == "integer" and cfg.epochs == 2)
        assert(cfg.lr == 0.5 and cfg.name == "x" and cfg.wide == true and cfg.batch == 64)
        "#,
    )?;
    let msg = recipe_error(run_with(
        &[("epochs", "2.5")],
        "taper.config{ epochs = 20 }",
    ));
    assert!(
        msg.contains("--set epochs=2.5: `epochs` is an integer"),
        "{msg}"
    );
    let msg = recipe_error(run_with(
        &[("epoch", "2")],
        "taper.config{ epochs = 20, lr = 1.0 }",
    ));
    assert!(
        msg.contains(
            "unknown config key `epoch`; did you mean `epochs`? The recipe declares: epochs, lr"
        ),
        "{msg}"
    );
    let msg = recipe_error(run_with(
        &[("zzz", "2")],
        "taper.config{ epochs = 20, lr = 1.0 }",
    ));
    assert!(
        msg.contains("unknown config key `zzz`; the recipe declares: epochs, lr"),
        "{msg}"
    );
    let msg = recipe_error(run_with(&[("epochs", "2")], "local x = 1"));
    assert!(msg.contains("declares no taper.config"), "{msg}");
    Ok(())
}

#[test]
fn syntax_error_names_file_and_line() {
    let msg = recipe_error(run("local a = 1\nlocal b = = 2\n"));
    assert!(msg.starts_with("recipe.lua:2:"), "{msg}");
}

#[test]
fn runtime_error_is_a_training_failure_with_traceback() {
    let e = run("local function f() error('boom') end\nf()")
        .err()
        .unwrap();
    assert_eq!(e.exit_code(), 1);
    let msg = render_error(&e);
    assert!(
        msg.contains("recipe.lua:1: boom") && msg.contains("stack traceback"),
        "{msg}"
    );
}

#[test]
fn data_pipeline_handles() -> Result<()> {
    run(r#"
        local d = taper.data.digits{}:take(100):shuffle{ seed = 3 }:batch{ size = 32, drop_last = true }
        assert(#d == 100 and d.split_name == "train")
        local run = taper.run{ model = taper.model.mlp{ inputs = 64, outputs = 10 }, data = d }
        local n, seen = 0, {}
        for epoch in run:epochs(1) do
          for b in run:batches() do
            n = n + 1
            assert(b.size == 32)
            for _, i in ipairs(b.indices) do assert(not seen[i]); seen[i] = true end
            local loss, step = run:step(b)
            assert(step == n and loss > 0)
          end
        end
        assert(n == 3 and run.steps == 3 and run.epoch == 1)
        local t = taper.data.shakespeare{ context = 8 }
        assert(t:decode(t:encode("ROMEO:")) == "ROMEO:")
    "#)?;
    Ok(())
}

/// `data:shuffle()` is `data:shuffle{ seed = 0 }`: the same order, another
/// seed's differs.
#[test]
fn shuffle_without_a_seed_takes_seed_0() -> Result<()> {
    run(r#"
local function order(d)
  local ids = {}
  for b in d:batch(8):take(8):batches() do
    for _, i in ipairs(b.indices) do ids[#ids + 1] = i end
  end
  return table.concat(ids, ",")
end
local data = taper.data.digits{}
assert(order(data:shuffle()) == order(data:shuffle{ seed = 0 }))
assert(order(data:shuffle()) ~= order(data:shuffle{ seed = 1 }))
"#)?;
    Ok(())
}

#[test]
fn an_unknown_field_of_a_handle_names_the_line_that_read_it() {
    let e = run(r#"local data = taper.data.digits{}:batch(10)
for b in data:batches() do
  print(b.sizee)
end"#)
    .expect_err("no such field");
    let msg = render_error(&e);
    assert!(
        msg.starts_with(
            "recipe.lua:3: a taper batch has no `sizee`; did you mean `size`? Its methods and fields: size, indices"
        ),
        "{msg}"
    );
}

/// A data error said where its source was made names that line: the one
/// line is the whole message, with no traceback under it.
#[test]
fn a_placed_data_error_has_no_traceback() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("latin1.csv");
    std::fs::write(&csv, b"a,b,city\n1,2,Z\xfcrich\n").unwrap();
    let e = run(&format!(
        "local d = taper.data.csv{{ path = {:?}, label = \"city\" }}",
        csv.to_str().unwrap()
    ))
    .expect_err("not UTF-8");
    let msg = render_error(&e);
    assert!(
        msg.starts_with("data: recipe.lua:1: taper.data.csv: "),
        "{msg}"
    );
    let path = csv.display();
    let utf8 = dir.path().join("latin1.utf8.csv");
    assert!(
        msg.ends_with(&format!(
            "latin1.csv: line 2, offset 14: byte 0xFC is not UTF-8; a file saved in Latin-1 or Windows-1252 (`\u{e9}` as one byte)? convert it: iconv -f WINDOWS-1252 -t UTF-8 {path} > {}",
            utf8.display()
        )),
        "{msg}"
    );
}

/// A CSV file's `target` is a number to predict: trained with the
/// cross-entropy it is refused with the loss to use; its cells must be
/// numbers; and the column cannot also be a feature.
#[test]
fn a_csv_target_is_a_number_for_the_mean_squared_error() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    std::fs::write(&csv, "a,b,y\n1,2,0.5\n3,4,1.5\n5,6,2.5\n").unwrap();
    let path = csv.to_str().unwrap();
    let e = run(&format!(
        "local d = taper.data.csv{{ path = {path:?}, target = \"y\" }}:batch(2)\n\
         local run = taper.run{{ model = taper.model.mlp{{ inputs = 2, outputs = 2 }}, data = d }}\n\
         for _ in run:epochs(1) do for b in run:batches() do run:step(b) end end"
    ))
    .expect_err("numbers are not classes");
    let msg = render_error(&e);
    assert!(
        msg.contains("the targets are numbers (a regression target), and the loss (cross-entropy) takes class labels: train numbers with `loss = taper.loss.mse{}`"),
        "{msg}"
    );
    let e = run(&format!(
        "local d = taper.data.csv{{ path = {path:?}, target = \"y\" }}:batch(2)\n\
         local run = taper.run{{ model = taper.model.mlp{{ inputs = 2, outputs = 3 }}, loss = taper.loss.mse{{}}, data = d }}\n\
         for _ in run:epochs(1) do for b in run:batches() do run:step(b) end end"
    ))
    .expect_err("one target, three outputs");
    let msg = render_error(&e);
    assert!(
        msg.contains("each sample has 1 target value, and the model gives 3 (its `outputs`)"),
        "{msg}"
    );
    std::fs::write(&csv, "a,b,y\n1,2,0.5\n3,4,heavy\n").unwrap();
    let msg = recipe_error(run(&format!(
        "taper.data.csv{{ path = {path:?}, target = \"y\" }}"
    )));
    assert!(
        msg.contains("line 3, column 3 (`y`): target `heavy` is not a finite number"),
        "{msg}"
    );
    let msg = recipe_error(run(&format!(
        "taper.data.csv{{ path = {path:?}, target = \"y\", features = {{ \"a\", \"y\" }} }}"
    )));
    assert!(
        msg.contains("column 3 (`y`) is the target; it cannot be a feature too"),
        "{msg}"
    );
    // A target with decimal commas says how to read them; so read, it is.
    std::fs::write(&csv, "a;y\n1;2,5\n3;4\n").unwrap();
    let msg = recipe_error(run(&format!(
        "taper.data.csv{{ path = {path:?}, target = \"y\", delimiter = \";\" }}"
    )));
    assert!(
        msg.contains("target `2,5` is not a finite number with `.` as the decimal mark; it reads as one with a decimal comma: give `decimal = \",\"`"),
        "{msg}"
    );
    run(&format!(
        r#"local d = taper.data.csv{{ path = {path:?}, target = "y", delimiter = ";", decimal = "," }}
        for b in d:batch(2):map(function(x, y)
          assert(y[1][1] == 2.5 and y[2][1] == 4, y[1][1])
          return {{ x = x, y = y, y_type = "f32" }}
        end):batches() do end"#
    ))
    .unwrap();
}

/// A data error's rendering (exit code 2, as for bad input), which names
/// the recipe's line where the data was made.
fn data_error(r: taper::Result<taper::host::Report>) -> String {
    let e = r.expect_err("the data should be refused");
    let msg = render_error(&e);
    assert_eq!(e.exit_code(), 2, "not an input error: {msg}");
    assert!(msg.starts_with("data: recipe.lua:"), "{msg}");
    msg
}

/// `categorical`: columns of categories, one-hot encoded in place. Found
/// categories are sorted; `data:categories()` gives them to a second file's
/// `categorical`, whose cells outside them are an error naming line and
/// column; given categories keep their order; a misnamed column, one not
/// among the features and a text cell in a number column say what to do.
#[test]
fn csv_columns_of_categories_are_one_hot_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.csv");
    let test = dir.path().join("test.csv");
    std::fs::write(
        &train,
        "island,mass,sex,species\nDream,3.5,male,a\nBiscoe,4.25,female,b\nDream,3.0,female,a\n",
    )
    .unwrap();
    std::fs::write(&test, "island,mass,sex,species\nTorgersen,3.5,male,a\n").unwrap();
    let (train, test) = (train.to_str().unwrap(), test.to_str().unwrap());
    let report = run(&format!(
        r#"local d = taper.data.csv{{ path = {train:?}, label = "species", categorical = {{ "island", "sex" }} }}
        assert(table.concat(d:feature_names(), " ") == "island_Biscoe island_Dream mass sex_female sex_male",
          table.concat(d:feature_names(), " "))
        local rows = {{}}
        for b in d:batch(3):map(function(x, y)
          for i = 1, #x do rows[i] = table.concat(x[i], " ") end
          return {{ x = x, y = y }}
        end):batches() do end
        assert(rows[1] == "0.0 1.0 3.5 0.0 1.0" and rows[2] == "1.0 0.0 4.25 1.0 0.0"
          and rows[3] == "0.0 1.0 3.0 1.0 0.0",
          table.concat(rows, " | "))
        -- `scale` divides the numbers, not the one-hot inputs.
        local scaled = taper.data.csv{{ path = {train:?}, label = "species", categorical = {{ "island", "sex" }}, scale = 2 }}
        for b in scaled:batch(1):map(function(x, y)
          assert(table.concat(x[1], " ") == "0.0 1.0 1.75 0.0 1.0", table.concat(x[1], " "))
          return {{ x = x, y = y }}
        end):batches() do break end
        local c = d:categories()
        assert(table.concat(c.island, ",") == "Biscoe,Dream" and table.concat(c.sex, ",") == "female,male")
        -- Given categories, in their order, and a mixed table.
        local g = taper.data.csv{{ path = {train:?}, label = "species",
          categorical = {{ "island", sex = {{ "male", "female", "other" }} }} }}
        assert(table.concat(g:feature_names(), " ") == "island_Biscoe island_Dream mass sex_male sex_female sex_other",
          table.concat(g:feature_names(), " "))
        local run = taper.run{{ model = taper.model.mlp{{ inputs = #d:feature_names(), outputs = 2 }},
          data = d:batch(2) }}
        for _ in run:epochs(1) do for b in run:batches() do run:step(b) end end
        taper.data.csv{{ path = {test:?}, label = "species", categorical = d:categories() }}"#
    ));
    let msg = data_error(report);
    assert!(
        msg.starts_with("data: recipe.lua:28: taper.data.csv: ")
            && msg.contains(
                "line 2, column 1 (`island`): `Torgersen` is not one of the categories (`Biscoe`, `Dream`)"
            ),
        "{msg}"
    );
    // A file read with its own categories gives the model other inputs:
    // evaluated, it is refused, naming the first that moved.
    std::fs::write(
        dir.path().join("other.csv"),
        "island,mass,sex,species\nTorgersen,3.5,male,a\nDream,3.5,female,b\n",
    )
    .unwrap();
    let other = dir.path().join("other.csv");
    let msg = data_error(run(&format!(
        r#"local d = taper.data.csv{{ path = {train:?}, label = "species", categorical = {{ "island", "sex" }} }}
        local run = taper.run{{ model = taper.model.mlp{{ inputs = 5, outputs = 2 }}, data = d:batch(2) }}
        run:evaluate(taper.data.csv{{ path = {other:?}, label = "species", categorical = {{ "island", "sex" }} }})"#
    )));
    assert!(
        msg.contains("recipe.lua:3: run:evaluate")
            && msg.contains("all's inputs (5) are not the run's (5): without `island_Biscoe`, with `island_Torgersen` besides")
            && msg.contains("input 0 is `island_Dream` in all's and `island_Biscoe` in the run's")
            && msg.contains("categorical = train:categories()"),
        "{msg}"
    );
    // Resumed on a file whose categories moved: refused, naming them.
    let out = dir.path().join("run");
    let recipe = |path: &std::path::Path| {
        format!(
            r#"local d = taper.data.csv{{ path = {path:?}, label = "species", categorical = {{ "island", "sex" }} }}
            local run = taper.run{{ model = taper.model.mlp{{ inputs = 5, outputs = 2 }}, data = d:batch(2) }}
            for _ in run:epochs(1) do for b in run:batches() do run:step(b) end end"#
        )
    };
    let host = |resume: Option<std::path::PathBuf>| {
        Host::new(HostOptions {
            out_dir: Some(out.clone()),
            resume,
            quiet: true,
            ..HostOptions::default()
        })
    };
    host(None)
        .unwrap()
        .run_source("recipe.lua", &recipe(std::path::Path::new(train)))
        .unwrap();
    let e = host(Some(out.join("checkpoint.safetensors")))
        .unwrap()
        .run_source("recipe.lua", &recipe(&other))
        .expect_err("other inputs");
    let msg = render_error(&e);
    assert_eq!(e.exit_code(), 2, "{msg}");
    assert!(
        msg.contains("the data's inputs (5) are not the checkpoint's (5): without `island_Biscoe`"),
        "{msg}"
    );
    let msg = data_error(run(&format!(
        r#"taper.data.csv{{ path = {train:?}, label = "species", categorical = {{ "isle" }} }}"#
    )));
    assert!(
        msg.contains("categorical column `isle` is not in the header, which names `island`, `mass`, `sex`, `species`"),
        "{msg}"
    );
    let msg = data_error(run(&format!(
        r#"taper.data.csv{{ path = {train:?}, label = "species", features = {{ "mass" }}, categorical = {{ "sex" }} }}"#
    )));
    assert!(
        msg.contains(
            "column 3 (`sex`) is categorical but not among the features; add it to `features`"
        ),
        "{msg}"
    );
    let msg = data_error(run(&format!(
        r#"taper.data.csv{{ path = {train:?}, label = "species", categorical = {{ "island" }} }}"#
    )));
    assert!(
        msg.contains("line 2, column 3 (`sex`): `male` is not a number (a column of categories is one-hot encoded with `categorical = { \"sex\" }`; choose the columns with `features = { ... }`)"),
        "{msg}"
    );
    let msg = data_error(run(&format!(
        r#"taper.data.csv{{ path = {train:?}, label = "species", categorical = {{ "island", sex = {{}} }} }}"#
    )));
    assert!(
        msg.contains("column 3 (`sex`): no categories are given"),
        "{msg}"
    );
}

/// `run:evaluate` of a classifier returns its scores class by class: without
/// class names `per_class` is keyed by label (0 the first), each class's
/// support is its row of `confusion`, and those rows hold every sample.
#[test]
fn evaluate_scores_a_classifier_class_by_class() -> Result<()> {
    run(r#"
local run = taper.run{ model = taper.model.mlp{ inputs = 64, hidden = { 32 }, outputs = 10 },
  data = taper.data.digits{ split = "train" }:batch(32) }
for _ in run:epochs(2) do for b in run:batches() do run:step(b) end end
local r = run:evaluate(taper.data.digits{ split = "test" })
assert(#r.confusion == 10, #r.confusion)
local total, right, f1 = 0, 0, 0
for label = 0, 9 do
  local row, s = r.confusion[label + 1], 0
  for _, c in ipairs(row) do s = s + c end
  assert(r.per_class[label].support == s, label)
  assert(r.per_class[label].recall == row[label + 1] / s, label)
  total, right, f1 = total + s, right + row[label + 1], f1 + r.per_class[label].f1
end
assert(total == r.samples and right / total == r.accuracy, right)
assert(math.abs(f1 / 10 - r.macro_f1) < 1e-12, r.macro_f1)
assert(r.balanced_accuracy > 0 and r.balanced_accuracy <= 1)
"#)?;
    Ok(())
}

/// A key inside a list's braces (`features = { "a", "b", label = "c" }`,
/// a misplaced brace) was dropped, and the run trained on the default
/// label. It is an error naming the option and the key.
#[test]
fn a_named_entry_inside_a_list_is_an_error_not_dropped() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let csv = dir.path().join("t.csv");
    std::fs::write(&csv, "a,b,kind\n1,2,x\n3,4,y\n")?;
    let msg = recipe_error(run(&format!(
        "local d = taper.data.csv{{ path = {:?},\n  features = {{ \"a\", \"b\", label = \"kind\" }} }}",
        csv.display().to_string()
    )));
    assert!(
        msg.starts_with("recipe.lua:1: taper.data.csv: option `features` is a list with a named entry (`label = ...`)"),
        "{msg}"
    );
    let msg = recipe_error(run(
        "taper.model.mlp{ inputs = 2, hidden = { 8, extra = 3 }, outputs = 2 }",
    ));
    assert!(
        msg.contains("option `hidden` is a list with a named entry (`extra = ...`)"),
        "{msg}"
    );
    let msg = recipe_error(run("taper.optim.adamw{ 0.1, lr = 1e-3 }"));
    assert!(
        msg.contains("the options table is a list with a named entry (`lr = ...`)"),
        "{msg}"
    );
    // `categorical` takes a list with named entries: columns, some with
    // their categories.
    run(&format!(
        "local d = taper.data.csv{{ path = {:?}, label = \"kind\", categorical = {{ \"a\", b = {{ \"2\", \"4\" }} }} }}\nassert(#d:feature_names() == 4)",
        csv.display().to_string()
    ))?;
    Ok(())
}

/// A CSV column of text and a BERT: options that cannot work are errors at
/// the recipe's line, saying what to give.
#[test]
fn text_columns_and_bert_options_are_checked_where_they_are_given() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    std::fs::write(&csv, "text,label\nthe cat,a\n").unwrap();
    let csv = csv.display();
    let electra = dir.path().join("electra");
    std::fs::create_dir(&electra).unwrap();
    std::fs::write(electra.join("config.json"), r#"{"model_type": "electra"}"#).unwrap();
    for (src, says) in [
        (
            format!("taper.data.csv{{ path = '{csv}', text = 'text', label = 'label' }}"),
            "a column of `text` needs the model's `tokenizer`",
        ),
        (
            format!("taper.data.csv{{ path = '{csv}', label = 'label', tokenizer = 't.json' }}"),
            "`tokenizer` and `context` are for a column of text",
        ),
        (
            format!("taper.data.csv{{ path = '{csv}', text = 'text', features = {{ 'text' }}, tokenizer = 't.json' }}"),
            "give `features` (number columns) or `text`, not both",
        ),
        (
            format!("taper.data.csv{{ path = '{csv}', text = 'text', tokenizer = 't.json', context = 0 }}"),
            "`context` must be at least 1",
        ),
        (
            format!("taper.data.csv{{ path = '{csv}', text = {{ 'a', 'b', 'c' }}, tokenizer = 't.json' }}"),
            "`text` is one column, or two for text pairs (`{ \"premise\", \"hypothesis\" }`), not 3",
        ),
        (
            format!("taper.data.csv{{ path = '{csv}', text = 'text', tokenizer = '{}/none.json' }}", dir.path().display()),
            "none.json",
        ),
        (
            "taper.model.bert{ outputs = 2 }".to_string(),
            "option `from` (a transformers BERT, DistilBERT or RoBERTa folder) is required",
        ),
        (
            format!("taper.model.bert{{ from = '{}' }}", dir.path().display()),
            "option `outputs` (one per class: `#train:classes()`) is required",
        ),
        (
            format!("taper.model.bert{{ from = '{}', outputs = 2 }}", dir.path().display()),
            "config.json",
        ),
        (
            format!("taper.model.bert{{ from = '{}', outputs = 2 }}", electra.display()),
            "model_type `electra` is not bert, nor one of the classifiers taper.model.bert computes like it (distilbert, roberta, xlm-roberta)",
        ),
        (
            "taper.model.gpt{ vocab = 10, context = 8, dropout = 1 }".to_string(),
            "dropout 1 is not a rate in [0, 1)",
        ),
        (
            "taper.model.mlp{ inputs = 4, outputs = 2, dropout = -0.5 }".to_string(),
            "dropout -0.5 is not a rate in [0, 1)",
        ),
        (
            format!("taper.model.bert{{ from = '{}', outputs = 2, dropout = 1 }}", electra.display()),
            "option `dropout` must be a rate from 0 up to (not including) 1, got 1",
        ),
        (
            format!("taper.model.bert{{ from = '{}', outputs = 2, attention_dropout = 'x' }}", electra.display()),
            "option `attention_dropout` must be a rate",
        ),
    ] {
        let msg = recipe_error(run(&format!("local x = 1\n{src}\n")));
        assert!(msg.starts_with("recipe.lua:2: "), "{msg}");
        assert!(msg.contains(says), "{src}: {msg}");
    }
}
