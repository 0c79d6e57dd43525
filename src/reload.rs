//! Rule reloading: the rules directory is checked every interval, and a
//! change is loaded once the directory has looked the same on two polls in
//! a row, then swapped in whole. A file caught mid-write (truncated, half
//! its descriptors there) changes between polls, so it is never loaded; a
//! write that pauses longer than one interval can still be seen twice the
//! same, which no polling can tell from a finished one. A directory with
//! errors keeps the old rules, logs every error, and counts one refusal per
//! distinct state. Startup does not wait: `server::build_engine` loads at
//! once.
//!
//! The look at the directory is a [`fingerprint`] (paths, sizes,
//! modification times), read by the same bounded walk as the loader, which
//! enters each directory once, so a symlink loop costs one directory read.
//! The fingerprint reads hidden entries and linked directories too (the
//! loader does not), to see a ConfigMap's `..data` link change.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::engine::RulesHandle;
use crate::rules::{self, LoadOptions, RuleError, WalkOptions};

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

    /// One rule set loaded (from files or from xDS).
    pub fn count_loaded(&self) {
        self.0[0].fetch_add(1, Ordering::Relaxed);
    }

    /// One rule set refused.
    pub fn count_refused(&self) {
        self.0[1].fetch_add(1, Ordering::Relaxed);
    }
}

/// What a poll sees of the rules directory: the path, size and modification
/// time of every file under it, in path order, or the error that stopped the
/// walk (an unreadable directory, a bound passed), which is a state too.
pub type Fingerprint = Result<Vec<(PathBuf, u64, Option<SystemTime>)>, RuleError>;

/// The directory's [`Fingerprint`]: enough to notice an edit, and cheap
/// compared with parsing.
pub fn fingerprint(dir: &Path) -> Fingerprint {
    let found = rules::walk(
        dir,
        WalkOptions {
            hidden: true,
            linked_dirs: true,
        },
    )?;
    let mut out: Vec<_> = found
        .into_iter()
        .map(|f| (f.path, f.meta.len(), f.meta.modified().ok()))
        .collect();
    out.sort();
    Ok(out)
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
    // The state last loaded or refused, and a different state seen on the
    // previous poll, waiting for a second look.
    let mut settled = fingerprint(&dir);
    let mut pending: Option<Fingerprint> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {}
        }
        let now = fingerprint(&dir);
        if now == settled {
            pending = None;
            continue;
        }
        if pending.as_ref() != Some(&now) {
            pending = Some(now);
            continue;
        }
        pending = None;
        let loaded = rules::load_dir(&dir, &options);
        // A write that began between the second look and the read may have
        // been read half done: keep nothing, and wait for it to settle.
        let after = fingerprint(&dir);
        if after != now {
            pending = Some(after);
            continue;
        }
        settled = now;
        match loaded {
            Ok(mut set) => {
                set.keep_stats(&handle.current());
                tracing::info!(dir = %dir.display(), domains = set.len(), "rules reloaded");
                handle.replace(set);
                counts.count_loaded();
            }
            Err(errors) => {
                counts.count_refused();
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
