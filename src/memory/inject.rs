//! Specs for injected OOM faults (`--inject-oom`) and memory sizes
//! (`--mem-limit`).

use super::Phase;

/// An injected fault: step `step` (1-based) fails in `phase`, `times` times
/// in all (attempts at the step's batch, or at the next batch when the
/// policy skipped one).
#[derive(Debug, Clone, PartialEq)]
pub struct Injection {
    pub step: u64,
    pub phase: Phase,
    pub times: u32,
    /// In a data-parallel run: only this rank fails (None: every rank).
    pub rank: Option<usize>,
}

impl Injection {
    /// `step=5,phase=backward[,times=2][,rank=1]`.
    pub fn parse(s: &str) -> std::result::Result<Injection, String> {
        let (mut step, mut phase, mut times, mut rank) = (None, Phase::Forward, 1, None);
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}`: expected key=value"))?;
            match k {
                "step" => {
                    step = Some(
                        v.parse()
                            .map_err(|_| format!("step `{v}` is not a step number"))?,
                    )
                }
                "phase" => {
                    phase = Phase::parse(v)
                        .ok_or_else(|| format!("phase `{v}`: use {}", Phase::NAMES))?
                }
                "times" => {
                    times = v
                        .parse()
                        .map_err(|_| format!("times `{v}` is not a count"))?
                }
                "rank" => {
                    rank = Some(
                        v.parse()
                            .map_err(|_| format!("rank `{v}` is not a rank number"))?,
                    )
                }
                other => return Err(format!("unknown key `{other}` (step, phase, times, rank)")),
            }
        }
        let step = step.ok_or("step=N is required")?;
        if step == 0 {
            return Err("steps are numbered from 1".into());
        }
        Ok(Injection {
            step,
            phase,
            times,
            rank,
        })
    }
}

/// `512MiB`, `1GiB`, `300MB`, `4096`.
pub fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}`: expected a size like 512MiB"))?;
    let mult = match unit.trim() {
        "" | "B" => 1.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "`{s}`: unknown unit `{other}` (B, KB, MB, GB, KiB, MiB, GiB)"
            ))
        }
    };
    Ok((n * mult) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_injections_and_sizes() {
        assert_eq!(
            Injection::parse("step=5,phase=backward,times=2"),
            Ok(Injection {
                step: 5,
                phase: Phase::Backward,
                times: 2,
                rank: None
            })
        );
        assert_eq!(
            Injection::parse("step=5,phase=forward,rank=1").map(|i| i.rank),
            Ok(Some(1))
        );
        assert!(Injection::parse("phase=backward").is_err());
        assert!(Injection::parse("step=3,phase=sideways")
            .unwrap_err()
            .contains("sideways"));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12 parsecs").is_err());
    }
}
