//! The commands other than `train` and `check`: plan, report, plugin,
//! launch, export, sample.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use taper::{Host, HostOptions};

use super::args::{ClassifyArgs, ExportArgs, PluginCmd, RecipeArgs, SampleArgs};
use super::train::{claim_default_out, default_out};

pub fn plugin(cmd: PluginCmd) -> ExitCode {
    use taper::plugins::scaffold;
    let result = match cmd {
        PluginCmd::Info { path } => scaffold::info(&path).map(|s| say!("{}", s.trim_end())),
        PluginCmd::New { name, dir, abi } => {
            let abi =
                abi.unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins/abi"));
            scaffold::new_plugin(&name, &dir, &abi).map(|root| {
                say!("wrote {}", root.display());
                say!("build it: cd {} && cargo build --release", root.display());
            })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            taper::tell!("taper: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// `taper plan`: runs the recipe without training, then prints each run's plan.
pub fn plan(recipe: &RecipeArgs, mem_limit: Option<usize>, margin: f64) -> ExitCode {
    use taper::memory::planner::human;
    let opts = HostOptions {
        check_only: true,
        overrides: recipe.set.clone(),
        ..HostOptions::default()
    };
    let result = Host::new(opts).and_then(|mut h| {
        h.run_file(&recipe.recipe)?;
        h.plans()
    });
    let plans = match result {
        Ok(p) => p,
        Err(e) => {
            taper::tell!("taper: {}", taper::host::render_error(&e));
            return ExitCode::from(e.exit_code());
        }
    };
    for (i, p) in plans.iter().enumerate() {
        let q = &p.plan;
        say!("run {}: {} (batch {})", i + 1, p.model, q.batch);
        say!("  parameters        {:>12}", human(q.parameters));
        say!(
            "  gradients         {:>12} (an accumulator, when the batch is split)",
            human(q.gradients)
        );
        say!("  optimizer state   {:>12}", human(q.optimizer));
        say!(
            "  activations       {:>12} per sample + {} per step (measured on {} samples)",
            human(q.per_sample),
            human(q.per_step),
            p.probes
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        say!(
            "  heap before training {:>9} (data, Lua, the model)",
            human(q.resident)
        );
        say!(
            "  estimated peak at micro-batch {}: {}",
            q.batch,
            human(q.peak(q.batch, false))
        );
        if let (None, Some(host)) = (mem_limit, &p.host_limit) {
            say!(
                "  {}: a run keeps its heap under {}",
                host.describe(),
                p.limit.map_or_else(|| "?".into(), human)
            );
        }
        if let Some(limit) = mem_limit.or(p.limit) {
            match q.max_micro(limit, margin) {
                Some(m) if m >= q.batch => say!(
                    "  under {} with a {:.0}% margin: the whole batch fits",
                    human(limit),
                    margin * 100.0
                ),
                Some(m) => say!(
                    "  under {} with a {:.0}% margin: micro-batches of at most {m} (estimated peak {})",
                    human(limit),
                    margin * 100.0,
                    human(q.peak(m, false))
                ),
                None => say!(
                    "  under {}: does not fit even one sample at a time",
                    human(limit)
                ),
            }
        }
    }
    ExitCode::SUCCESS
}

pub fn report(runs: &[PathBuf], out: Option<PathBuf>) -> ExitCode {
    let out = out.unwrap_or_else(|| match runs {
        [one] => one.join("report.html"),
        _ => PathBuf::from("report.html"),
    });
    match taper::report::write(runs, &out) {
        Ok(notes) => {
            for n in notes {
                taper::tell!("taper: warning: {n}");
            }
            say!("report: {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            taper::tell!("taper report: {e}");
            ExitCode::from(2)
        }
    }
}

/// `taper launch`: the ranks under mpirun; its exit code is theirs.
pub fn launch(n: usize, args: &[String]) -> ExitCode {
    let recipe = args.iter().find(|a| !a.starts_with('-'));
    let recipe = Path::new(recipe.map_or("run", |r| r.as_str()));
    // The ranks' folder, created here unless the arguments name one.
    let out = if taper::dist::launch::names_out(args) {
        Ok(default_out(recipe))
    } else {
        claim_default_out(recipe)
    };
    let status = std::env::current_exe()
        .map_err(|e| taper::Error::Config(format!("taper launch: {e}")))
        .and_then(|exe| taper::dist::launch::launch(n, &exe, args, &out?));
    match status {
        Ok((s, _)) if s.success() => ExitCode::SUCCESS,
        // Stopped by a signal passed on to the ranks: 128 + its number, as
        // `taper train` exits.
        Ok((_, Some(sig))) => ExitCode::from((128 + sig).clamp(0, 255) as u8),
        Ok((s, None)) => ExitCode::from(s.code().map_or(1, |c| c.clamp(1, 255) as u8)),
        Err(e) => {
            taper::tell!("taper: {e}");
            ExitCode::from(2)
        }
    }
}

/// `taper export`.
pub fn export(a: ExportArgs) -> ExitCode {
    use taper::interop::saved::export_checkpoint;
    match export_checkpoint(&a.checkpoint, &a.out, &a.format, a.ty.as_deref(), a.merge) {
        Ok(w) => {
            say!(
                "exported {} ({}{}): {} bytes",
                a.out.display(),
                a.format,
                w.detail,
                w.bytes
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            taper::tell!("taper export: {e}");
            ExitCode::from(2)
        }
    }
}

/// `taper classify`: a line per image or CSV row, `FILE: CLASS 93.1%[, CLASS
/// 5.2%...]` or `FILE:LINE: ...`; for a regression run `FILE:LINE: 4211.7
/// body_mass_g[, 201.3 flipper_length_mm...]`.
pub fn classify(a: ClassifyArgs) -> ExitCode {
    use taper::interop::saved::{classify_checkpoint, classify_given_texts, Answer};
    let mut emit = |what: &str, answer: &Answer| match answer {
        Answer::Classes(best) => {
            let ranked: Vec<String> = best
                .iter()
                .map(|g| format!("{} {:.1}%", g.class, g.probability * 100.0))
                .collect();
            say!("{what}: {}", ranked.join(", "));
        }
        Answer::Values(values) => {
            let each: Vec<String> = values
                .iter()
                .map(|p| format!("{} {}", p.value as f32, p.target))
                .collect();
            say!("{what}: {}", each.join(", "));
        }
    };
    let mut skip =
        |what: &str, why: &str| taper::tell!("taper classify: {what}: passed over: {why}");
    let classified = match a.text.is_empty() {
        true => classify_checkpoint(
            &a.checkpoint,
            &a.images,
            a.top.unwrap_or(0),
            &mut emit,
            &mut skip,
        ),
        false => match given_texts(a.text, a.pair) {
            Ok(texts) => classify_given_texts(
                &a.checkpoint,
                texts,
                a.top.unwrap_or(0),
                &mut emit,
                &mut skip,
            ),
            Err(why) => Err(taper::Error::Config(why)),
        },
    };
    match classified {
        Ok(0) => {
            taper::tell!(
                "taper classify: no image files in the folders given, no rows in the CSV files, or no text"
            );
            ExitCode::from(2)
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            taper::tell!("taper classify: {e}");
            ExitCode::from(2)
        }
    }
}

/// `taper sample`.
pub fn sample(a: SampleArgs) -> ExitCode {
    use taper::interop::saved::{sample_checkpoint, Prompt};
    let prompt = match &a.chat {
        Some(message) => Prompt::Chat(message),
        None => Prompt::Text(&a.prompt),
    };
    match sample_checkpoint(&a.checkpoint, prompt, a.tokens, a.temperature, a.seed) {
        Ok(text) => {
            say!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            taper::tell!("taper sample: {e}");
            ExitCode::from(2)
        }
    }
}

/// `--text` and `--pair` as rows: each text alone, or with its pair's.
fn given_texts(texts: Vec<String>, pairs: Vec<String>) -> Result<Vec<Vec<String>>, String> {
    match (pairs.is_empty(), texts.len() == pairs.len()) {
        (true, _) => Ok(texts.into_iter().map(|t| vec![t]).collect()),
        (false, true) => Ok(texts
            .into_iter()
            .zip(pairs)
            .map(|(a, b)| vec![a, b])
            .collect()),
        (false, false) => Err(format!(
            "{} `--text` and {} `--pair`: give each text's pair, in order",
            texts.len(),
            pairs.len()
        )),
    }
}
