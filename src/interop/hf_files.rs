//! A transformers model folder's files: `config.json` and the weights, one
//! `model.safetensors` or, as `save_pretrained` writes a model larger than
//! its `max_shard_size`, safetensors shards listed by
//! `model.safetensors.index.json` (its `weight_map`: each tensor's shard).

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

use candle_core::{Device, Tensor};
use serde_json::Value;

use crate::{Error, Result};

/// The shards' index transformers writes beside them.
pub const INDEX: &str = "model.safetensors.index.json";

/// A transformers model's files from `path` (its folder, its
/// `model.safetensors`, or its shards' index, with `config.json` beside
/// it): the weights' path (the one file, or the index), the config's path
/// and the config. `what` names the model in errors.
pub(super) fn folder(path: &Path, what: &str) -> Result<(PathBuf, PathBuf, Value)> {
    if !path.exists() {
        return Err(Error::Config(format!(
            "{}: not found (a transformers {what} folder, or its model.safetensors)",
            path.display()
        )));
    }
    let (dir, weights) = if path.is_dir() {
        let one = path.join("model.safetensors");
        let index = path.join(INDEX);
        let weights = if !one.exists() && index.exists() {
            index
        } else {
            one
        };
        (path.to_path_buf(), weights)
    } else {
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        (dir, path.to_path_buf())
    };
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|e| Error::io(&config_path, e))?;
    let c: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Config(format!("{}: not JSON: {e}", config_path.display())))?;
    Ok((weights, config_path, c))
}

/// Whether `weights` is a shards' index rather than a safetensors file.
fn is_index(weights: &Path) -> bool {
    weights
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".index.json"))
}

/// The tensors of the `weights` [`folder`] found (every shard's, for an
/// index), whose config is `c`. A shard the index names that is missing,
/// a tensor the index places in a shard that lacks it, and a tensor in two
/// shards are errors naming the files.
pub(super) fn load_weights(weights: &Path, c: &Value) -> Result<HashMap<String, Tensor>> {
    if !weights.exists() {
        let dir = weights.parent().unwrap_or(Path::new("."));
        return Err(Error::Config(missing_weights(dir, weights, c)));
    }
    let load = |file: &Path| {
        candle_core::safetensors::load(file, &Device::Cpu)
            .map_err(|e| Error::Config(format!("{}: {e}", file.display())))
    };
    if !is_index(weights) {
        return load(weights);
    }
    let map = weight_map(weights)?;
    let mut tensors = HashMap::new();
    let mut held_by: HashMap<String, PathBuf> = HashMap::new();
    for file in shard_files(weights, &map)? {
        for (name, t) in load(&file)? {
            if let Some(other) = held_by.insert(name.clone(), file.clone()) {
                return Err(Error::Config(format!(
                    "{}: tensor `{name}` is in two shards, {} and {}",
                    weights.display(),
                    other.display(),
                    file.display()
                )));
            }
            tensors.insert(name, t);
        }
    }
    if let Some((name, shard)) = map.iter().find(|(n, _)| !tensors.contains_key(*n)) {
        return Err(Error::Config(format!(
            "{}: tensor `{name}` is listed in shard `{shard}`, which does not hold it",
            weights.display()
        )));
    }
    Ok(tensors)
}

/// The safetensors files of `weights`: the file itself, or the shards its
/// index lists, in name order (each checked to exist).
pub(super) fn weight_files(weights: &Path) -> Result<Vec<PathBuf>> {
    match is_index(weights) {
        true => shard_files(weights, &weight_map(weights)?),
        false => Ok(vec![weights.to_path_buf()]),
    }
}

/// An index's `weight_map`: each tensor's shard file name.
fn weight_map(index: &Path) -> Result<BTreeMap<String, String>> {
    let bad = |why: String| Error::Config(format!("{}: {why}", index.display()));
    let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = v["weight_map"].as_object().ok_or_else(|| {
        bad("no `weight_map` (each tensor's shard), as transformers writes".into())
    })?;
    map.iter()
        .map(|(name, file)| match file.as_str() {
            Some(f) => Ok((name.clone(), f.to_string())),
            None => Err(bad(format!(
                "`weight_map`: `{name}` is {file}, not a file name"
            ))),
        })
        .collect()
}

/// The shard files `map` names, beside `index`, in name order.
fn shard_files(index: &Path, map: &BTreeMap<String, String>) -> Result<Vec<PathBuf>> {
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut names: Vec<&String> = map.values().collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let plain = Path::new(name)
                .components()
                .all(|c| matches!(c, Component::Normal(_)));
            let file = dir.join(name);
            if !plain {
                return Err(Error::Config(format!(
                    "{}: shard `{name}` is not a file name in the index's folder",
                    index.display()
                )));
            }
            if !file.exists() {
                let count = map.values().filter(|f| *f == name).count();
                return Err(Error::Config(format!(
                    "{}: not found; the index ({}) places {count} tensors in it",
                    file.display(),
                    index.display()
                )));
            }
            Ok(file)
        })
        .collect()
}

/// Why a folder's `weights` are missing, and, for transformers' older
/// pickle files, how to write them as taper reads them. `c` is the
/// folder's config, whose class the advice loads them with.
fn missing_weights(dir: &Path, weights: &Path, c: &Value) -> String {
    let class = c["architectures"][0].as_str().unwrap_or("AutoModel");
    if dir.join("pytorch_model.bin").exists() {
        format!(
            "{}: not found; the folder's weights are PyTorch's pickle (pytorch_model.bin), which taper does not read: write them as safetensors with `transformers.{class}.from_pretrained(\"{d}\").save_pretrained(\"{d}\")` (in Python)",
            weights.display(),
            d = dir.display()
        )
    } else {
        format!(
            "{}: not found (the folder has no model.safetensors, nor shards and their {INDEX})",
            weights.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Writes a safetensors file of 1-D f32 tensors `names` (value `i` for
    /// the `i`-th) as `dir/file`.
    fn shard(dir: &Path, file: &str, names: &[&str]) {
        let tensors: HashMap<String, Tensor> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let t = Tensor::new(&[i as f32, 1.0], &Device::Cpu).unwrap();
                (n.to_string(), t)
            })
            .collect();
        candle_core::safetensors::save(&tensors, dir.join(file)).unwrap();
    }

    fn index(dir: &Path, map: Value) -> PathBuf {
        let path = dir.join(INDEX);
        let v = json!({ "metadata": { "total_size": 0 }, "weight_map": map });
        std::fs::write(&path, v.to_string()).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        path
    }

    /// A folder of shards is read whole through its index; a missing
    /// shard, a tensor the index misplaces and one in two shards are
    /// errors that name the files.
    #[test]
    fn shards_are_read_through_their_index_and_mismatches_named() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        shard(dir, "a.safetensors", &["x", "y"]);
        shard(dir, "b.safetensors", &["z"]);
        let path = index(
            dir,
            json!({ "x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors" }),
        );
        let (weights, _, c) = folder(dir, "test").unwrap();
        assert_eq!(weights, path);
        let t = load_weights(&weights, &c).unwrap();
        let mut names: Vec<_> = t.keys().cloned().collect();
        names.sort();
        assert_eq!(names, ["x", "y", "z"]);
        assert_eq!(t["y"].to_vec1::<f32>().unwrap(), [1.0, 1.0]);
        assert_eq!(weight_files(&weights).unwrap().len(), 2);

        let err = |map: Value| {
            let p = index(dir, map);
            load_weights(&p, &c).unwrap_err().to_string()
        };
        let e = err(json!({ "x": "a.safetensors", "z": "c.safetensors" }));
        assert!(
            e.contains("c.safetensors: not found") && e.contains("places 1 tensors"),
            "{e}"
        );
        let e = err(json!({ "x": "b.safetensors", "z": "b.safetensors" }));
        assert!(
            e.contains("tensor `x` is listed in shard `b.safetensors`"),
            "{e}"
        );
        shard(dir, "c.safetensors", &["z"]);
        let e = err(json!({ "x": "a.safetensors", "z": "b.safetensors", "w": "c.safetensors" }));
        assert!(e.contains("tensor `z` is in two shards"), "{e}");
        let e = err(json!({ "x": "../a.safetensors" }));
        assert!(e.contains("is not a file name"), "{e}");
        std::fs::write(dir.join(INDEX), "{\"weight_map\": 3}").unwrap();
        let e = load_weights(&path, &c).unwrap_err().to_string();
        assert!(e.contains("no `weight_map`"), "{e}");
    }
}
