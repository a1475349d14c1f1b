//! Reloading the policy when its files change or on SIGHUP.
//!
//! A new configuration replaces the running one only if every file parses and validates; a
//! broken one is logged and counted, and the running policy stays live. Files are watched
//! through their directories, so editors that save by renaming and Kubernetes ConfigMap
//! symlink swaps are seen too.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::{ConfigErrors, Policy, digest, read_all};

/// How long to wait after a file event for more events before reloading (editors write in
/// several steps).
const SETTLE: Duration = Duration::from_millis(100);

/// What a reload updates: the running service.
pub trait Target: Send + Sync + 'static {
    /// The digest of the running configuration.
    fn current_digest(&self) -> u64;
    /// Replaces the running policy.
    fn install(&self, policy: Policy);
    /// Reports a configuration that was rejected.
    fn rejected(&self, errors: &ConfigErrors);
}

/// Reloads `paths` into `target` when asked: the outcome of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reloaded {
    /// The files did not change.
    Unchanged,
    /// A new policy is live.
    Installed,
    /// The new files are broken; the old policy stays.
    Rejected,
}

/// Reads `paths` and installs them into `target` if they changed and are valid.
/// `last_rejected` suppresses repeating the same rejection for unchanged broken files.
pub fn reload_now(
    paths: &[PathBuf],
    target: &dyn Target,
    last_rejected: &mut Option<u64>,
) -> Reloaded {
    let sources = match read_all(paths) {
        Ok(sources) => sources,
        Err(errors) => {
            target.rejected(&errors);
            return Reloaded::Rejected;
        }
    };
    let new = digest(&sources);
    if new == target.current_digest() || Some(new) == *last_rejected {
        return Reloaded::Unchanged;
    }
    match Policy::from_sources(sources) {
        Ok(policy) => {
            *last_rejected = None;
            target.install(policy);
            Reloaded::Installed
        }
        Err(errors) => {
            *last_rejected = Some(new);
            target.rejected(&errors);
            Reloaded::Rejected
        }
    }
}

/// Watches `paths` (and SIGHUP) until `shutdown` completes, reloading into `target`.
/// With no paths (the built-in policy) there is nothing to reload: SIGHUP is still handled —
/// it must never kill the server (a systemd `ExecReload` sends it) — and says so in the log.
pub async fn watch(
    paths: Vec<PathBuf>,
    target: Arc<dyn Target>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    if paths.is_empty() {
        spawn_sighup(tx);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                signal = rx.recv() => {
                    if signal.is_none() {
                        return;
                    }
                    tracing::info!(
                        "SIGHUP: nothing to reload (the built-in policy is running; start with --config FILE to reload files)"
                    );
                }
            }
        }
    }
    let events = tx.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| may_change_content(&e.kind)) {
            let _ = events.send(());
        }
    });
    let _watcher = match watcher {
        Ok(mut watcher) => {
            for dir in directories(&paths) {
                if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
                    tracing::warn!(
                        "cannot watch {} for changes: {e}; SIGHUP still reloads",
                        dir.display()
                    );
                }
            }
            Some(watcher)
        }
        Err(e) => {
            tracing::warn!("cannot watch configuration files: {e}; SIGHUP still reloads");
            None
        }
    };
    // The files may have changed between their first load and the watch starting: look once.
    let _ = tx.send(());
    spawn_sighup(tx);
    tokio::pin!(shutdown);
    let mut last_rejected = None;
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            event = rx.recv() => {
                if event.is_none() {
                    return;
                }
            }
        }
        // Let a burst of events settle, then reload once.
        tokio::time::sleep(SETTLE).await;
        while rx.try_recv().is_ok() {}
        let paths = paths.clone();
        let target = target.clone();
        let mut rejected = last_rejected;
        let outcome = tokio::task::spawn_blocking(move || {
            let outcome = reload_now(&paths, &*target, &mut rejected);
            (outcome, rejected)
        })
        .await;
        if let Ok((_, rejected)) = outcome {
            last_rejected = rejected;
        }
    }
}

/// Whether a file event can mean new contents. Opening or reading a file cannot — and
/// reloading opens the files, so counting opens would reload again and again, forever.
fn may_change_content(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// The directories holding `paths`, each once.
fn directories(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = paths
        .iter()
        .map(|p| match p.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => Path::new(".").to_owned(),
        })
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

#[cfg(unix)]
fn spawn_sighup(tx: mpsc::UnboundedSender<()>) {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::hangup()) {
        Ok(mut hup) => {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::debug!("SIGHUP received");
                    if tx.send(()).is_err() {
                        return;
                    }
                }
            });
        }
        Err(e) => tracing::warn!("cannot listen for SIGHUP: {e}"),
    }
}

#[cfg(not(unix))]
fn spawn_sighup(_tx: mpsc::UnboundedSender<()>) {}
