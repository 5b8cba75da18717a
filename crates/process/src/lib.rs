//! Child processes that cannot outlive toolwarden.
//!
//! Every child toolwarden starts — an MCP stdio server, an `exec` command — runs in **its own
//! process group**, so that one signal reaches it and everything it spawned, and (on Linux) gets
//! **SIGKILL when toolwarden dies** (parent-death signal). A [`GroupChild`] that is dropped
//! kills its whole group; tokio reaps the leader. The key design choice: stopping is always done to
//! the group, never to the leader alone, because grandchildren (a shell's `sleep`, a server's
//! workers) are what users find orphaned by the dozen.
//!
//! The parent-death signal fires when the *thread* that spawned the child exits. Spawn from a
//! tokio worker thread (any async context), never from `spawn_blocking`, whose threads come and go.
//!
//! Grandchildren do not inherit the parent-death signal: if toolwarden is killed with SIGKILL, a
//! grandchild that ignores the hang-up of its pipes can survive. Every orderly path (cancel,
//! timeout, shutdown, drop) kills the group instead.

use std::io;
use std::process::ExitStatus;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

/// Makes `cmd` start in its own process group with a parent-death SIGKILL.
pub fn isolate(cmd: &mut Command) {
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // async-signal-safe functions (prctl, getppid, _exit); it allocates nothing.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
}

/// Sends `signal` to the process group `pgid`. `Ok(false)` when the group no longer exists.
pub fn signal_group(pgid: u32, signal: Signal) -> io::Result<bool> {
    let Ok(raw) = i32::try_from(pgid) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "process group id out of range",
        ));
    };
    if raw <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to signal process group 0 or 1",
        ));
    }
    match killpg(Pid::from_raw(raw), signal) {
        Ok(()) => Ok(true),
        Err(Errno::ESRCH) => Ok(false),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Whether any process of group `pgid` is still alive (zombies included until reaped).
pub fn group_alive(pgid: u32) -> bool {
    i32::try_from(pgid)
        .ok()
        .filter(|p| *p > 1)
        .is_some_and(|p| killpg(Pid::from_raw(p), None).is_ok())
}

/// A child running in its own process group. Dropping it kills the group.
#[derive(Debug)]
pub struct GroupChild {
    child: Child,
    pgid: u32,
    exited: bool,
}

impl GroupChild {
    /// Spawns `cmd` isolated (see [`isolate`]).
    pub fn spawn(mut cmd: Command) -> io::Result<Self> {
        isolate(&mut cmd);
        cmd.kill_on_drop(true);
        let child = cmd.spawn()?;
        let pgid = child
            .id()
            .ok_or_else(|| io::Error::other("child exited before its id could be read"))?;
        Ok(Self {
            child,
            pgid,
            exited: false,
        })
    }

    /// The leader's pid, which is also the group's id.
    pub fn pgid(&self) -> u32 {
        self.pgid
    }

    /// Asks the whole group to stop (SIGTERM). `Ok(false)` when it is already gone.
    pub fn terminate(&self) -> io::Result<bool> {
        signal_group(self.pgid, Signal::SIGTERM)
    }

    /// Kills the whole group (SIGKILL). `Ok(false)` when it is already gone.
    pub fn kill(&self) -> io::Result<bool> {
        signal_group(self.pgid, Signal::SIGKILL)
    }

    /// Waits for the leader to exit and reaps it.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.child.wait().await?;
        self.exited = true;
        Ok(status)
    }

    /// The leader's exit status if it has exited (reaping it), without waiting.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        let status = self.child.try_wait()?;
        if status.is_some() {
            self.exited = true;
        }
        Ok(status)
    }

    /// Takes the leader's stdin pipe.
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    /// Takes the leader's stdout pipe.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Takes the leader's stderr pipe.
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }
}

impl Drop for GroupChild {
    fn drop(&mut self) {
        // Kill the group even when the leader already exited: its children may live on.
        let _ = self.kill();
    }
}

/// Every process in `/proc` that is not a zombie: `(pid, ppid, pgrp)`.
fn live_processes() -> Vec<(u32, u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| {
            entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
        })
        .filter_map(|pid| {
            let f = stat_fields(pid)?;
            let state = f.first()?.chars().next()?;
            (state != 'Z').then_some((pid, f.get(1)?.parse().ok()?, f.get(2)?.parse().ok()?))
        })
        .collect()
}

/// Every live descendant of `pid` (children, grandchildren, ...), read from `/proc`.
/// For tests and diagnostics: it answers "did anything survive?".
pub fn descendants(pid: u32) -> Vec<u32> {
    let procs = live_processes();
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(cur) = frontier.pop() {
        for &(p, pp, _) in &procs {
            if pp == cur && !out.contains(&p) {
                out.push(p);
                frontier.push(p);
            }
        }
    }
    out
}

/// The members of process group `pgid` that are alive and not zombies, read from `/proc`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    live_processes()
        .into_iter()
        .filter(|&(_, _, pg)| pg == pgid)
        .map(|(p, _, _)| p)
        .collect()
}

/// Fields of `/proc/PID/stat` after the command name: state, ppid, pgrp, ...
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may itself contain spaces or parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// This process's stdin and stdout as non-blocking pipes read and written through the event
/// loop, when both are pipes (as when an MCP client starts a stdio server). tokio's own stdin
/// and stdout hand every read and write to a blocking thread: a thread switch per message.
///
/// Both or neither: making a pipe non-blocking changes the open file itself, not only our
/// descriptor, and the fallback (tokio's stdin and stdout) reads and writes blocking. A
/// non-blocking stdin read that way fails with `EAGAIN` as soon as the client pauses, which
/// rmcp takes for the end of the connection.
pub fn stdio_pipes() -> Option<(
    tokio::net::unix::pipe::Receiver,
    tokio::net::unix::pipe::Sender,
)> {
    use std::os::fd::{AsFd as _, OwnedFd};
    use std::os::unix::fs::FileTypeExt as _;
    let pipe = |fd: OwnedFd| {
        let file = std::fs::File::from(fd);
        let is_fifo = file.metadata().is_ok_and(|m| m.file_type().is_fifo());
        is_fifo.then(|| OwnedFd::from(file))
    };
    let stdin = pipe(std::io::stdin().as_fd().try_clone_to_owned().ok()?)?;
    let stdout = pipe(std::io::stdout().as_fd().try_clone_to_owned().ok()?)?;
    let read = tokio::net::unix::pipe::Receiver::from_owned_fd(stdin).ok()?;
    let write = tokio::net::unix::pipe::Sender::from_owned_fd(stdout).ok()?;
    Some((read, write))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;
    use std::time::Duration;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    }

    async fn until_gone(pgid: u32) {
        for _ in 0..200 {
            if group_members(pgid).is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "process group {pgid} still has members {:?}",
            group_members(pgid)
        );
    }

    #[tokio::test]
    async fn killing_the_group_kills_grandchildren() {
        let mut child = GroupChild::spawn(sh("sleep 30 & sleep 30 & wait")).unwrap();
        let pgid = child.pgid();
        for _ in 0..200 {
            if descendants(pgid).len() >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(descendants(pgid).len(), 2, "the shell's two sleeps run");
        assert!(child.kill().unwrap());
        let status = child.wait().await.unwrap();
        assert!(!status.success());
        until_gone(pgid).await;
    }

    #[tokio::test]
    async fn dropping_a_child_kills_its_group() {
        let child = GroupChild::spawn(sh("sleep 30 & wait")).unwrap();
        let pgid = child.pgid();
        assert!(group_alive(pgid));
        drop(child);
        until_gone(pgid).await;
    }

    #[tokio::test]
    async fn the_child_leads_its_own_group() {
        let mut child = GroupChild::spawn(sh("exit 3")).unwrap();
        assert_ne!(child.pgid(), std::process::id());
        assert_eq!(child.wait().await.unwrap().code(), Some(3));
        assert!(
            !signal_group(child.pgid(), Signal::SIGTERM).unwrap()
                || group_members(child.pgid()).is_empty()
        );
    }

    #[test]
    fn refuses_to_signal_every_process() {
        assert!(signal_group(0, Signal::SIGKILL).is_err());
        assert!(signal_group(1, Signal::SIGKILL).is_err());
    }
}
