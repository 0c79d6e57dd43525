//! Rule reloading: the rules directory is checked every interval; when any
//! file changed, the whole directory is loaded again and swapped in at once.
//! A directory with errors keeps the old rules and logs every error.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::engine::RulesHandle;
use crate::rules::{self, LoadOptions};

/// How many changed rule directories were loaded and how many refused since
/// startup: the only outside sign that a refused edit was seen at all.
/// Cheap to clone; clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct ReloadCounts(Arc<[AtomicU64; 2]>);

impl ReloadCounts {
    pub fn loaded(&self) -> u64 {
        self.0[0].load(Ordering::Relaxed)
    }

    pub fn refused(&self) -> u64 {
        self.0[1].load(Ordering::Relaxed)
    }
}

/// Paths, sizes and modification times of every file under `dir`: enough to
/// notice an edit, and cheap compared with parsing.
pub fn fingerprint(dir: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            // Follow symlinks: Kubernetes swaps a ConfigMap by relinking.
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path);
            } else {
                out.push((path, meta.len(), meta.modified().ok()));
            }
        }
    }
    out.sort();
    out
}

/// Checks `dir` every `every` until `stop` resolves, swapping good rule sets
/// (by the same `options` as at startup) into `handle`, and counting the
/// outcomes in `counts`.
pub async fn watch(
    dir: PathBuf,
    every: Duration,
    options: LoadOptions,
    handle: RulesHandle,
    counts: ReloadCounts,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut seen = fingerprint(&dir);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {}
        }
        let now = fingerprint(&dir);
        if now == seen {
            continue;
        }
        seen = now;
        match rules::load_dir(&dir, &options) {
            Ok(mut set) => {
                set.keep_stats(&handle.current());
                tracing::info!(dir = %dir.display(), domains = set.len(), "rules reloaded");
                handle.replace(set);
                counts.0[0].fetch_add(1, Ordering::Relaxed);
            }
            Err(errors) => {
                counts.0[1].fetch_add(1, Ordering::Relaxed);
                for e in &errors.0 {
                    tracing::error!("{e}");
                }
                tracing::error!(
                    dir = %dir.display(),
                    errors = errors.0.len(),
                    "rules not reloaded; the previous rules stay in force"
                );
            }
        }
    }
}
