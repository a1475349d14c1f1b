//! Reloading the policy when its files change or on SIGHUP.
//!
//! A new configuration replaces the running one only if every file parses and validates; a
//! broken one is logged and counted, and the running policy stays live. The files the
//! configuration refers to (JWT key files, [`Reference`]) count as part of it: rotating one is
//! a change, and they are watched too. Files are watched through their directories, so editors
//! that save by renaming and Kubernetes ConfigMap/Secret symlink swaps are seen too.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::{ConfigErrors, Policy, Reference, XdsRules, digest, read_all};

/// How long to wait after a file event for more events before reloading (editors write in
/// several steps).
const SETTLE: Duration = Duration::from_millis(100);

/// What a reload updates: the running service.
pub trait Target: Send + Sync + 'static {
    /// The digest of the running configuration.
    fn current_digest(&self) -> u64;
    /// The files the running configuration refers to.
    fn current_references(&self) -> Vec<PathBuf>;
    /// Replaces the running policy.
    fn install(&self, policy: Policy);
    /// Reports a configuration that was rejected.
    fn rejected(&self, errors: &ConfigErrors);
    /// Reports that the files were read again and are the running configuration (e.g. a
    /// broken file was restored): an earlier rejection no longer describes them.
    fn unchanged(&self);
    /// The running rules from the xDS management server, which a reload of the files keeps.
    fn current_xds(&self) -> Option<XdsRules> {
        None
    }
    /// Held while a new configuration is built from the running one and installed, so that a
    /// file reload and an xDS update never lose each other's change.
    fn composing(&self) -> parking_lot::MutexGuard<'_, ()>;
}

/// Reloads `paths` into `target` when asked: the outcome of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reloaded {
    /// The files are the running configuration.
    Unchanged,
    /// The files are the ones rejected last time (nothing new to report).
    StillRejected,
    /// A new policy is live.
    Installed,
    /// The new files are broken; the old policy stays.
    Rejected,
}

/// The last configuration rejected: its digest and the files it referred to.
#[derive(Debug, Clone, Default)]
pub struct Rejection {
    /// The digest of the rejected files and their references.
    digest: u64,
    /// The files it referred to (so that a missing key file appearing is a change).
    references: Vec<PathBuf>,
}

impl Rejection {
    /// The files the rejected configuration referred to.
    pub fn references(&self) -> &[PathBuf] {
        &self.references
    }
}

/// The digest `sources` would have now with the files named `references`.
fn digest_now(sources: &[super::Source], references: &[PathBuf]) -> u64 {
    let now: Vec<Reference> = references.iter().map(|p| Reference::read_now(p)).collect();
    digest(sources, &now)
}

/// Reads `paths` and installs them into `target` if they (or the files they refer to) changed
/// and are valid. `last_rejected` suppresses repeating the same rejection for unchanged broken
/// files.
pub fn reload_now(
    paths: &[PathBuf],
    target: &dyn Target,
    last_rejected: &mut Option<Rejection>,
) -> Reloaded {
    let sources = match read_all(paths) {
        Ok(sources) => sources,
        Err(errors) => {
            target.rejected(&errors);
            return Reloaded::Rejected;
        }
    };
    let _composing = target.composing();
    // The rules from xDS stay as they are; they are part of the configuration's identity.
    let xds = target.current_xds();
    let mut all = sources.clone();
    all.extend(xds.iter().flat_map(|x| x.sources().cloned()));
    // Unchanged texts refer to the same files: only their contents can differ.
    if digest_now(&all, &target.current_references()) == target.current_digest() {
        // Back to the running configuration: the same broken files again are news again.
        *last_rejected = None;
        target.unchanged();
        return Reloaded::Unchanged;
    }
    if let Some(rejection) = last_rejected
        && digest_now(&all, &rejection.references) == rejection.digest
    {
        return Reloaded::StillRejected;
    }
    let mut references = Vec::new();
    match Policy::compose(sources, xds, &mut references) {
        Ok(policy) => {
            *last_rejected = None;
            target.install(policy);
            Reloaded::Installed
        }
        Err(errors) => {
            *last_rejected = Some(Rejection {
                digest: digest(&all, &references),
                references: references.into_iter().map(|r| r.path).collect(),
            });
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
    if paths.is_empty() {
        let (tx, mut rx) = mpsc::unbounded_channel::<Trigger>();
        spawn_sighup(tx);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                signal = rx.recv() => {
                    if signal.is_none() {
                        return;
                    }
                    if target.current_xds().is_some() || target.current_digest() == empty_digest() {
                        tracing::info!(
                            "SIGHUP: no configuration file to reload (the rules come from the xDS management server; start with --config FILE to reload files)"
                        );
                    } else {
                        tracing::info!(
                            "SIGHUP: no configuration file to reload (the built-in policy is running; start with --config FILE to reload files)"
                        );
                    }
                }
            }
        }
    }
    let mut last_rejected = None;
    let mut first = paths.clone();
    first.extend(target.current_references());
    on_changes(
        first,
        move |trigger| {
            let outcome = reload_now(&paths, &*target, &mut last_rejected);
            if trigger == Trigger::Signal {
                match outcome {
                    Reloaded::Unchanged => {
                        tracing::info!("SIGHUP: reload requested; nothing changed in the configuration files");
                    }
                    Reloaded::StillRejected => tracing::warn!(
                        "SIGHUP: reload requested; the configuration files are still the ones rejected, the running policy stays"
                    ),
                    // Both say so themselves.
                    Reloaded::Installed | Reloaded::Rejected => {}
                }
            }
            // A new configuration may refer to files in other directories.
            let mut files = paths.clone();
            files.extend(target.current_references());
            if let Some(rejection) = &last_rejected {
                files.extend_from_slice(rejection.references());
            }
            files
        },
        shutdown,
    )
    .await;
}

/// The digest of a configuration without any source (a server following an xDS management
/// server, before its first version).
fn empty_digest() -> u64 {
    digest(&[], &[])
}

/// What asked for a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// A file event in a watched directory (or the look at start).
    Files,
    /// SIGHUP: an operator asked, and expects an answer in the log.
    Signal,
}

/// Watches `files`, then runs `reload` (on a blocking thread: it reads files) once, and again
/// whenever a file in the directories of the files watched changes, or SIGHUP arrives, until
/// `shutdown` completes; `reload` is told whether a SIGHUP was among the events. It returns
/// the files to watch from then on (added to those watched). Files are watched through their
/// directories, so renames and symlink swaps are seen too; the watch starts before the first
/// reload, so no change is missed in between.
pub(crate) async fn on_changes<R>(
    files: Vec<PathBuf>,
    reload: R,
    shutdown: impl std::future::Future<Output = ()>,
) where
    R: FnMut(Trigger) -> Vec<PathBuf> + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<Trigger>();
    let events = tx.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| may_change_content(&e.kind)) {
            let _ = events.send(Trigger::Files);
        }
    });
    let mut watcher = match watcher {
        Ok(watcher) => Some(watcher),
        Err(e) => {
            tracing::warn!("cannot watch files for changes: {e}; SIGHUP still reloads");
            None
        }
    };
    let mut watched = BTreeSet::new();
    let mut watch_more = |watcher: &mut Option<notify::RecommendedWatcher>, files: &[PathBuf]| {
        let Some(watcher) = watcher else { return };
        for dir in directories(files) {
            if !watched.insert(dir.clone()) {
                continue;
            }
            if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
                tracing::warn!(
                    "cannot watch {} for changes: {e}; SIGHUP still reloads",
                    dir.display()
                );
            }
        }
    };
    watch_more(&mut watcher, &files);
    // The files may have changed between their first load and the watch starting: look once.
    let _ = tx.send(Trigger::Files);
    spawn_sighup(tx);
    tokio::pin!(shutdown);
    let mut reload = Some(reload);
    let mut first = true;
    loop {
        let mut trigger = tokio::select! {
            () = &mut shutdown => return,
            event = rx.recv() => match event {
                Some(trigger) => trigger,
                None => return,
            },
        };
        // Let a burst of events settle, then reload once.
        if !first {
            tokio::time::sleep(SETTLE).await;
        }
        first = false;
        while let Ok(more) = rx.try_recv() {
            if more == Trigger::Signal {
                trigger = Trigger::Signal;
            }
        }
        let Some(mut reloading) = reload.take() else {
            return;
        };
        match tokio::task::spawn_blocking(move || {
            let files = reloading(trigger);
            (reloading, files)
        })
        .await
        {
            Ok((reloading, files)) => {
                watch_more(&mut watcher, &files);
                reload = Some(reloading);
            }
            Err(e) => {
                tracing::error!("reloading failed: {e}; no more reloads");
                return;
            }
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
fn spawn_sighup(tx: mpsc::UnboundedSender<Trigger>) {
    use tokio::signal::unix::{SignalKind, signal};
    let hangup =
        crate::server::take_early_hangup().map_or_else(|| signal(SignalKind::hangup()), Ok);
    match hangup {
        Ok(mut hup) => {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::debug!("SIGHUP received");
                    if tx.send(Trigger::Signal).is_err() {
                        return;
                    }
                }
            });
        }
        Err(e) => tracing::warn!("cannot listen for SIGHUP: {e}"),
    }
}

#[cfg(not(unix))]
fn spawn_sighup(_tx: mpsc::UnboundedSender<Trigger>) {}
