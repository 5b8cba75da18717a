//! Approvals through MCP elicitation: an [`Interactor`] that asks the connected client.
//!
//! When a call needs approval (`approval = "ask"`) or a destructive-call confirmation
//! (`"confirm"`) and its client declared the elicitation capability (form mode), the client
//! gets `elicitation/create` with a form of one boolean, `approve`, and the interaction's
//! deadline. `accept` with `approve: true` approves; `accept` with `false`, `decline` and
//! `cancel` deny (fail closed). An error, or no answer before the deadline, answers nothing:
//! another interactor may still answer, and otherwise the engine's deadline denies the call
//! (`reason: timeout`, never recorded as a person's denial). When the interaction ends in any
//! other way (answered on the dashboard, timed out, its call cancelled), the elicitation is
//! withdrawn with `notifications/cancelled`.
//!
//! Secrets (`password`) are never asked through form elicitation (MCP forbids sensitive data
//! in form mode), nor are device codes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use rmcp::model::{ClientResult, ElicitRequest, ElicitResult, ElicitationAction, ServerRequest};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolwarden_core::{AnswerSender, Interactor};
use toolwarden_protocol::{
    EventScope, Interaction, InteractionAnswer, InteractionKind, Scope, SessionId,
};

use super::options::ELICITATION_INTERACTOR;
use super::state::GatewayState;

/// The elicitations in flight for approvals, by interaction id: the interactor adds them, and
/// the gateway's event watcher withdraws them when their interaction or call ends elsewhere.
#[derive(Default)]
pub(crate) struct Elicitations {
    pending: Mutex<HashMap<String, Pending>>,
    /// Whether `pending` has any (kept with it, under its lock): the event watcher only needs to
    /// hear of finished calls while there are.
    any: AtomicBool,
}

/// An elicitation in flight.
struct Pending {
    /// The call's principal and session.
    session: (Option<Arc<str>>, Option<SessionId>),
    call: Option<String>,
    cancel: CancellationToken,
}

impl Elicitations {
    /// Whether any elicitation is in flight.
    pub(crate) fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    fn add(&self, interaction: &Interaction, cancel: CancellationToken) {
        let mut pending = self.pending.lock();
        pending.insert(
            interaction.id.to_string(),
            Pending {
                session: (
                    interaction.scope.principal.clone(),
                    interaction.scope.session_id.clone(),
                ),
                call: interaction.scope.call_id.as_ref().map(|c| c.to_string()),
                cancel,
            },
        );
        self.any.store(true, Ordering::Release);
    }

    fn forget(&self, interaction: &Interaction) {
        let mut pending = self.pending.lock();
        pending.remove(interaction.id.as_str());
        self.any.store(!pending.is_empty(), Ordering::Release);
    }

    /// The interaction ended elsewhere: withdraw its elicitation.
    pub(crate) fn withdraw(&self, interaction: &str) {
        let mut pending = self.pending.lock();
        if let Some(p) = pending.remove(interaction) {
            p.cancel.cancel();
        }
        self.any.store(!pending.is_empty(), Ordering::Release);
    }

    /// A call ended: withdraw the elicitations of its approvals.
    pub(crate) fn withdraw_of_call(&self, scope: &EventScope, call: &str) {
        let mut pending = self.pending.lock();
        pending.retain(|_, p| {
            let of_call = p.call.as_deref() == Some(call)
                && p.session.1 == scope.session_id
                && p.session.0.as_deref() == scope.principal.as_deref();
            if of_call {
                p.cancel.cancel();
            }
            !of_call
        });
        self.any.store(!pending.is_empty(), Ordering::Release);
    }
}

/// Asks approvals of the calling client, through elicitation.
pub(crate) struct ElicitationInteractor {
    gateway: Weak<GatewayState>,
    elicitations: Arc<Elicitations>,
}

impl ElicitationInteractor {
    pub(crate) fn new(gateway: Weak<GatewayState>, elicitations: Arc<Elicitations>) -> Self {
        Self {
            gateway,
            elicitations,
        }
    }
}

impl Interactor for ElicitationInteractor {
    fn name(&self) -> &str {
        ELICITATION_INTERACTOR
    }

    fn can_answer(&self, interaction: &Interaction) -> bool {
        if !matches!(
            interaction.kind,
            InteractionKind::Approval | InteractionKind::Confirm
        ) {
            return false;
        }
        let Some(gw) = self.gateway.upgrade() else {
            return false;
        };
        // The client answers for its own calls only if its principal may answer approvals:
        // an agent's token without `approve` must not approve its own calls.
        gw.session_of_interaction(interaction).is_some_and(|s| {
            !s.is_ended() && s.principal.may(Scope::Approve) && s.supports_form_elicitation()
        })
    }

    fn present(&self, interaction: &Interaction, answers: AnswerSender) {
        let Some(gw) = self.gateway.upgrade() else {
            return;
        };
        let cancel = CancellationToken::new();
        self.elicitations.add(interaction, cancel.clone());
        let task = ask(
            self.gateway.clone(),
            self.elicitations.clone(),
            interaction.clone(),
            answers,
            cancel,
        );
        gw.tasks.spawn(task);
    }
}

async fn ask(
    gateway: Weak<GatewayState>,
    elicitations: Arc<Elicitations>,
    interaction: Interaction,
    answers: AnswerSender,
    cancel: CancellationToken,
) {
    let session = gateway
        .upgrade()
        .and_then(|gw| gw.session_of_interaction(&interaction));
    let Some(session) = session else {
        elicitations.forget(&interaction);
        return;
    };
    let request = match params(&interaction) {
        Ok(params) => ServerRequest::ElicitRequest(ElicitRequest::new(params)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot build the elicitation for an approval");
            elicitations.forget(&interaction);
            return;
        }
    };
    let call = session.call_key(
        interaction.scope.call_id.as_ref().map(|c| c.as_str()),
        interaction.scope.turn_id.as_ref().map(|t| t.as_str()),
    );
    let answered = session
        .request(
            call.as_deref(),
            request,
            Some(Duration::from_millis(interaction.timeout_ms)),
            cancel,
        )
        .await;
    elicitations.forget(&interaction);
    let answer = match answered {
        Ok(ClientResult::ElicitResult(result)) => decide(&result),
        Ok(other) => {
            match crate::servers::link::retype::<ElicitResult>(other, "elicitation/create") {
                Ok(result) => decide(&result),
                Err(_) => return,
            }
        }
        Err(e) => {
            tracing::debug!(interaction = %interaction.id, error = %e.message,
                "the elicitation got no answer; the approval waits for its deadline");
            return;
        }
    };
    // The session's principal answered: elicitation is offered only to a principal holding
    // `approve`, the call's own.
    let answer = InteractionAnswer {
        answerer: interaction.scope.principal.as_deref().map(str::to_owned),
        ..answer
    };
    if let Err(e) = answers.answer(answer, ELICITATION_INTERACTOR) {
        tracing::debug!(error = %e, "the elicitation's answer came too late");
    }
}

/// The form put before the person.
fn params(
    interaction: &Interaction,
) -> Result<rmcp::model::ElicitRequestParams, serde_json::Error> {
    let verb = match interaction.kind {
        InteractionKind::Confirm => "Confirm",
        _ => "Approve",
    };
    // The engine's question names the tool.
    let mut message = interaction.message.clone();
    if let Some(input) = &interaction.input {
        let mut shown = input.to_string();
        if shown.len() > 2000 {
            let mut cut = 2000;
            while !shown.is_char_boundary(cut) {
                cut -= 1;
            }
            shown.truncate(cut);
            shown.push('…');
        }
        message.push_str(&format!("\n\nInput: {shown}"));
    }
    let seconds = interaction.timeout_ms.div_ceil(1000);
    message.push_str(&format!(
        "\n\nWithout an answer within {seconds}s the call is denied."
    ));
    serde_json::from_value(json!({
        "mode": "form",
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": {
                "approve": {
                    "type": "boolean",
                    "title": verb,
                    "description": format!("{verb} this tool call"),
                    "default": false
                }
            },
            "required": ["approve"]
        }
    }))
}

/// A person's answer to the form. Anything but an explicit approval denies.
fn decide(result: &ElicitResult) -> InteractionAnswer {
    let deny = |reason: &str| InteractionAnswer {
        reason: Some(reason.to_owned()),
        ..InteractionAnswer::deny()
    };
    match result.action {
        ElicitationAction::Accept => {
            let approved = result
                .content
                .as_ref()
                .and_then(|c| c.get("approve"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if approved {
                InteractionAnswer::approve()
            } else {
                deny("not approved in the MCP client")
            }
        }
        ElicitationAction::Decline => deny("declined in the MCP client"),
        _ => deny("dismissed in the MCP client"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn result(action: &str, content: Option<Value>) -> ElicitResult {
        serde_json::from_value(json!({"action": action, "content": content})).unwrap()
    }

    #[test]
    fn only_an_explicit_approval_approves() {
        assert_eq!(
            decide(&result("accept", Some(json!({"approve": true})))),
            InteractionAnswer::approve()
        );
        for (action, content, reason) in [
            (
                "accept",
                Some(json!({"approve": false})),
                "not approved in the MCP client",
            ),
            ("accept", None, "not approved in the MCP client"),
            ("decline", None, "declined in the MCP client"),
            ("cancel", None, "dismissed in the MCP client"),
        ] {
            let answer = decide(&result(action, content));
            assert_eq!(answer.action, InteractionAnswer::deny().action, "{action}");
            assert_eq!(answer.reason.as_deref(), Some(reason));
        }
    }
}
