//! Interactions: questions to a human, each with a finite deadline (docs/GOVERNANCE.md,
//! "Interactions").
//!
//! The key rule: **nothing waits forever and nothing fails open.** Every request has a deadline of
//! at most `interaction_ceiling`; a timeout is recorded as `interaction_timed_out`, never as a
//! person's denial; when nothing attached can answer (headless), a request follows its declared
//! non-interactive default or fails at once.
//!
//! Interactors are the things that can put a question before a person: the HTTP API, and a
//! dashboard when there is one (passive: they list [`Interactions::pending`] and answer with
//! [`Interactions::answer`]); a terminal prompt and MCP elicitation to the connected client
//! (active: they are handed each question through [`Interactor::present`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use serde_json::Value;
use tokio::sync::oneshot;
use toolwarden_protocol::{
    EventKind, Interaction, InteractionAction, InteractionAnswer, InteractionId, InteractionKind,
    InteractionOutcome, Timestamp,
};

use crate::events::{EventBus, EventScope};
use crate::metrics::Metrics;

/// Something that can put a question before a person.
pub trait Interactor: Send + Sync + 'static {
    /// A short name (`http`, `terminal`, `elicitation`), recorded as who answered.
    fn name(&self) -> &str;

    /// Whether it can put this question before a person now.
    fn can_answer(&self, interaction: &Interaction) -> bool;

    /// Hands it the question. Passive interactors do nothing (the question is listed as pending);
    /// active ones ask and reply through `answers`. Must not block.
    fn present(&self, interaction: &Interaction, answers: AnswerSender);
}

/// Replies to one interaction.
#[derive(Clone)]
pub struct AnswerSender {
    broker: Weak<Broker>,
    id: InteractionId,
}

impl AnswerSender {
    /// Answers the interaction; fails if it is no longer pending.
    pub fn answer(&self, answer: InteractionAnswer, by: &str) -> Result<(), AnswerError> {
        match self.broker.upgrade() {
            Some(inner) => inner.answer(&self.id, answer, by),
            None => Err(AnswerError::NotPending(self.id.clone())),
        }
    }

    /// The interaction answered.
    pub fn id(&self) -> &InteractionId {
        &self.id
    }
}

/// Why an answer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// Unknown, already answered, or timed out.
    #[error("interaction {0} is not pending (unknown, already answered or timed out)")]
    NotPending(InteractionId),
    /// A `password` interaction approved without a value.
    #[error("interaction {0} asks for a secret: an approval must carry a value")]
    MissingValue(InteractionId),
}

/// Why a request was refused before anyone was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The request declared no (or a zero) timeout.
    #[error("an interaction must declare a finite, positive timeout")]
    NoTimeout,
}

/// A question to ask.
#[derive(Clone, Debug)]
pub struct InteractionRequest {
    /// What is asked.
    pub kind: InteractionKind,
    /// The question, for a person.
    pub message: String,
    /// Who asks.
    pub scope: Arc<EventScope>,
    /// The call's input, for approvals and confirms.
    pub input: Option<Value>,
    /// Kind-specific details.
    pub details: Option<Value>,
    /// The deadline (clamped to the ceiling).
    pub timeout: Duration,
    /// What happens when nothing can answer; `None` = fail at once.
    pub default_action: Option<InteractionAction>,
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InteractionEnd {
    /// A person answered.
    Answered(InteractionAnswer),
    /// Its deadline passed.
    TimedOut {
        /// The deadline that passed.
        after: Duration,
    },
    /// Nothing could answer and it had no default.
    NoInteractor,
    /// Nothing could answer; it followed its default.
    Defaulted(InteractionAction),
    /// The asker was cancelled while it waited.
    Cancelled,
}

struct PendingEntry {
    interaction: Interaction,
    tx: oneshot::Sender<(InteractionAnswer, String)>,
}

struct Broker {
    pending: Mutex<HashMap<InteractionId, PendingEntry>>,
    interactors: RwLock<Vec<Arc<dyn Interactor>>>,
    headless: AtomicBool,
    ceiling: Mutex<Duration>,
    bus: Arc<EventBus>,
    metrics: Arc<Metrics>,
}

impl Broker {
    fn answer(
        &self,
        id: &InteractionId,
        answer: InteractionAnswer,
        by: &str,
    ) -> Result<(), AnswerError> {
        let mut pending = self.pending.lock();
        let Some(entry) = pending.get(id) else {
            return Err(AnswerError::NotPending(id.clone()));
        };
        if entry.interaction.kind == InteractionKind::Password
            && answer.action == InteractionAction::Approve
            && answer.value.as_deref().is_none_or(str::is_empty)
        {
            return Err(AnswerError::MissingValue(id.clone()));
        }
        let Some(entry) = pending.remove(id) else {
            return Err(AnswerError::NotPending(id.clone()));
        };
        entry
            .tx
            .send((answer, by.to_owned()))
            .map_err(|_| AnswerError::NotPending(id.clone()))
    }
}

/// The engine's interaction broker.
#[derive(Clone)]
pub struct Interactions {
    inner: Arc<Broker>,
}

impl std::fmt::Debug for Interactions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interactions")
            .field("pending", &self.inner.pending.lock().len())
            .finish()
    }
}

/// Removes a pending interaction when its asker stops waiting, however that happens.
struct PendingGuard<'a> {
    inner: &'a Broker,
    id: InteractionId,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.inner.pending.lock().remove(&self.id);
    }
}

impl Interactions {
    pub(crate) fn new(bus: Arc<EventBus>, metrics: Arc<Metrics>, ceiling: Duration) -> Self {
        Self {
            inner: Arc::new(Broker {
                pending: Mutex::new(HashMap::new()),
                interactors: RwLock::new(Vec::new()),
                headless: AtomicBool::new(false),
                ceiling: Mutex::new(ceiling),
                bus,
                metrics,
            }),
        }
    }

    /// Attaches an interactor.
    pub fn attach(&self, interactor: Arc<dyn Interactor>) {
        self.inner.interactors.write().push(interactor);
    }

    /// Detaches every interactor called `name`.
    pub fn detach(&self, name: &str) {
        self.inner.interactors.write().retain(|i| i.name() != name);
    }

    /// Headless: nothing can answer, whatever is attached.
    pub fn set_headless(&self, headless: bool) {
        self.inner.headless.store(headless, Ordering::Relaxed);
    }

    /// Whether this run is headless.
    pub fn is_headless(&self) -> bool {
        self.inner.headless.load(Ordering::Relaxed)
    }

    /// Sets the ceiling every deadline is capped at.
    pub fn set_ceiling(&self, ceiling: Duration) {
        *self.inner.ceiling.lock() = ceiling;
    }

    /// The interactions waiting for an answer, oldest first.
    pub fn pending(&self) -> Vec<Interaction> {
        let mut v: Vec<Interaction> = self
            .inner
            .pending
            .lock()
            .values()
            .map(|e| e.interaction.clone())
            .collect();
        v.sort_by(|a, b| {
            a.created_at
                .cmp(&b.created_at)
                .then_with(|| a.id.cmp(&b.id))
        });
        v
    }

    /// Answers a pending interaction.
    pub fn answer(
        &self,
        id: &InteractionId,
        answer: InteractionAnswer,
        by: &str,
    ) -> Result<(), AnswerError> {
        self.inner.answer(id, answer, by)
    }

    /// Asks a person, waiting at most the request's timeout (capped at the ceiling), or until
    /// `cancelled` resolves.
    pub async fn ask(
        &self,
        req: InteractionRequest,
        cancelled: impl std::future::Future<Output = ()>,
    ) -> Result<InteractionEnd, RequestError> {
        if req.timeout.is_zero() {
            return Err(RequestError::NoTimeout);
        }
        let inner = &*self.inner;
        let timeout = req.timeout.min(*inner.ceiling.lock());
        let created_at = Timestamp::now();
        let interaction = Interaction {
            id: InteractionId::new(format!("i_{}", ulid::Ulid::new())),
            kind: req.kind,
            message: req.message,
            scope: (*req.scope).clone(),
            input: req.input,
            details: req.details,
            timeout_ms: timeout.as_millis() as u64,
            created_at,
            deadline: created_at.plus(timeout),
            default_action: req.default_action,
        };
        let capable: Vec<Arc<dyn Interactor>> = if self.is_headless() {
            Vec::new()
        } else {
            inner
                .interactors
                .read()
                .iter()
                .filter(|i| i.can_answer(&interaction))
                .cloned()
                .collect()
        };
        if capable.is_empty() {
            return Ok(match req.default_action {
                Some(action) => {
                    inner
                        .metrics
                        .interaction(req.kind, InteractionOutcome::Defaulted);
                    InteractionEnd::Defaulted(action)
                }
                None => {
                    inner
                        .metrics
                        .interaction(req.kind, InteractionOutcome::NoInteractor);
                    InteractionEnd::NoInteractor
                }
            });
        }
        let (tx, rx) = oneshot::channel();
        let id = interaction.id.clone();
        inner.pending.lock().insert(
            id.clone(),
            PendingEntry {
                interaction: interaction.clone(),
                tx,
            },
        );
        let _guard = PendingGuard {
            inner,
            id: id.clone(),
        };
        inner.bus.emit(
            &req.scope,
            EventKind::InteractionRequested {
                interaction: Box::new(interaction.clone()),
            },
        );
        for interactor in capable {
            interactor.present(
                &interaction,
                AnswerSender {
                    broker: Arc::downgrade(&self.inner),
                    id: id.clone(),
                },
            );
        }
        tokio::select! {
            answer = rx => match answer {
                Ok((answer, by)) => {
                    inner.bus.emit(&req.scope, EventKind::InteractionAnswered {
                        interaction_id: id,
                        kind: req.kind,
                        action: answer.action,
                        by: Some(by),
                        answerer: answer.answerer.clone(),
                    });
                    inner.metrics.interaction(req.kind, match answer.action {
                        InteractionAction::Approve => InteractionOutcome::Approved,
                        InteractionAction::Deny => InteractionOutcome::Denied,
                    });
                    Ok(InteractionEnd::Answered(answer))
                }
                // The sender is only dropped when the entry is removed without an answer.
                Err(_) => Ok(InteractionEnd::Cancelled),
            },
            () = tokio::time::sleep(timeout) => {
                inner.pending.lock().remove(&id);
                inner.bus.emit(&req.scope, EventKind::InteractionTimedOut {
                    interaction_id: id,
                    kind: req.kind,
                    after_ms: timeout.as_millis() as u64,
                });
                inner.metrics.interaction(req.kind, InteractionOutcome::TimedOut);
                Ok(InteractionEnd::TimedOut { after: timeout })
            }
            () = cancelled => {
                inner.metrics.interaction(req.kind, InteractionOutcome::Cancelled);
                Ok(InteractionEnd::Cancelled)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Received;

    struct Passive;
    impl Interactor for Passive {
        fn name(&self) -> &str {
            "http"
        }
        fn can_answer(&self, _: &Interaction) -> bool {
            true
        }
        fn present(&self, _: &Interaction, _: AnswerSender) {}
    }

    struct AutoApprove;
    impl Interactor for AutoApprove {
        fn name(&self) -> &str {
            "robot"
        }
        fn can_answer(&self, _: &Interaction) -> bool {
            true
        }
        fn present(&self, _: &Interaction, answers: AnswerSender) {
            tokio::spawn(async move {
                let _ = answers.answer(InteractionAnswer::approve(), "robot");
            });
        }
    }

    fn broker() -> (Interactions, Arc<EventBus>) {
        let bus = Arc::new(EventBus::new(64));
        (
            Interactions::new(
                bus.clone(),
                Arc::new(Metrics::new()),
                Duration::from_secs(900),
            ),
            bus,
        )
    }

    fn approval(
        timeout: Duration,
        default_action: Option<InteractionAction>,
    ) -> InteractionRequest {
        InteractionRequest {
            kind: InteractionKind::Approval,
            message: "May I?".into(),
            scope: Arc::new(EventScope::default()),
            input: None,
            details: None,
            timeout,
            default_action,
        }
    }

    /// Asks `b` for an approval that no cancel ends.
    async fn ask_approval(
        b: &Interactions,
        timeout: Duration,
        default_action: Option<InteractionAction>,
    ) -> InteractionEnd {
        b.ask(approval(timeout, default_action), std::future::pending())
            .await
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn headless_without_a_default_fails_at_once() {
        let (b, _) = broker();
        b.attach(Arc::new(Passive));
        b.set_headless(true);
        let end = ask_approval(&b, Duration::from_secs(120), None).await;
        assert_eq!(end, InteractionEnd::NoInteractor);
        let end = ask_approval(&b, Duration::from_secs(120), Some(InteractionAction::Deny)).await;
        assert_eq!(end, InteractionEnd::Defaulted(InteractionAction::Deny));
    }

    #[tokio::test(start_paused = true)]
    async fn no_interactor_attached_is_headless() {
        let (b, _) = broker();
        let end = ask_approval(&b, Duration::from_secs(120), None).await;
        assert_eq!(end, InteractionEnd::NoInteractor);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_is_a_timeout_not_a_denial() {
        let (b, bus) = broker();
        b.attach(Arc::new(Passive));
        let mut events = bus.subscribe();
        let started = tokio::time::Instant::now();
        let end = ask_approval(&b, Duration::from_secs(120), None).await;
        assert_eq!(
            end,
            InteractionEnd::TimedOut {
                after: Duration::from_secs(120)
            }
        );
        assert_eq!(started.elapsed(), Duration::from_secs(120));
        let mut types = Vec::new();
        while let Some(Received::Event(e)) = events.try_recv() {
            types.push(e.kind.name());
        }
        assert_eq!(
            types,
            vec!["interaction_requested", "interaction_timed_out"]
        );
        assert!(b.pending().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_are_capped_at_the_ceiling() {
        let (b, _) = broker();
        b.attach(Arc::new(Passive));
        b.set_ceiling(Duration::from_secs(60));
        let end = ask_approval(&b, Duration::from_secs(3600), None).await;
        assert_eq!(
            end,
            InteractionEnd::TimedOut {
                after: Duration::from_secs(60)
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn answers_reach_the_asker_and_only_once() {
        let (b, _) = broker();
        b.attach(Arc::new(Passive));
        let b2 = b.clone();
        let asker = tokio::spawn(async move {
            b2.ask(
                approval(Duration::from_secs(120), None),
                std::future::pending(),
            )
            .await
        });
        tokio::task::yield_now().await;
        let pending = b.pending();
        assert_eq!(pending.len(), 1);
        let id = pending[0].id.clone();
        assert_eq!(pending[0].timeout_ms, 120_000);
        b.answer(&id, InteractionAnswer::deny(), "http").unwrap();
        assert_eq!(
            b.answer(&id, InteractionAnswer::approve(), "http"),
            Err(AnswerError::NotPending(id))
        );
        assert_eq!(
            asker.await.unwrap().unwrap(),
            InteractionEnd::Answered(InteractionAnswer::deny())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn active_interactors_answer_through_the_sender() {
        let (b, _) = broker();
        b.attach(Arc::new(AutoApprove));
        let end = ask_approval(&b, Duration::from_secs(120), None).await;
        assert_eq!(end, InteractionEnd::Answered(InteractionAnswer::approve()));
    }

    #[tokio::test(start_paused = true)]
    async fn zero_timeout_is_refused() {
        let (b, _) = broker();
        assert_eq!(
            b.ask(approval(Duration::ZERO, None), std::future::pending())
                .await,
            Err(RequestError::NoTimeout)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_secret_must_carry_a_value_and_is_not_evented() {
        let (b, bus) = broker();
        b.attach(Arc::new(Passive));
        let mut events = bus.subscribe();
        let b2 = b.clone();
        let asker = tokio::spawn(async move {
            let mut req = approval(Duration::from_secs(120), None);
            req.kind = InteractionKind::Password;
            b2.ask(req, std::future::pending()).await
        });
        tokio::task::yield_now().await;
        let id = b.pending()[0].id.clone();
        assert_eq!(
            b.answer(&id, InteractionAnswer::approve(), "http"),
            Err(AnswerError::MissingValue(id.clone()))
        );
        let secret = InteractionAnswer {
            value: Some("hunter2".into()),
            ..InteractionAnswer::approve()
        };
        b.answer(&id, secret.clone(), "http").unwrap();
        assert_eq!(
            asker.await.unwrap().unwrap(),
            InteractionEnd::Answered(secret)
        );
        while let Some(Received::Event(e)) = events.try_recv() {
            assert!(!serde_json::to_string(&*e).unwrap().contains("hunter2"));
        }
    }
}
