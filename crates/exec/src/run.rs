//! Running one command: spawn, read, stop.
//!
//! One future owns everything (the group, its pipes, the stdin writer) and drives it with a single
//! `select!` loop, so no task outlives the attempt and dropping the future kills the group (the
//! [`GroupChild`] does that on drop).

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{ChildStdin, Command};
use tokio::time::{Instant, MissedTickBehavior};
use toolwarden_core::{AttemptEnd, Heartbeat, StopSignals, ToolOutput};
use toolwarden_process::{GroupChild, group_alive, group_members, signal_group};
use toolwarden_protocol::{ProgressInfo, StopHow};

use crate::capture::{Capture, Stream};
use crate::report::{FinishedCommand, spawn_failed};
use crate::settings::ExecSettings;

/// Bytes read from a pipe at a time.
const READ_BUF: usize = 32 * 1024;
/// How often a stopping group is checked for being gone.
const GONE_POLL: Duration = Duration::from_millis(20);
/// After SIGKILL, how long to wait for the group to disappear before reporting it killed anyway
/// (a process in uninterruptible sleep dies only when its I/O returns).
const KILL_SETTLE: Duration = Duration::from_secs(1);
/// At most one `progress()` per this interval.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);
/// A progress message is the last output line, cut to this many characters.
const PROGRESS_CHARS: usize = 200;

/// A command ready to run.
#[derive(Debug)]
pub(crate) struct PreparedCommand {
    pub(crate) command: String,
    pub(crate) cwd: PathBuf,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) stdin: Option<String>,
}

/// Where the attempt stands with respect to a stop request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// No stop requested.
    Running,
    /// SIGTERM sent to the group; waiting for it to go.
    Terminating,
    /// SIGKILL sent to the group.
    Killed { at: Instant },
}

/// Runs `prepared` to its end or until stopped.
pub(crate) async fn run(
    settings: &ExecSettings,
    prepared: PreparedCommand,
    stop: StopSignals,
    heartbeat: Heartbeat,
) -> AttemptEnd {
    let started = Instant::now();
    let mut cmd = Command::new(&settings.shell);
    cmd.arg("-c")
        .arg(&prepared.command)
        .current_dir(&prepared.cwd)
        .stdin(if prepared.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for name in &settings.env_remove {
        cmd.env_remove(name);
    }
    cmd.envs(prepared.env.iter().map(|(k, v)| (k, v)));

    let mut child = match GroupChild::spawn(cmd) {
        Ok(child) => child,
        Err(e) => return AttemptEnd::Done(Ok(spawn_failed(settings, &prepared.cwd, &e))),
    };
    let pgid = child.pgid();
    let mut stdout = child.take_stdout();
    let mut stderr = child.take_stderr();
    let mut stdin: Option<Pin<Box<dyn Future<Output = ()> + Send>>> =
        match (child.take_stdin(), prepared.stdin) {
            (Some(pipe), Some(text)) => Some(Box::pin(feed(pipe, text.into_bytes()))),
            _ => None,
        };

    let mut capture = Capture::new(settings.output_limit);
    let mut progress = OutputProgress::new(heartbeat.clone());
    let mut out_buf = vec![0u8; READ_BUF];
    let mut err_buf = vec![0u8; READ_BUF];
    let mut status: Option<ExitStatus> = None;
    let mut drain_until: Option<Instant> = None;
    let mut output_unfinished = false;
    let mut phase = Phase::Running;
    let mut gone_poll = tokio::time::interval(GONE_POLL);
    gone_poll.set_missed_tick_behavior(MissedTickBehavior::Delay);

    loop {
        if phase == Phase::Running && status.is_some() && stdout.is_none() && stderr.is_none() {
            break;
        }
        tokio::select! {
            biased;
            () = stop.forced(), if !matches!(phase, Phase::Killed { .. }) => {
                let _ = child.kill();
                phase = Phase::Killed { at: Instant::now() };
            }
            () = stop.cancelled(), if phase == Phase::Running => {
                // Fails only when the group is already gone, which the poll below sees. SIGCONT
                // after it, as shells do: a stopped process runs its SIGTERM handler only once
                // continued.
                let _ = child.terminate();
                let _ = signal_group(pgid, Signal::SIGCONT);
                phase = Phase::Terminating;
            }
            waited = child.wait(), if status.is_none() => {
                match waited {
                    Ok(s) => status = Some(s),
                    Err(e) => {
                        // Cannot happen for a child we own; give up on it (drop kills the group).
                        return AttemptEnd::Done(Ok(ToolOutput::error(format!(
                            "exec: could not wait for the command: {e}"
                        ))));
                    }
                }
                if phase == Phase::Running {
                    drain_until = Some(Instant::now() + settings.drain_timeout);
                }
            }
            // Once a stop was requested, output is still read (nobody blocks on a full pipe
            // while stopping) but dropped.
            n = read_some(&mut stdout, &mut out_buf), if stdout.is_some() => match n {
                Some(n) if phase == Phase::Running => {
                    capture.push(Stream::Stdout, &out_buf[..n]);
                    progress.output(&out_buf[..n]);
                }
                Some(_) => {}
                None => stdout = None,
            },
            n = read_some(&mut stderr, &mut err_buf), if stderr.is_some() => match n {
                Some(n) if phase == Phase::Running => {
                    capture.push(Stream::Stderr, &err_buf[..n]);
                    progress.output(&err_buf[..n]);
                }
                Some(_) => {}
                None => stderr = None,
            },
            () = sleep_until_opt(drain_until), if phase == Phase::Running && drain_until.is_some() => {
                // The shell exited long enough ago; whoever still holds the pipes is a background
                // process. Stop reading; the group is killed below.
                output_unfinished = stdout.is_some() || stderr.is_some();
                stdout = None;
                stderr = None;
            }
            () = async { if let Some(f) = stdin.as_mut() { f.await } }, if stdin.is_some() => {
                stdin = None;
            }
            () = sleep_until_opt(progress.due()), if phase == Phase::Running && progress.due().is_some() => {
                progress.flush();
            }
            _ = gone_poll.tick(), if phase != Phase::Running => {
                if let Phase::Killed { at } = phase {
                    // Repeat the kill: cheap, and covers anything forked around the first one.
                    let _ = child.kill();
                    // The leader may not even be reaped yet if it sits in uninterruptible sleep;
                    // the forced stop must end promptly regardless (tokio reaps it later).
                    if (status.is_some() && group_gone(pgid)) || at.elapsed() >= KILL_SETTLE {
                        return AttemptEnd::Stopped(StopHow::Killed);
                    }
                } else if status.is_some() && group_gone(pgid) {
                    return AttemptEnd::Stopped(StopHow::Cooperative);
                }
            }
        }
    }

    // The command is done. Anything left of its group is a background process: kill it, so that
    // a finished call leaves nothing running (and nothing holding our pipes).
    let background_killed = !group_gone(pgid);
    if background_killed {
        kill_and_settle(&child, pgid).await;
    }
    let Some(status) = status else {
        // The loop ends in the running phase only once the status is known.
        return AttemptEnd::Done(Ok(ToolOutput::error(
            "exec: the command ended without an exit status",
        )));
    };
    AttemptEnd::Done(Ok(FinishedCommand {
        status,
        capture,
        duration: started.elapsed(),
        output_unfinished,
        background_killed,
        drain_timeout: settings.drain_timeout,
        output_limit: settings.output_limit,
    }
    .into_output()))
}

/// Whether no live (non-zombie) process is left in group `pgid`.
fn group_gone(pgid: u32) -> bool {
    !group_alive(pgid) || group_members(pgid).is_empty()
}

/// SIGKILLs the group and waits (briefly) until it is gone.
async fn kill_and_settle(child: &GroupChild, pgid: u32) {
    let until = Instant::now() + KILL_SETTLE;
    while !group_gone(pgid) && Instant::now() < until {
        let _ = child.kill();
        tokio::time::sleep(GONE_POLL / 4).await;
    }
}

/// Reads once; `None` at end of file or on error (a broken pipe is the end of the output).
async fn read_some<R: AsyncRead + Unpin>(pipe: &mut Option<R>, buf: &mut [u8]) -> Option<usize> {
    let pipe = pipe.as_mut()?;
    match pipe.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Writes the input's `stdin` and closes the pipe. A command that does not read its input
/// closes the pipe early; that is not an error.
async fn feed(mut pipe: ChildStdin, bytes: Vec<u8>) {
    let _ = pipe.write_all(&bytes).await;
    let _ = pipe.shutdown().await;
}

/// Turns output into heartbeats (every chunk) and progress messages (the last line, at most one
/// per [`PROGRESS_EVERY`], the latest one sent when the interval has passed).
struct OutputProgress {
    heartbeat: Heartbeat,
    last_sent: Option<Instant>,
    pending: Option<String>,
}

impl OutputProgress {
    fn new(heartbeat: Heartbeat) -> Self {
        Self {
            heartbeat,
            last_sent: None,
            pending: None,
        }
    }

    fn output(&mut self, chunk: &[u8]) {
        self.heartbeat.beat();
        if let Some(line) = last_line(chunk) {
            self.pending = Some(line);
        }
        if self.due().is_some_and(|at| at <= Instant::now()) {
            self.flush();
        }
    }

    /// When the pending message may be sent.
    fn due(&self) -> Option<Instant> {
        self.pending.as_ref()?;
        Some(
            self.last_sent
                .map_or_else(Instant::now, |t| t + PROGRESS_EVERY),
        )
    }

    fn flush(&mut self) {
        if let Some(message) = self.pending.take() {
            self.last_sent = Some(Instant::now());
            self.heartbeat.progress(ProgressInfo {
                progress: None,
                total: None,
                message: Some(message),
            });
        }
    }
}

/// The last non-blank line of a chunk, trimmed and shortened.
fn last_line(chunk: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(chunk);
    let line = text
        .split(['\n', '\r'])
        .map(str::trim)
        .rfind(|l| !l.is_empty())?;
    let mut short: String = line.chars().take(PROGRESS_CHARS).collect();
    if short.len() < line.len() {
        short.push('…');
    }
    Some(short)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_message_is_the_last_line() {
        assert_eq!(last_line(b"a\nb\n\n"), Some("b".to_owned()));
        assert_eq!(last_line(b"50%\r75%\r"), Some("75%".to_owned()));
        assert_eq!(last_line(b"  \n"), None);
        let long = "x".repeat(300);
        assert_eq!(
            last_line(long.as_bytes()).map(|l| l.chars().count()),
            Some(PROGRESS_CHARS + 1)
        );
    }
}
