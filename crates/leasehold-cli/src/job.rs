//! The command as one job: a process group of its own, signalled and
//! reaped as a whole.
//!
//! The command starts in a new process group whose id is its pid, and
//! every process it starts stays in that group unless it leaves it
//! (`setsid`, `setpgid`: daemons do). Signals go to the whole group, so a
//! shell script's children are stopped with it.
//!
//! When leasehold runs in the foreground of a terminal, the job's group is
//! made the terminal's foreground group while it runs (as a shell does),
//! so that the command may read the terminal and Ctrl-C reaches it
//! directly; the terminal is given back when the job is gone. A job
//! suspended from the terminal (Ctrl-Z) is resumed at once: leasehold
//! keeps renewing the lease meanwhile, and a suspended job could be
//! neither interrupted nor waited for.
//!
//! On Linux, leasehold is a child subreaper: processes of the job whose
//! parent died are handed to leasehold rather than to init, so leasehold
//! reaps them itself and sees the group empty as soon as its last process
//! is dead, whatever the system's init does with orphans.

use std::fs::File;
use std::io;
use std::process::Command;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};
use tokio::signal::unix::{SignalKind, signal};

use crate::exit::note;

/// A running command and the processes it started.
pub(crate) struct Job {
    /// The command's pid, which is also the group's id.
    group: Pid,
    /// The command's own exit code once it was reaped (128 + N for signal N).
    exit_code: Option<u8>,
    /// The group was seen empty: it is never signalled again, since its id
    /// may be reused.
    gone: bool,
    /// SIGCHLD: one of leasehold's children changed state.
    children: tokio::signal::unix::Signal,
    /// The controlling terminal, while the job is its foreground group.
    terminal: Option<File>,
}

impl Job {
    /// Starts `command` in a process group of its own.
    ///
    /// # Errors
    ///
    /// The spawn error (not found, not executable), or the error of
    /// installing the SIGCHLD handler.
    pub(crate) fn spawn(command: &mut Command) -> io::Result<Self> {
        // Installed before the spawn, so that no exit goes unheard.
        let children = signal(SignalKind::child())?;
        #[cfg(any(target_os = "linux", target_os = "android"))]
        nix::sys::prctl::set_child_subreaper(true).map_err(io::Error::from)?;
        let child = std::os::unix::process::CommandExt::process_group(command, 0).spawn()?;
        // Reaped by `reap`, never through the handle (dropping it neither
        // waits nor kills).
        let pid = i32::try_from(child.id())
            .map_err(|_| io::Error::other("the command's pid does not fit a pid_t"))?;
        let group = Pid::from_raw(pid);
        Ok(Self {
            group,
            exit_code: None,
            gone: false,
            children,
            terminal: hand_terminal(group),
        })
    }

    /// Sends `signal` to every process of the job; nothing once it is gone.
    pub(crate) fn signal(&self, signal: Signal) {
        if !self.gone {
            // ESRCH: the last process died since the last check.
            let _ = killpg(self.group, signal);
        }
    }

    /// The command's own exit code, once it exited.
    pub(crate) fn exit_code(&self) -> Option<u8> {
        self.exit_code
    }

    /// Reaps what died, and says whether no process of the job is left.
    pub(crate) fn is_gone(&mut self) -> bool {
        if self.gone {
            return true;
        }
        self.reap();
        // Signal 0 checks that the group has a process, without sending
        // anything. EPERM: a process we may not signal is still in it.
        self.gone = self.exit_code.is_some() && killpg(self.group, None) == Err(Errno::ESRCH);
        self.gone
    }

    /// Waits until one of leasehold's children changes state.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a SIGCHLD that arrives meanwhile is kept for the next
    /// call.
    pub(crate) async fn changed(&mut self) {
        self.children.recv().await;
    }

    /// Reaps every exited child: the command, and the orphans of the job
    /// handed to leasehold as their subreaper.
    fn reap(&mut self) {
        let mut suspended = false;
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED)) {
                Ok(WaitStatus::Stopped(_, Signal::SIGTSTP)) => suspended = true,
                Ok(WaitStatus::Exited(pid, code)) => {
                    if pid == self.group {
                        // Exit codes are 0..=255 on Unix.
                        self.exit_code = Some(u8::try_from(code).unwrap_or(u8::MAX));
                    }
                }
                Ok(WaitStatus::Signaled(pid, signal, _)) => {
                    if pid == self.group {
                        // Ended by a signal: reported the way shells do.
                        self.exit_code = Some(128u8.saturating_add(signal as u8));
                    }
                }
                Err(Errno::EINTR) => {}
                // StillAlive, or ECHILD: no child left to reap.
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                // Stopped by another signal (SIGSTOP: someone meant it).
                Ok(_) => {}
            }
        }
        if suspended && !self.gone {
            note!(
                "leasehold: a command under a lease cannot be suspended (the lease would \
                 be renewed while it does nothing); resuming it"
            );
            self.signal(Signal::SIGCONT);
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // Only on a path that did not wait for the job (an error, a panic):
        // the job must not outlive leasehold, which alone renews the lease.
        if !self.is_gone() {
            self.signal(Signal::SIGKILL);
        }
        if let Some(terminal) = self.terminal.take() {
            // Back to leasehold's group, which the shell waits on.
            let _ = tcsetpgrp(&terminal, getpgrp());
        }
    }
}

/// Makes the job's group the foreground group of leasehold's controlling
/// terminal, when leasehold is in its foreground; returns the terminal to
/// give back later.
fn hand_terminal(group: Pid) -> Option<File> {
    let terminal = File::options()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .ok()?;
    if tcgetpgrp(&terminal).ok()? != getpgrp() {
        return None; // leasehold runs in the background: so does the job
    }
    // Leasehold is in the background from now on: blocking SIGTTOU lets it
    // still write to the terminal (with `stty tostop`) and take it back. The
    // job was started before, with a mask of its own.
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    ttou.thread_block().ok()?;
    tcsetpgrp(&terminal, group).ok()?;
    // The job may have touched the terminal before it was its own, and been
    // stopped for it (SIGTTIN): it is in the foreground now.
    let _ = killpg(group, Signal::SIGCONT);
    Some(terminal)
}
