//! `taper train` and `taper check`: the host's options from the flags, the
//! run, and what is said when it ends.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use taper::{Host, HostOptions};

use super::args::TrainArgs;

/// `taper train`'s host options: the output folder (a data-parallel rank
/// joins rank 0's), what to resume from, and the flags. Bad input is told
/// here, before anything runs, as the exit code to leave with.
/// With them, the folder's lock when the folder exists (see
/// `taper::host::FolderLock`): to be held until the host has taken it too.
pub fn train_options(
    a: TrainArgs,
) -> Result<(PathBuf, HostOptions, Option<taper::host::FolderLock>), ExitCode> {
    let told = |e: taper::Error| {
        taper::tell!("taper: {e}");
        ExitCode::from(e.exit_code())
    };
    // `--resume RUN_DIR` continues in that folder unless --out says
    // otherwise; `--resume auto` continues in --out if it holds a run.
    let mut out = a.out.or_else(|| a.resume.clone().filter(|r| r.is_dir()));
    // One of several data-parallel ranks (mpirun, taper launch)?
    let world = taper::dist::init(
        a.rank_timeout,
        taper::run::interrupt::requested,
        a.collective,
    )
    .map_err(|e| {
        taper::tell!("taper: {e}");
        ExitCode::from(2)
    })?;
    if let Some(w) = world {
        taper::run::interrupt::set_patient();
        out = Some(join_world(w, out.take(), &a.recipe.recipe, a.watch).map_err(told)?);
    }
    let writer = taper::dist::rank() == 0;
    let auto = a.resume.as_deref() == Some(Path::new("auto"));
    // The folder whose later runs (a distilled student) resume too.
    let folder = match a.resume.as_deref() {
        Some(_) if auto => out.clone(),
        Some(r) if r.is_dir() => Some(r.to_path_buf()),
        _ => None,
    };
    // The folder is this run's before its checkpoints are looked at (a
    // resume sets a damaged one aside): another taper running in it is
    // refused here.
    let lock = match out.as_deref().filter(|d| writer && d.is_dir()) {
        Some(dir) => taper::host::FolderLock::take(dir).map_err(told)?,
        None => None,
    };
    // A checkpoint that cannot be resumed from is bad input: said before
    // anything runs.
    let resume = a
        .resume
        .map(|arg| taper::engine::checkpoint::resolve_resume(&arg, out.as_deref()))
        .transpose()
        .map_err(|e| {
            taper::tell!("taper: {e}");
            ExitCode::from(2)
        })?
        .flatten()
        .map(|(path, notes)| {
            for n in notes {
                taper::tell!("taper: warning: {n}");
            }
            path
        });
    // `--resume auto` in a folder of a run stopped before its first
    // checkpoint: nothing to continue, so it starts over, and says so.
    if let (true, None, Some(dir)) = (auto && writer, &resume, out.as_deref()) {
        let records = dir.join("metrics.jsonl");
        if std::fs::metadata(&records).is_ok_and(|m| m.len() > 0) {
            taper::tell!(
                "taper: --resume auto: {} holds no checkpoint (the run before stopped before its first save): starting at step 0; the records go on after the earlier ones",
                dir.display()
            );
        }
    }
    // A new run's own folder (rank 0 of several chose it in join_world).
    let out = match out {
        Some(out) => out,
        None if writer => claim_default_out(&a.recipe.recipe).map_err(told)?,
        None => default_out(&a.recipe.recipe),
    };
    let opts = HostOptions {
        device: a.device,
        seed: a.seed,
        // Only rank 0 of a data-parallel run writes records and checkpoints.
        out_dir: Some(out).filter(|_| writer),
        resume,
        resume_folder: folder,
        // The other ranks write to their log files, not a terminal.
        quiet: a.quiet && writer,
        check_only: false,
        overrides: a.recipe.set.clone(),
        mem_limit: a.mem_limit,
        inject_oom: a.inject_oom,
        watch: a.watch,
        checkpoint_every: a.checkpoint_every.map(|e| e.0),
        keep_checkpoints: a.keep_checkpoints.map(|k| k as usize),
        log_every: a.log_every,
        tensorboard: a.tensorboard && writer,
        reuse_out: auto,
    };
    Ok((a.recipe.recipe, opts, lock))
}

/// Runs a recipe (`train` or `check`) and says how it ended.
pub fn run_recipe(recipe: &Path, opts: HostOptions) -> ExitCode {
    let check = opts.check_only;
    let quiet = opts.quiet;
    if !check {
        // Ctrl-C, SIGTERM, SIGHUP: stop at the next step with a checkpoint.
        if let Err(e) = taper::run::interrupt::install() {
            taper::tell!("taper: cannot handle signals ({e}): a signal will end the run without a checkpoint");
        }
    }
    let mut host = match Host::new(opts) {
        Ok(h) => h,
        Err(e) => {
            taper::tell!("taper: {}", taper::host::render_error(&e));
            return ExitCode::from(e.exit_code());
        }
    };
    match host.run_file(recipe) {
        Ok(report) => {
            // Every rank completed: MPI can end (after a failure a rank may
            // be gone, and the launcher ends the others).
            taper::dist::finish();
            if check {
                say!("{}: ok", recipe.display());
            } else if let (false, Some(m)) = (quiet, report.metrics) {
                say!("metrics: {}", m.display());
                for c in host.checkpoints() {
                    say!("checkpoint: {}", c.display());
                }
                for b in report.runs.iter().filter_map(|r| r.best.as_ref()) {
                    if let Some(p) = &b.path {
                        say!("best: {p} ({})", b.describe());
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => ended(&host, &e),
    }
}

/// A run that ended early: a failure, a signal or `os.exit`. Says where its
/// checkpoints are, and how to continue.
pub fn ended(host: &Host, e: &taper::Error) -> ExitCode {
    // A signal or os.exit is an ending, not a failure: no traceback.
    let told = match (e.interrupted(), e.exited()) {
        (Some(sig), _) => taper::Error::Interrupted(sig).to_string(),
        (_, Some(code)) => taper::Error::Exited(code).to_string(),
        _ => taper::host::render_error(e),
    };
    taper::tell!("taper: {told}");
    if let (Some(w), Some(_)) = (taper::dist::world(), e.interrupted()) {
        // Every rank was asked to stop: they leave together, once
        // rank 0 has written its checkpoint.
        let _ = w.farewell(std::time::Duration::from_secs(60));
    }
    let ending = e.exit_code() == 3 || e.interrupted().is_some();
    if taper::dist::rank() != 0 {
        // Rank 0 writes the run's checkpoints.
    } else if host.checkpoints().is_empty() && ending {
        // Nothing to continue from, and nothing lost: no step was taken.
        taper::tell!("taper: no checkpoint: the run had taken no step");
    }
    for c in host.checkpoints() {
        let folder = c.parent().unwrap_or(Path::new("."));
        taper::tell!(
            "taper: checkpoint written to {} (continue with --resume {})",
            c.display(),
            folder.display()
        );
    }
    // A checkpoint that could not be written (a full disk): the one an
    // earlier save left. Not when no save was tried (a resume refused before
    // its run existed: the same --resume would fail again). A diverged run's
    // error names it already.
    let diverged = e.find(|e| matches!(e, taper::Error::Diverged(_)));
    let failed = e.exit_code() == 1 && !diverged && host.save_failed();
    if taper::dist::rank() == 0 && host.checkpoints().is_empty() && failed {
        if let Some(told) = host.out_dir().and_then(|d| earlier_checkpoint(&d)) {
            taper::tell!("taper: {told}");
        }
    }
    ExitCode::from(e.exit_code())
}

/// When the ending run wrote no checkpoint (its disk full, say): the newest
/// valid one an earlier save left in `folder`, and how to continue from it.
fn earlier_checkpoint(folder: &Path) -> Option<String> {
    use taper::engine::checkpoint;
    let latest = folder.join(checkpoint::file_name(1));
    let (path, _) = checkpoint::latest_valid(&latest, false).ok().flatten()?;
    let step = checkpoint::read_meta(&path).ok()?.step;
    Some(format!(
        "no checkpoint was written now; the newest one saved is {} (step {step}): continue from it with --resume {}",
        path.display(),
        folder.display()
    ))
}

/// A rank's start: one output folder (rank 0's), the others' lines into
/// their rank files; `--watch` is refused (ranks would reload at different
/// steps).
pub fn join_world(
    w: &dyn taper::dist::Collective,
    out: Option<PathBuf>,
    recipe: &Path,
    watch: bool,
) -> taper::Result<PathBuf> {
    if watch {
        return Err(taper::Error::Config(
            "--watch is not available with several ranks: they would apply an edit at different steps".into(),
        ));
    }
    let mine = match out {
        Some(out) => out,
        // Only rank 0's name is used, so only rank 0 creates its folder.
        None if w.rank() == 0 => claim_default_out(recipe)?,
        None => default_out(recipe),
    };
    let out = taper::dist::launch::agree_out(w, mine)?;
    if w.rank() != 0 {
        taper::dist::launch::log_to_rank_file(&out, w.rank())?;
    }
    Ok(out)
}

/// A new run's folder when `--out` is not given: `runs/<recipe>-<UTC time>`,
/// not created.
pub fn default_out(recipe: &Path) -> PathBuf {
    let stem = recipe.file_stem().and_then(|s| s.to_str()).unwrap_or("run");
    PathBuf::from("runs").join(format!("{stem}-{}", taper::host::utc_stamp()))
}

/// [`default_out`], created here and so this run's alone: a run started in
/// the same second as another (a sweep, a loop over seeds) takes the name
/// with `-2`, `-3` and so on, where it used to be refused (or, started at
/// the same moment, to append its records to the other's).
pub fn claim_default_out(recipe: &Path) -> taper::Result<PathBuf> {
    claim(&default_out(recipe))
}

fn claim(base: &Path) -> taper::Result<PathBuf> {
    if let Some(parent) = base.parent() {
        std::fs::create_dir_all(parent).map_err(|e| taper::Error::io(parent, e))?;
    }
    let mut name = base.as_os_str().to_owned();
    for n in 2.. {
        // create_dir fails if the folder exists, so two runs never both
        // succeed on one name.
        match std::fs::create_dir(&name) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                name = base.as_os_str().to_owned();
                name.push(format!("-{n}"));
            }
            Err(e) => return Err(taper::Error::io(Path::new(&name), e)),
        }
    }
    Ok(PathBuf::from(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_folder_taken_gets_the_next_number() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let base = dir.path().join("runs").join("digits-20261125-210942");
        assert_eq!(claim(&base)?, base);
        let second = claim(&base)?;
        assert_eq!(second, dir.path().join("runs/digits-20261125-210942-2"));
        assert_eq!(
            claim(&base)?,
            dir.path().join("runs/digits-20261125-210942-3")
        );
        assert!(second.is_dir());
        Ok(())
    }
}
