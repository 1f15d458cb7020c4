//! Which files of a folder are images, as torchvision's `ImageFolder` finds
//! them: files with an image extension, in the order of their folder's path,
//! then their name. Hidden folders and files (a name starting with a dot)
//! and Windows' hidden `Thumbs.db` and `desktop.ini` are passed over without
//! a word; other files (a `.gif`, a phone's `.heic`, a `labels.txt`) are
//! passed over too, as `ImageFolder` does, but counted, so that a folder
//! whose images are not read says so instead of training on fewer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::images::data_err;
use crate::Result;

/// torchvision's `IMG_EXTENSIONS`, compared without case.
pub(super) const EXTENSIONS: [&str; 9] = [
    "jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp",
];

/// The extensions taper reads, as `.jpg, .jpeg, ...`.
pub(super) fn extension_list() -> String {
    EXTENSIONS.map(|e| format!(".{e}")).join(", ")
}

fn is_image(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

/// A name starting with a dot (`.ipynb_checkpoints`, `.DS_Store`), or a
/// file Windows keeps hidden in folders of pictures. Unlike `ImageFolder`,
/// which makes a class of a hidden folder, they are passed over.
fn hidden(path: &Path) -> bool {
    path.file_name().is_some_and(|n| {
        let n = n.to_string_lossy().to_ascii_lowercase();
        n.starts_with('.') || n == "thumbs.db" || n == "desktop.ini"
    })
}

/// The files a walk passed over that were not images, by kind: the
/// extension, lower case (`.gif`), or `no extension`.
#[derive(Clone, Debug, Default)]
pub struct PassedOver {
    /// Each kind's count and first file found.
    kinds: BTreeMap<String, (usize, PathBuf)>,
}

impl PassedOver {
    fn add(&mut self, path: &Path) {
        let kind = match path.extension() {
            Some(e) => format!(".{}", e.to_string_lossy().to_lowercase()),
            None => "no extension".to_string(),
        };
        let entry = self.kinds.entry(kind).or_insert((0, path.to_path_buf()));
        entry.0 += 1;
    }

    /// Adds another walk's.
    pub fn merge(&mut self, other: PassedOver) {
        for (kind, (n, first)) in other.kinds {
            self.kinds.entry(kind).or_insert((0, first)).0 += n;
        }
    }

    pub fn count(&self) -> usize {
        self.kinds.values().map(|k| k.0).sum()
    }

    /// What to tell the user about the files passed over under `root`
    /// (`ROOT: passed over: SUMMARY`); nothing when none was.
    pub fn note(&self, root: &Path) -> Option<String> {
        Some(format!(
            "{}: passed over: {}",
            root.display(),
            self.summary()?
        ))
    }

    /// How many files were passed over, of which kinds (the most common
    /// first, with one file each), and what taper reads; nothing when none
    /// was.
    pub fn summary(&self) -> Option<String> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let mut kinds: Vec<_> = self.kinds.iter().collect();
        kinds.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(b.0)));
        let shown: Vec<String> = kinds
            .iter()
            .take(4)
            .map(|(kind, (k, first))| format!("{kind}: {k}, such as {}", first.display()))
            .collect();
        let more = match kinds.len() {
            k if k > 4 => format!("; {} other kinds", k - 4),
            _ => String::new(),
        };
        let files = if n == 1 { "file" } else { "files" };
        Some(format!(
            "{n} {files} not of a type read as an image ({}{more}); taper reads {}, as torchvision's ImageFolder does: convert the others to PNG or JPEG to use them",
            shown.join("; "),
            extension_list()
        ))
    }
}

/// The image files under a folder and the other files passed over.
#[derive(Debug, Default)]
pub struct Listing {
    pub images: Vec<PathBuf>,
    pub passed_over: PassedOver,
}

/// The image files under `dir`, in `ImageFolder`'s order: folders sorted
/// by their path, names sorted within each (links followed, as it does,
/// each folder once); hidden ones passed over, other files counted.
pub fn image_files(dir: &Path) -> Result<Listing> {
    let mut folders = vec![dir.to_path_buf()];
    let mut found: Vec<(String, String, PathBuf)> = Vec::new();
    let mut passed_over = PassedOver::default();
    // A link back up the tree (`ln -s .. loop`) would be walked for ever.
    let mut seen = std::collections::HashSet::new();
    while let Some(d) = folders.pop() {
        if !seen.insert(std::fs::canonicalize(&d).map_err(|e| data_err(&d, e))?) {
            continue;
        }
        let entries = std::fs::read_dir(&d).map_err(|e| data_err(&d, e))?;
        for entry in entries {
            let path = entry.map_err(|e| data_err(&d, e))?.path();
            if hidden(&path) {
                continue;
            } else if path.is_dir() {
                folders.push(path);
            } else if is_image(&path) {
                let name = path.file_name().unwrap_or_default();
                found.push((
                    d.to_string_lossy().into_owned(),
                    name.to_string_lossy().into_owned(),
                    path,
                ));
            } else {
                passed_over.add(&path);
            }
        }
    }
    found.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    Ok(Listing {
        images: found.into_iter().map(|(_, _, p)| p).collect(),
        passed_over,
    })
}

/// The class folders of `root`, sorted (hidden ones passed over).
pub(super) fn class_folders(root: &Path) -> Result<Vec<String>> {
    let mut classes = Vec::new();
    for entry in std::fs::read_dir(root).map_err(|e| data_err(root, e))? {
        let path = entry.map_err(|e| data_err(root, e))?.path();
        if path.is_dir() && !hidden(&path) {
            classes.push(
                path.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    classes.sort();
    if classes.is_empty() {
        return Err(data_err(
            root,
            "holds no class folders: an image folder is ROOT/CLASS/IMAGE, one folder per class",
        ));
    }
    Ok(classes)
}

/// When `root`'s class folders look like splits (`train`, `val`), each
/// holding no image of its own but the same class folders as the others
/// (a `path` one level too high), what to say: the folder would train a
/// model to tell the splits apart. `ImageFolder` reads such a folder as
/// taper does, so it is a warning, not an error.
pub fn split_like(root: &Path, classes: &[String]) -> Option<String> {
    if classes.len() < 2 {
        return None;
    }
    let mut inner: Option<Vec<String>> = None;
    for class in classes {
        let dir = root.join(class);
        let mut subfolders = Vec::new();
        for entry in std::fs::read_dir(&dir).ok()? {
            let path = entry.ok()?.path();
            if hidden(&path) {
                continue;
            } else if path.is_dir() {
                subfolders.push(path.file_name()?.to_string_lossy().into_owned());
            } else if is_image(&path) {
                return None;
            }
        }
        subfolders.sort();
        match &inner {
            _ if subfolders.is_empty() => return None,
            Some(seen) if *seen != subfolders => return None,
            _ => inner = Some(subfolders),
        }
    }
    let inner = inner?;
    Some(format!(
        "{}: its class folders {} each hold the same {} folders ({}) and no image of their own: they look like splits, not classes, and a model trained on them learns to tell the splits apart; give the split's folder as `path` ({})",
        root.display(),
        super::name_list(classes),
        inner.len(),
        super::name_list(&inner),
        root.join(&classes[0]).display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Images in order; hidden files and Windows' clutter unsaid; the
    /// rest counted by kind, case folded, the most common first.
    #[test]
    fn other_files_are_counted_by_kind() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("sub")).unwrap();
        for f in [
            "b.PNG",
            "a.jpg",
            "sub/c.webp",
            "x.gif",
            "sub/y.GIF",
            "z.heic",
            "README",
            ".DS_Store",
            "Thumbs.db",
            "sub/desktop.ini",
        ] {
            std::fs::write(d.join(f), b"").unwrap();
        }
        let found = image_files(d).unwrap();
        let names: Vec<_> = found
            .images
            .iter()
            .map(|p| p.strip_prefix(d).unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["a.jpg", "b.PNG", "sub/c.webp"]);
        assert_eq!(found.passed_over.count(), 4);
        let note = found.passed_over.note(Path::new("pets")).unwrap();
        assert!(
            note.starts_with(
                "pets: passed over: 4 files not of a type read as an image (.gif: 2, such as "
            ),
            "{note}"
        );
        assert!(
            note.contains("; .heic: 1, such as ") && note.contains("; no extension: 1, such as "),
            "{note}"
        );
        assert!(
            !note.contains("Thumbs") && !note.contains("DS_Store"),
            "{note}"
        );
        let mut both = PassedOver::default();
        both.merge(found.passed_over.clone());
        both.merge(found.passed_over);
        assert_eq!(both.count(), 8);
        assert_eq!(PassedOver::default().note(d), None);
    }
}
