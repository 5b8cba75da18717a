//! The terminal prompt of `toolwarden call`: an approval or confirm is asked on stderr, with a
//! countdown to its deadline, and answered y/N on stdin. No answer by the deadline leaves the
//! engine to deny the call (`denied{policy, timeout}`), as everywhere else.

use std::io::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{Mutex, mpsc};
use toolwarden_core::{AnswerSender, Interactions, Interactor};
use toolwarden_protocol::{Interaction, InteractionAnswer, InteractionKind, Timestamp};

use crate::progress::ProgressLine;
use crate::say::say;

/// The name answers from the terminal are recorded under (`interaction_answered.by`).
pub(crate) const INTERACTOR: &str = "terminal";

/// How often the countdown is redrawn and the question checked for having gone away.
const TICK: Duration = Duration::from_millis(250);

/// Lines read from stdin by one thread for the life of the process (`None` at end of input).
/// A plain thread, not a blocking task: a read cannot be cancelled, and the runtime must not
/// wait for it at exit.
fn stdin_lines() -> &'static Mutex<mpsc::UnboundedReceiver<Option<String>>> {
    static LINES: OnceLock<Mutex<mpsc::UnboundedReceiver<Option<String>>>> = OnceLock::new();
    LINES.get_or_init(|| {
        let (tx, rx) = mpsc::unbounded_channel();
        let spawned = std::thread::Builder::new()
            .name("stdin".into())
            .spawn(move || {
                let stdin = std::io::stdin();
                loop {
                    let mut line = String::new();
                    match stdin.read_line(&mut line) {
                        Ok(0) | Err(_) => {
                            let _ = tx.send(None);
                            return;
                        }
                        Ok(_) => {
                            if tx.send(Some(line)).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        if spawned.is_err() {
            // No reader: every prompt sees the end of input and denies.
            let (tx, rx) = mpsc::unbounded_channel();
            let _ = tx.send(None);
            return Mutex::new(rx);
        }
        Mutex::new(rx)
    })
}

/// Asks `interaction` on the terminal. `None` when it went away first (answered elsewhere,
/// timed out, its call cancelled: `still_pending` turned false) or its deadline passed.
pub(crate) async fn ask(
    interaction: &Interaction,
    progress: &ProgressLine,
    still_pending: impl Fn() -> bool,
) -> Option<InteractionAnswer> {
    let mut lines = stdin_lines().lock().await;
    // Whatever was typed before the question is not its answer.
    while lines.try_recv().is_ok() {}
    progress.pause();
    let question = match interaction.kind {
        InteractionKind::Confirm => "Confirm?",
        _ => "Allow?",
    };
    {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "toolwarden: {}", interaction.message);
        if let Some(input) = &interaction.input {
            let _ = writeln!(err, "  input: {input}");
        }
        let _ = writeln!(err, "  {}", countdown(interaction));
        let _ = write!(err, "{question} [y/N] ");
        let _ = err.flush();
    }
    let mut tick = tokio::time::interval(TICK);
    let mut shown = countdown(interaction);
    let answer = loop {
        tokio::select! {
            line = lines.recv() => break match line.flatten() {
                Some(line) if matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes") => {
                    say!("toolwarden: approved");
                    Some(InteractionAnswer::approve())
                }
                Some(_) => {
                    say!("toolwarden: denied");
                    Some(InteractionAnswer {
                        reason: Some("denied at the terminal".to_owned()),
                        ..InteractionAnswer::deny()
                    })
                }
                None => {
                    say!();
                    say!("toolwarden: end of input: denied");
                    Some(InteractionAnswer {
                        reason: Some("no answer: the terminal's input ended".to_owned()),
                        ..InteractionAnswer::deny()
                    })
                }
            },
            _ = tick.tick() => {
                if !still_pending() || left_ms(interaction) <= 0 {
                    say!();
                    say!("toolwarden: the question is closed (answered elsewhere, timed out or cancelled)");
                    break None;
                }
                let now = countdown(interaction);
                if now == shown {
                    continue;
                }
                // The countdown sits on the line above the input: save the cursor, rewrite that
                // line, restore, so what the user is typing stays where it is.
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\x1b7\x1b[1A\r\x1b[2K  {now}\x1b8");
                let _ = err.flush();
                shown = now;
            }
        }
    };
    progress.resume();
    answer
}

/// Milliseconds to the deadline.
fn left_ms(interaction: &Interaction) -> i64 {
    interaction.deadline.unix_millis() - Timestamp::now().unix_millis()
}

fn countdown(interaction: &Interaction) -> String {
    let secs = (left_ms(interaction).max(0) + 999) / 1000;
    format!(
        "{}:{:02} left; no answer denies the call",
        secs / 60,
        secs % 60
    )
}

/// The terminal as an [`Interactor`] of a local engine: approvals and confirms (not secrets,
/// which would need input without echo).
pub(crate) struct TerminalInteractor {
    pub(crate) progress: ProgressLine,
    pub(crate) interactions: Interactions,
}

impl Interactor for TerminalInteractor {
    fn name(&self) -> &str {
        INTERACTOR
    }

    fn can_answer(&self, interaction: &Interaction) -> bool {
        matches!(
            interaction.kind,
            InteractionKind::Approval | InteractionKind::Confirm
        )
    }

    fn present(&self, interaction: &Interaction, answers: AnswerSender) {
        let interaction = interaction.clone();
        let progress = self.progress.clone();
        let interactions = self.interactions.clone();
        tokio::spawn(async move {
            let id = interaction.id.clone();
            let pending = move || interactions.pending().iter().any(|i| i.id == id);
            if let Some(answer) = ask(&interaction, &progress, pending).await {
                // Refused only when the question went away meanwhile: nothing to do.
                let _ = answers.answer(answer, INTERACTOR);
            }
        });
    }
}

/// Attaches the terminal to `interactions`.
pub(crate) fn attach(interactions: &Interactions, progress: &ProgressLine) {
    interactions.attach(Arc::new(TerminalInteractor {
        progress: progress.clone(),
        interactions: interactions.clone(),
    }));
}
