//! Watches the plugin directory and feeds adds, replacements and removals to the
//! registry without a restart. Changes are debounced so a file being copied in is
//! loaded once, when complete. This module only notices; loading is the registry's job.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify_debouncer_mini::notify::RecursiveMode;
use notify_debouncer_mini::{DebounceEventResult, Debouncer, new_debouncer};

use crate::registry::{Registry, plugin_id};

/// Quiet time after the last change to a file before it is (re)loaded: long enough
/// for a `cp` of a multi-megabyte component to finish, short enough to feel immediate.
pub const WATCH_DEBOUNCE: Duration = Duration::from_millis(300);

/// Keeps the watch alive; dropping it stops watching.
pub struct PluginDirWatch {
    _debouncer: Debouncer<notify_debouncer_mini::notify::RecommendedWatcher>,
    _task: tokio::task::JoinHandle<()>,
}

/// Starts watching `registry`'s plugin directory (created if missing).
pub fn watch(registry: Arc<Registry>) -> anyhow::Result<PluginDirWatch> {
    use anyhow::Context;
    let dir = registry.plugin_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create plugin directory {}", dir.display()))?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<PathBuf>>();
    let mut debouncer = new_debouncer(WATCH_DEBOUNCE, move |res: DebounceEventResult| match res {
        Ok(events) => {
            let _ = tx.send(events.into_iter().map(|e| e.path).collect());
        }
        Err(e) => tracing::error!(error = %e, "plugin directory watch error"),
    })
    .context("cannot start the plugin directory watcher")?;
    debouncer
        .watcher()
        .watch(&dir, RecursiveMode::NonRecursive)
        .with_context(|| format!("cannot watch plugin directory {}", dir.display()))?;
    tracing::info!(dir = %dir.display(), "watching plugin directory");
    let task = tokio::spawn(async move {
        while let Some(mut paths) = rx.recv().await {
            // A signature arriving or changing reloads its plugin file.
            for p in paths.iter_mut() {
                if let Some(plugin) = p.to_str().and_then(|s| s.strip_suffix(crate::provenance::SIG_SUFFIX)) {
                    *p = PathBuf::from(plugin);
                }
            }
            paths.retain(|p| plugin_id(p).is_some());
            paths.sort();
            paths.dedup();
            for p in paths {
                registry.apply_change(&p).await;
            }
        }
    });
    Ok(PluginDirWatch { _debouncer: debouncer, _task: task })
}
