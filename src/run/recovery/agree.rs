//! Rank 0 decides and the other ranks follow: in a data-parallel run the
//! action taken after an OOM and the micro-batch cap after a clean step are
//! rank 0's policy's, sent to every rank, so that all of them split, retry
//! or stop alike.

use super::Recovery;
use crate::run::policy::{Action, OomEvent};
use crate::{Error, Result};

impl Recovery {
    /// The action every rank takes: rank 0's policy decides and tells the
    /// others (a policy that fails stops them all); in a single process,
    /// [`Recovery::decide`].
    pub(super) fn decide_everywhere(&mut self, ev: &OomEvent, attempt: u32) -> Result<Action> {
        let Some(w) = crate::dist::world() else {
            return self.decide(ev, attempt);
        };
        if w.rank() != 0 {
            self.events += 1;
            let mut bytes = Vec::new();
            w.broadcast_bytes(0, &mut bytes)?;
            return decode_action(&bytes);
        }
        let decided = self.decide(ev, attempt);
        let told = match &decided {
            Ok(a) => a.clone(),
            Err(e) => Action::Stop(format!("rank 0's OOM policy failed: {e}")),
        };
        w.broadcast_bytes(0, &mut encode_action(&told))?;
        decided
    }
}

/// The micro-batch cap every rank keeps after a clean step: what this
/// process's policy `decided`, or in a data-parallel run rank 0's.
pub(super) fn cap(decided: Result<Option<usize>>) -> Result<Option<usize>> {
    Ok(match crate::dist::world() {
        None => decided?,
        Some(w) => {
            let mut bytes = match (w.rank(), &decided) {
                (0, Ok(Some(m))) => m.to_string().into_bytes(),
                (0, Ok(None)) => b"-".to_vec(),
                (0, Err(_)) => b"error".to_vec(),
                _ => Vec::new(),
            };
            w.broadcast_bytes(0, &mut bytes)?;
            decided?;
            match bytes.as_slice() {
                b"-" => None,
                b"error" => {
                    return Err(Error::Peer("rank 0's OOM policy failed in on_step".into()))
                }
                m => Some(String::from_utf8_lossy(m).parse().map_err(|_| {
                    Error::Peer("rank 0 sent a micro-batch that is not a number".into())
                })?),
            }
        }
    })
}

/// An action as rank 0 sends it to the others.
fn encode_action(a: &Action) -> Vec<u8> {
    match a {
        Action::Split(Some(m)) => format!("split {m}"),
        Action::Split(None) => "split".into(),
        Action::Retry => "retry".into(),
        Action::Precision(p) => format!("precision {}", p.name()),
        Action::Recompute(n) => format!("recompute {n}"),
        Action::Offload => "offload".into(),
        Action::Skip => "skip".into(),
        Action::Stop(why) => format!("stop {why}"),
    }
    .into_bytes()
}

fn decode_action(bytes: &[u8]) -> Result<Action> {
    let s = String::from_utf8_lossy(bytes);
    let (name, arg) = s.split_once(' ').unwrap_or((&s, ""));
    let bad = || {
        Error::Peer(format!(
            "rank 0 sent an action this rank cannot read: `{s}`"
        ))
    };
    Ok(match name {
        "split" if arg.is_empty() => Action::Split(None),
        "split" => Action::Split(Some(arg.parse().map_err(|_| bad())?)),
        "retry" => Action::Retry,
        "precision" => {
            Action::Precision(crate::engine::precision::Precision::parse(arg).ok_or_else(bad)?)
        }
        "recompute" => Action::Recompute(arg.parse().map_err(|_| bad())?),
        "offload" => Action::Offload,
        "skip" => Action::Skip,
        "stop" => Action::Stop(arg.to_string()),
        _ => return Err(bad()),
    })
}
