//! `run --progress-file`: a shell job's progress, read from a file's
//! modification time.
//!
//! A shell job cannot call [`Progress::report`]; it can `touch` a file. A
//! task polls the file's modification time [`POLLS_PER_WINDOW`] times per
//! progress window and reports progress whenever it changed. A poll is one
//! `stat`, on the blocking pool, so a file on a hung file system delays
//! only the reports (the job then counts as stalled), never the lease's
//! renewals or the job's supervision.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use leasehold_watchdog::Progress;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

/// Polls per progress window: a touch is seen at most a quarter of the
/// window late, which the window's own bound (window + one renew interval)
/// absorbs as a small addition.
pub(crate) const POLLS_PER_WINDOW: u32 = 4;

/// No faster than this, whatever the window: a `stat` every few
/// milliseconds would cost more than it tells.
const MIN_POLL: Duration = Duration::from_millis(10);

/// The polling task; stopped when dropped.
pub(crate) struct ProgressFile {
    task: JoinHandle<()>,
}

impl ProgressFile {
    /// Starts reporting to `progress` each change of `path`'s modification
    /// time from now on (a file touched before does not count; the
    /// acquisition itself counts as progress).
    pub(crate) fn watch(path: PathBuf, window: Duration, progress: Progress) -> Self {
        let every = (window / POLLS_PER_WINDOW).max(MIN_POLL);
        let task = tokio::spawn(async move {
            let mut seen = modified(&path).await;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let now = modified(&path).await;
                // Any change counts: a job that sets the time back
                // (`touch -d`) still shows it is alive.
                if now.is_some() && now != seen {
                    progress.report();
                    seen = now;
                }
            }
        });
        Self { task }
    }
}

impl Drop for ProgressFile {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The file's modification time; `None` while it does not exist or
/// cannot be read.
async fn modified(path: &Path) -> Option<SystemTime> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || std::fs::metadata(path).ok()?.modified().ok())
        .await
        .ok()
        .flatten()
}
