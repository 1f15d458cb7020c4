//! Streaming is bounded: a full shuffled, batched, prefetched epoch over a
//! 1 GiB memory-mapped token file keeps the process's peak resident size
//! (VmHWM, read by the recipe from /proc/self/status in a child `taper`
//! process) under 200 MiB.

use std::io::{BufWriter, Write};
use std::process::Command;

use anyhow::Result;

const RECIPE: &str = r#"
local data = taper.data.tokens{ path = arg_path, dtype = "u16", context = 256 }
  :shuffle{ seed = 1 }:batch(64):prefetch(4)
local batches, tokens = 0, 0
for b in data:batches() do
  batches = batches + 1
  tokens = tokens + b.size * 256
end
local hwm
for line in io.lines("/proc/self/status") do
  hwm = hwm or line:match("^VmHWM:%s+(%d+) kB")
end
print(("batches %d tokens %d vmhwm_kb %s"):format(batches, tokens, hwm))
"#;

#[test]
#[cfg(target_os = "linux")]
fn one_gib_token_file_streams_in_bounded_memory() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tokens.bin");
    let n_tokens: usize = 512 << 20; // 1 GiB of u16
    {
        let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(&path)?);
        let block: Vec<u8> = (0..(1u32 << 16))
            .flat_map(|t| (t as u16).to_le_bytes())
            .collect();
        for _ in 0..n_tokens / (1 << 16) {
            w.write_all(&block)?;
        }
    }
    assert_eq!(std::fs::metadata(&path)?.len(), 1 << 30);
    let recipe = dir.path().join("stream.lua");
    let path_lua = format!("{:?}", path.display().to_string());
    std::fs::write(&recipe, format!("local arg_path = {path_lua}\n{RECIPE}"))?;
    let out = Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(["train", recipe.to_str().unwrap(), "--out"])
        .arg(dir.path().join("out"))
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("batches"))
        .expect("the recipe reports");
    let fields: Vec<&str> = line.split_whitespace().collect();
    let windows = (n_tokens - 257) / 256 + 1;
    assert_eq!(fields[1].parse::<usize>()?, windows.div_ceil(64), "{line}");
    let hwm_kb: usize = fields[5].parse()?;
    eprintln!("{line}");
    assert!(hwm_kb < 200 * 1024, "peak RSS {} MiB", hwm_kb / 1024);
    Ok(())
}
