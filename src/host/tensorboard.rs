//! `--tensorboard`: the run's records as TensorBoard scalars, in an event
//! file under `OUT/tensorboard/` (TFRecord framing: length, masked CRC-32C
//! of the length, an `Event` protobuf, its masked CRC-32C). Each process
//! writes a file of its own, so a resumed run adds one and TensorBoard reads
//! them together. Tags: `train/...` from `step` records, `epoch/...`,
//! `eval/<split>/...`, `memory/...` (MiB), `oom/micro_batch`; runs after a
//! recipe's first are prefixed `run2/`, ...

use std::path::Path;

use prost::Message;
use serde_json::{Map, Value};

use super::append::{Appender, Outage};
use crate::{Error, Result};

#[derive(Clone, PartialEq, Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    what: Option<What>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

#[derive(Clone, PartialEq, Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

#[derive(Clone, PartialEq, Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, tag = "2")]
    simple_value: f32,
}

/// TFRecord's masked CRC-32C.
fn masked_crc(bytes: &[u8]) -> u32 {
    let c = crc32c::crc32c(bytes);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

pub(crate) struct EventWriter {
    /// Waits out a full disk, as the records do.
    file: Appender,
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

const MIB: f64 = 1048576.0;

/// The scalars of one record: (tag, value).
fn scalars(event: &str, rec: &Map<String, Value>) -> Vec<(String, f64)> {
    let get = |k: &str| rec.get(k).and_then(Value::as_f64);
    let mut out = Vec::new();
    let mut put = |tag: String, v: Option<f64>| {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            out.push((tag, v));
        }
    };
    match event {
        "step" => {
            for k in [
                "loss",
                "lr",
                "samples_per_s",
                "tokens_per_s",
                "step_s",
                "data_wait_s",
                "micro_batch",
            ] {
                put(format!("train/{k}"), get(k));
            }
            put("memory/heap_mib".into(), get("memory").map(|b| b / MIB));
            put(
                "memory/heap_peak_mib".into(),
                get("memory_peak").map(|b| b / MIB),
            );
            put(
                "memory/device_used_mib".into(),
                get("device_memory_used").map(|b| b / MIB),
            );
            put(
                "memory/device_peak_mib".into(),
                get("device_memory_peak").map(|b| b / MIB),
            );
        }
        "epoch" => {
            for k in ["loss", "lr", "samples_per_s", "seconds"] {
                put(format!("epoch/{k}"), get(k));
            }
        }
        "eval" => {
            let split = rec.get("split").and_then(Value::as_str).unwrap_or("eval");
            for k in [
                "loss",
                "accuracy",
                "balanced_accuracy",
                "macro_f1",
                "objective",
                "rmse",
                "mae",
                "r2",
                "exact_match",
                "f1_micro",
                "f1_macro",
            ] {
                put(format!("eval/{split}/{k}"), get(k));
            }
            // A multi-label classifier's labels, each under its name.
            let per_label = rec.get("per_label").and_then(Value::as_array);
            for l in per_label.into_iter().flatten() {
                let name = l.get("label").and_then(Value::as_str).unwrap_or("label");
                put(
                    format!("eval/{split}/f1/{name}"),
                    l.get("f1").and_then(Value::as_f64),
                );
            }
            // A regression's targets, each under its name.
            let per_target = rec.get("per_target").and_then(Value::as_array);
            for t in per_target.into_iter().flatten() {
                let name = t.get("target").and_then(Value::as_str).unwrap_or("target");
                for k in ["rmse", "mae", "r2"] {
                    put(
                        format!("eval/{split}/{k}/{name}"),
                        t.get(k).and_then(Value::as_f64),
                    );
                }
            }
        }
        "oom" => put("oom/micro_batch".into(), get("new_micro_batch")),
        _ => {}
    }
    out
}

impl EventWriter {
    /// A new event file in `dir/tensorboard/`.
    pub fn create(dir: &Path) -> Result<EventWriter> {
        let dir = dir.join("tensorboard");
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "host".into());
        let path = dir.join(format!(
            "events.out.tfevents.{}.{host}.{}.taper",
            now() as u64,
            std::process::id()
        ));
        let mut w = EventWriter {
            file: Appender::open(&path)?,
        };
        w.write(&Event {
            wall_time: now(),
            step: 0,
            what: Some(What::FileVersion("brain.Event:2".into())),
        })?;
        // A disk with no room at the start is an error now, not a warning.
        w.file.finish()?;
        Ok(w)
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Writes the events still waiting for room on the disk.
    pub fn finish(&mut self) -> Result<()> {
        self.file.finish()
    }

    fn write(&mut self, e: &Event) -> Result<Outage> {
        let data = e.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        let mut rec = Vec::with_capacity(data.len() + 16);
        rec.extend_from_slice(&len);
        rec.extend_from_slice(&masked_crc(&len).to_le_bytes());
        rec.extend_from_slice(&data);
        rec.extend_from_slice(&masked_crc(&data).to_le_bytes());
        self.file.append(rec)
    }

    /// Writes a record's scalars (none for events without any).
    pub fn record(&mut self, event: &str, step: u64, rec: &Map<String, Value>) -> Result<Outage> {
        let run = rec.get("run").and_then(Value::as_u64).unwrap_or(1);
        let prefix = if run > 1 {
            format!("run{run}/")
        } else {
            String::new()
        };
        let value: Vec<SummaryValue> = scalars(event, rec)
            .into_iter()
            .map(|(tag, v)| SummaryValue {
                tag: format!("{prefix}{tag}"),
                simple_value: v as f32,
            })
            .collect();
        if value.is_empty() {
            return Ok(Outage::None);
        }
        self.write(&Event {
            wall_time: now(),
            step: step as i64,
            what: Some(What::Summary(Summary { value })),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regression_of_several_targets_charts_each_under_its_name() {
        let rec = serde_json::json!({
            "split": "test", "loss": 0.1, "rmse": 2.0, "mae": 1.25, "r2": 0.9,
            "per_target": [
                { "target": "body_mass_g", "rmse": 3.0, "mae": 2.0, "r2": 0.8 },
                { "target": "flipper_length_mm", "rmse": 1.0, "mae": 0.5, "r2": 1.0 },
            ],
        });
        let s = scalars("eval", rec.as_object().unwrap());
        for (tag, v) in [
            ("eval/test/rmse", 2.0),
            ("eval/test/r2", 0.9),
            ("eval/test/rmse/body_mass_g", 3.0),
            ("eval/test/mae/body_mass_g", 2.0),
            ("eval/test/r2/flipper_length_mm", 1.0),
        ] {
            assert!(s.contains(&(tag.to_string(), v)), "{tag}: {s:?}");
        }
        assert_eq!(s.len(), 4 + 6);
    }

    #[test]
    fn a_multi_label_classifier_charts_its_f1s_and_each_label() {
        let rec = serde_json::json!({
            "split": "test", "loss": 0.2, "accuracy": 0.9, "exact_match": 0.75,
            "f1_micro": 0.91, "f1_macro": 0.92,
            "per_label": [
                { "label": "gentoo", "precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 26 },
                { "label": "female", "precision": 0.9, "recall": 0.8, "f1": 0.85, "support": 36 },
            ],
        });
        let s = scalars("eval", rec.as_object().unwrap());
        for (tag, v) in [
            ("eval/test/exact_match", 0.75),
            ("eval/test/f1_micro", 0.91),
            ("eval/test/f1/gentoo", 1.0),
            ("eval/test/f1/female", 0.85),
        ] {
            assert!(s.contains(&(tag.to_string(), v)), "{tag}: {s:?}");
        }
        assert_eq!(s.len(), 5 + 2);
    }
}
