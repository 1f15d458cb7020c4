//! Every code block in `docs/guide/` runs. A guide's ```lua blocks start with
//! `-- NAME.lua`: they are written to a fresh folder (with the repository's
//! `scripts/` and `plugins/` linked in), and each recipe among them is checked
//! with `taper check`; its ```sh blocks then run there in order, under
//! `bash -euo pipefail`, with `taper` on the PATH. Blocks marked `needs-gpu`
//! are only allowed in the GPU guide; blocks marked `needs-mpi` (the
//! data-parallel guide) run in a build with `--features mpi` (`.ci/run`).

use std::path::{Path, PathBuf};
use std::process::Command;

struct Block {
    lang: String,
    info: String,
    body: String,
    line: usize,
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                let mut words = info.split_whitespace();
                open = Some(Block {
                    lang: words.next().unwrap_or("").to_string(),
                    info: words.collect::<Vec<_>>().join(" "),
                    body: String::new(),
                    line: i + 1,
                });
            }
            (Some(_), Some(_)) => out.push(open.take().unwrap()),
            (Some(b), None) => {
                b.body.push_str(line);
                b.body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed code block");
    out
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run_guide(guide: &Path) -> (usize, usize) {
    let name = guide.file_name().unwrap().to_string_lossy().into_owned();
    let text = std::fs::read_to_string(guide).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for link in ["scripts", "plugins"] {
        std::os::unix::fs::symlink(root().join(link), dir.path().join(link)).unwrap();
    }
    let bin: PathBuf = Path::new(env!("CARGO_BIN_EXE_taper"))
        .parent()
        .unwrap()
        .into();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (mut ran, mut gpu) = (0, 0);
    let all = blocks(&text);
    let mpi = all.iter().filter(|b| b.info.contains("needs-mpi")).count();
    assert!(
        mpi == 0 || name == "data-parallel.md",
        "{name}: needs-mpi outside the data-parallel guide"
    );
    // The Lua files first: a shell block may train any of them.
    for b in all.iter().filter(|b| b.lang == "lua") {
        let file = b
            .body
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("-- "))
            .and_then(|l| l.split(':').next())
            .filter(|f| f.ends_with(".lua"))
            .unwrap_or_else(|| panic!("{name}:{}: a lua block starts with `-- NAME.lua`", b.line));
        std::fs::write(dir.path().join(file), &b.body).unwrap();
    }
    for b in &all {
        if b.info.contains("needs-gpu") {
            assert_eq!(
                name, "gpu.md",
                "{name}:{}: needs-gpu outside the GPU guide",
                b.line
            );
            gpu += 1;
            continue;
        }
        if b.info.contains("needs-mpi") && !cfg!(feature = "mpi") {
            continue;
        }
        let mut cmd = match b.lang.as_str() {
            "lua" if b.body.contains("taper.run") => {
                let file = b.body.lines().next().unwrap()[3..]
                    .split(':')
                    .next()
                    .unwrap()
                    .to_string();
                let mut c = Command::new(env!("CARGO_BIN_EXE_taper"));
                c.args(["check", &file]);
                c
            }
            "lua" => continue,
            "sh" => {
                let mut c = Command::new("bash");
                c.args(["-euo", "pipefail", "-c", &b.body]);
                c
            }
            other => panic!("{name}:{}: a `{other}` block this test cannot run", b.line),
        };
        let o = cmd
            .current_dir(dir.path())
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{name}:{} failed:\n{}\n{}{}",
            b.line,
            b.body,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        // A `grep -c` line must have counted something.
        let said = String::from_utf8_lossy(&o.stdout);
        if b.body.contains("grep -c") {
            assert!(
                said.lines().all(|l| l.trim() != "0"),
                "{name}:{}: a count of 0:\n{said}",
                b.line
            );
        }
        ran += 1;
    }
    (ran, gpu)
}

#[test]
fn every_code_block_in_the_guides_runs() {
    let mut guides: Vec<PathBuf> = std::fs::read_dir(root().join("docs/guide"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    guides.sort();
    assert!(guides.len() >= 6, "{guides:?}");
    let (mut ran, mut gpu) = (0, 0);
    for g in &guides {
        let (r, n) = run_guide(g);
        ran += r;
        gpu += n;
    }
    eprintln!(
        "{ran} blocks ran in {} guides; {gpu} need a GPU",
        guides.len()
    );
    assert!(ran >= 12, "{ran} blocks ran");
    assert_eq!(
        gpu, 2,
        "the GPU guide's two blocks, and no others, need a GPU"
    );
}
