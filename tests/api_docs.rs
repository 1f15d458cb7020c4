//! Every Lua API function and handle method has a reference entry
//! (`docs/reference/lua-api.md`) and a LuaLS annotation
//! (`docs/luals/taper.lua`), and every annotation names something that
//! exists. The module functions are read from a live `taper` table; handle
//! methods and fields from the `UserData` impls in `src/host/`, since mlua
//! hides a handle's metatable from Lua.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use taper::{Host, HostOptions};

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).unwrap()
}

/// `taper.*` as a recipe sees it: every function's dotted name.
fn live_functions() -> BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("names.txt");
    let src = format!(
        r#"
        local f = assert(io.open({out:?}, "w"))
        local function walk(t, prefix)
          for k, v in pairs(t) do
            local name = prefix .. "." .. k
            if type(v) == "function" then f:write(name, "\n")
            elseif type(v) == "table" then walk(v, name) end
          end
        end
        walk(taper, "taper")
        f:close()
        "#
    );
    Host::new(HostOptions::default())
        .unwrap()
        .run_source("names.lua", &src)
        .unwrap();
    std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The name inside the first `"..."` of `s`.
fn quoted(s: &str) -> Option<&str> {
    let rest = s.split_once('"')?.1;
    Some(rest.split_once('"')?.0)
}

/// Handle type (`Run`, `Data`, ...) to the methods and fields its
/// `impl UserData for RunHandle` registers.
fn handle_members() -> BTreeMap<String, BTreeSet<String>> {
    let mut members: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let host = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/host");
    let mut files = vec![];
    for e in walkdir(&host) {
        files.push(std::fs::read_to_string(e).unwrap());
    }
    for src in files {
        let mut rest = src.as_str();
        while let Some(at) = rest.find("UserData for ") {
            rest = &rest[at + "UserData for ".len()..];
            let ty = rest.split(|c: char| !c.is_alphanumeric()).next().unwrap();
            let Some(class) = ty.strip_suffix("Handle") else {
                continue;
            };
            // The impl block: to its closing brace at the start of a line.
            let body = &rest[..rest.find("\n}").unwrap()];
            let set = members.entry(class.to_string()).or_default();
            for line in body.lines() {
                let line = line.trim();
                let registers = [
                    "add_method(",
                    "add_method_mut(",
                    "add_function(",
                    "add_field_method_get(",
                    "add_field_function_get(",
                    "add_field_method_set(",
                ]
                .iter()
                .any(|r| line.contains(r));
                if registers {
                    if let Some(name) = quoted(line) {
                        set.insert(name.to_string());
                    }
                }
            }
        }
    }
    members
}

fn walkdir(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walkdir(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    out
}

/// LuaLS: `function taper.data.csv(` names, and each class's
/// `function Class:name(` and `---@field name`.
fn annotations() -> (BTreeSet<String>, BTreeMap<String, BTreeSet<String>>) {
    let lua = read("docs/luals/taper.lua");
    let mut functions = BTreeSet::new();
    let mut classes: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut class = None;
    for line in lua.lines() {
        if let Some(c) = line.strip_prefix("---@class taper.") {
            class = Some(c.split_whitespace().next().unwrap().to_string());
            classes.entry(class.clone().unwrap()).or_default();
        } else if let (Some(f), Some(c)) = (line.strip_prefix("---@field "), &class) {
            let name = f.split_whitespace().next().unwrap().trim_end_matches('?');
            classes.get_mut(c).unwrap().insert(name.to_string());
        } else if let Some(f) = line.strip_prefix("function ") {
            let name = f.split('(').next().unwrap();
            match name.split_once(':') {
                Some((c, m)) => {
                    classes
                        .entry(c.to_string())
                        .or_default()
                        .insert(m.to_string());
                }
                None => {
                    functions.insert(name.to_string());
                }
            }
        } else if !line.starts_with("---") {
            class = None;
        }
    }
    (functions, classes)
}

#[test]
fn every_module_function_has_a_reference_entry_and_an_annotation() {
    let live = live_functions();
    assert!(
        live.contains("taper.data.csv") && live.len() >= 25,
        "{live:?}"
    );
    let (annotated, _) = annotations();
    let reference = read("docs/reference/lua-api.md");
    let unannotated: Vec<_> = live.difference(&annotated).collect();
    assert!(
        unannotated.is_empty(),
        "no LuaLS annotation: {unannotated:?}"
    );
    let absent: Vec<_> = annotated.difference(&live).collect();
    assert!(absent.is_empty(), "annotated, but not in taper: {absent:?}");
    let unreferenced: Vec<_> = live
        .iter()
        .filter(|f| !reference.contains(&format!("`{f}")))
        .collect();
    assert!(
        unreferenced.is_empty(),
        "no entry in lua-api.md: {unreferenced:?}"
    );
}

#[test]
fn every_handle_method_and_field_has_a_reference_entry_and_an_annotation() {
    let members = handle_members();
    for class in ["Run", "Data", "Generator", "Batch", "Model", "Plugin"] {
        assert!(!members[class].is_empty(), "no members read for {class}");
    }
    let (_, classes) = annotations();
    let reference = read("docs/reference/lua-api.md");
    for (class, names) in &members {
        let Some(annotated) = classes.get(class) else {
            panic!("no LuaLS class taper.{class}");
        };
        let missing: Vec<_> = names.difference(annotated).collect();
        assert!(
            missing.is_empty(),
            "taper.{class}: no annotation for {missing:?}"
        );
        let absent: Vec<_> = annotated.difference(names).collect();
        assert!(
            absent.is_empty(),
            "taper.{class}: annotated but not registered: {absent:?}"
        );
        // `run:step(`, `data:take(`, `batch.size`, `gen:batches(` ...
        let unreferenced: Vec<_> = names
            .iter()
            .filter(|n| {
                ![":", "."].iter().any(|sep| {
                    reference.match_indices(&format!("{sep}{n}")).any(|(i, _)| {
                        let before = &reference[..i];
                        let word = before
                            .rsplit(|c: char| !c.is_alphanumeric() && c != '_')
                            .next()
                            .unwrap();
                        !word.is_empty() && before[..before.len() - word.len()].ends_with('`')
                    })
                })
            })
            .collect();
        assert!(
            unreferenced.is_empty(),
            "taper.{class}: no entry in lua-api.md for {unreferenced:?}"
        );
    }
}
