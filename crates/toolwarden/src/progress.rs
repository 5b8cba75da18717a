//! The progress line of `toolwarden call` on stderr: elapsed time, where the call is, and the
//! last progress message. On a terminal it is redrawn in place ten times a second; otherwise a
//! plain line is written every few seconds, so logs show that a long call is alive.

use std::io::{IsTerminal as _, Write as _};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use toolwarden_protocol::ProgressInfo;

/// Redraw interval on a terminal.
const TTY_TICK: Duration = Duration::from_millis(100);
/// Interval of plain progress lines when stderr is not a terminal.
pub(crate) const PLAIN_EVERY: Duration = Duration::from_secs(5);
/// Longest message shown (in characters).
const MESSAGE_MAX: usize = 120;

#[derive(Default)]
struct LineState {
    /// `running`, `awaiting_approval`, ...
    phase: Option<String>,
    progress: Option<ProgressInfo>,
    /// A prompt owns the terminal: draw nothing.
    paused: bool,
    /// Whether something is drawn on the current line.
    drawn: bool,
    done: bool,
}

/// The progress line of one call. Cheap to clone.
#[derive(Clone)]
pub(crate) struct ProgressLine {
    tool: Arc<str>,
    started: Instant,
    tty: bool,
    state: Arc<Mutex<LineState>>,
}

impl ProgressLine {
    /// Starts drawing (on its own task) for a call of `tool`.
    pub(crate) fn start(tool: &str) -> ProgressLine {
        let progress = ProgressLine {
            tool: tool.into(),
            started: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            state: Arc::default(),
        };
        let ticker = progress.clone();
        tokio::spawn(async move { ticker.tick().await });
        progress
    }

    /// Where the call is now (`running`, `awaiting_approval`, ...).
    pub(crate) fn set_phase(&self, phase: impl Into<String>) {
        self.state.lock().phase = Some(phase.into());
    }

    /// The backend's last progress report.
    pub(crate) fn set_progress(&self, info: ProgressInfo) {
        self.state.lock().progress = Some(info);
    }

    /// Clears the line and draws nothing until [`resume`](Self::resume) (a prompt needs the
    /// terminal).
    pub(crate) fn pause(&self) {
        let mut state = self.state.lock();
        state.paused = true;
        clear(&mut state, self.tty);
    }

    pub(crate) fn resume(&self) {
        self.state.lock().paused = false;
    }

    /// Writes `text` on lines of its own (the progress line is drawn again after it).
    pub(crate) fn note(&self, text: &str) {
        let mut state = self.state.lock();
        clear(&mut state, self.tty);
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{text}");
        let _ = err.flush();
    }

    /// Clears the line for good.
    pub(crate) fn finish(&self) {
        let mut state = self.state.lock();
        state.done = true;
        clear(&mut state, self.tty);
    }

    async fn tick(&self) {
        let every = if self.tty { TTY_TICK } else { PLAIN_EVERY };
        let mut interval = tokio::time::interval_at(Instant::now() + every, every);
        let mut frame = 0usize;
        loop {
            interval.tick().await;
            let mut state = self.state.lock();
            if state.done {
                return;
            }
            if state.paused {
                continue;
            }
            let line = self.line(&state);
            let mut err = std::io::stderr().lock();
            if self.tty {
                const SPIN: [char; 4] = ['|', '/', '-', '\\'];
                frame = frame.wrapping_add(1);
                let _ = write!(err, "\r\x1b[2K{} {line}", SPIN[(frame / 2) % SPIN.len()]);
                state.drawn = true;
            } else {
                let _ = writeln!(err, "toolwarden: {line}");
            }
            let _ = err.flush();
        }
    }

    /// `exec: running, 12.3s: compiling foo (3/10)`.
    fn line(&self, state: &LineState) -> String {
        let elapsed = self.started.elapsed();
        let mut line = format!(
            "{}: {}, {}",
            self.tool,
            state
                .phase
                .as_deref()
                .unwrap_or("running")
                .replace('_', " "),
            elapsed_text(elapsed, self.tty)
        );
        if let Some(p) = &state.progress {
            if let Some(message) = &p.message {
                let message: String = message.chars().take(MESSAGE_MAX).collect();
                line.push_str(": ");
                line.push_str(&message);
            }
            match (p.progress, p.total) {
                (Some(done), Some(total)) => line.push_str(&format!(" ({done}/{total})")),
                (Some(done), None) => line.push_str(&format!(" ({done})")),
                _ => {}
            }
        }
        line
    }
}

fn clear(state: &mut LineState, tty: bool) {
    if tty && state.drawn {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K");
        let _ = err.flush();
        state.drawn = false;
    }
}

/// `12.3s` on a terminal (it ticks), `12s` in plain lines.
fn elapsed_text(d: Duration, tenths: bool) -> String {
    let secs = d.as_secs();
    if secs >= 60 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else if tenths {
        format!("{}.{}s", secs, d.subsec_millis() / 100)
    } else {
        format!("{secs}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_reads_well() {
        assert_eq!(elapsed_text(Duration::from_millis(12_345), true), "12.3s");
        assert_eq!(elapsed_text(Duration::from_millis(12_345), false), "12s");
        assert_eq!(elapsed_text(Duration::from_secs(125), true), "2m05s");
    }
}
