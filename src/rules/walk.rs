//! Walking a rules directory, for the loader and for the reload watcher's
//! fingerprint alike.
//!
//! Symlinks are followed where asked, because a Kubernetes ConfigMap mount
//! is made of them (`x.yaml -> ..data/x.yaml`, `..data -> ..2024_01_02...`,
//! relinked when the ConfigMap changes). A link may then lead back up the
//! tree (`a -> .`), and a bind mount can do the same without any link, so
//! every directory is entered once only, known by its device and inode
//! whatever path led to it. The walk is also bounded in depth and in
//! entries read, so no directory costs more than a bounded amount of work
//! per load or per poll; past a bound it stops with an error.
//!
//! Entries are read in name order, so the same directory always gives the
//! same files in the same order, and of two paths to one directory the
//! first in that order is the one entered.

use std::collections::HashSet;
use std::fs::{self, Metadata};
use std::path::{Path, PathBuf};

use super::RuleError;

/// Deepest directory nesting entered below the rules directory. Rule
/// directories are flat or a level or two deep (a ConfigMap mount adds
/// one), so more is a mistake, not a layout.
pub const MAX_DIR_DEPTH: usize = 16;

/// Most directory entries one walk reads, every kind and hidden ones
/// included: a rules directory holds tens of files, a ConfigMap mount lists
/// each twice.
pub const MAX_ENTRIES: usize = 10_000;

/// What a walk enters and returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkOptions {
    /// Whether names starting with `.` are read (the loader skips them, so
    /// that `..data` does not give every file of a ConfigMap twice; the
    /// fingerprint reads them, to see the `..data` link change).
    pub hidden: bool,
    /// Whether a symlink to a directory is entered (files reached through a
    /// symlink are always returned).
    pub linked_dirs: bool,
}

/// One file found: the path it was reached by, and its metadata through any
/// symlink.
#[derive(Debug)]
pub struct Found {
    pub path: PathBuf,
    pub meta: Metadata,
}

/// Every entry under `dir` that is not a directory, in walk order (name
/// order within each directory, depth first). Broken symlinks are skipped;
/// a directory that cannot be read, or a bound passed, is an error on the
/// directory.
pub fn walk(dir: &Path, options: WalkOptions) -> Result<Vec<Found>, RuleError> {
    let error = |at: &Path, reason: String| RuleError {
        file: at.to_path_buf(),
        line: None,
        path: String::new(),
        reason,
    };
    let read_error =
        |at: &Path, e: std::io::Error| error(at, format!("cannot read rule directory: {e}"));

    let root = fs::metadata(dir).map_err(|e| read_error(dir, e))?;
    let mut entered = HashSet::from([dir_id(dir, &root)]);
    let mut entries = 0usize;
    let mut found = Vec::new();
    // Directories still to read, with their depth below `dir`; popped from
    // the end, so each directory's subdirectories are pushed in reverse.
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    while let Some((at, depth)) = stack.pop() {
        let mut names = Vec::new();
        for entry in fs::read_dir(&at).map_err(|e| read_error(&at, e))? {
            let entry = entry.map_err(|e| read_error(&at, e))?;
            entries += 1;
            if entries > MAX_ENTRIES {
                return Err(error(
                    dir,
                    format!(
                        "more than {MAX_ENTRIES} entries in the rule directory \
                         (symlinks and hidden entries included)"
                    ),
                ));
            }
            if !options.hidden && entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            names.push(entry);
        }
        names.sort_by_key(|e| e.file_name());

        let mut subdirs = Vec::new();
        for entry in names {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let Ok(meta) = fs::metadata(&path) else {
                continue;
            };
            if !meta.is_dir() {
                found.push(Found { path, meta });
                continue;
            }
            if kind.is_symlink() && !options.linked_dirs {
                continue;
            }
            if !entered.insert(dir_id(&path, &meta)) {
                // Seen by another path: a loop, or a second name for it.
                continue;
            }
            if depth + 1 > MAX_DIR_DEPTH {
                return Err(error(
                    &path,
                    format!("rule directories nested deeper than {MAX_DIR_DEPTH} levels"),
                ));
            }
            subdirs.push((path, depth + 1));
        }
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(found)
}

/// A directory's identity, whatever path reaches it: its device and inode.
#[cfg(unix)]
type DirId = (u64, u64);

#[cfg(unix)]
fn dir_id(_path: &Path, meta: &Metadata) -> DirId {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// Elsewhere, the resolved path (which a bind mount can fool; the depth
/// bound still ends such a walk).
#[cfg(not(unix))]
type DirId = PathBuf;

#[cfg(not(unix))]
fn dir_id(path: &Path, _meta: &Metadata) -> DirId {
    fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}
