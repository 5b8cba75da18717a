//! What MCP server backends report to: their tools (registered under `SERVER__TOOL`, or
//! unprefixed), their states, their abandoned calls, and answers that came too late.

use std::sync::{Arc, Weak};
use std::time::Duration;

use toolwarden_protocol::{EventKind, ServerStateKind, ToolSpec};

use crate::backend::{AttemptMeta, Backend, BackendHost};
use crate::events::EventScope;
use crate::ids::PREFIX_SEPARATOR;
use crate::policy::ToolOrigin;

use super::inner::EngineInner;

/// A backend host over an engine that may be gone (then reports are dropped).
pub(super) struct Host {
    pub(super) engine: Weak<EngineInner>,
    pub(super) prefix: bool,
}

impl BackendHost for Host {
    fn server_declared(&self, server: &str, startup_timeout: Option<Duration>) {
        if let Some(engine) = self.engine.upgrade() {
            engine.servers.declare(server, startup_timeout, self.prefix);
        }
    }

    fn set_tools(&self, server: &str, backend: Arc<dyn Backend>, tools: Vec<ToolSpec>) {
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        let origin = ToolOrigin::Server(server.to_owned());
        let entries = tools
            .into_iter()
            .map(|spec| {
                let name = if self.prefix {
                    format!("{server}{PREFIX_SEPARATOR}{}", spec.name)
                } else {
                    spec.name.clone()
                };
                engine
                    .registry
                    .entry(name, spec, backend.clone(), origin.clone())
            })
            .collect::<Vec<_>>();
        // Each definition against its pin, before its calls can run.
        let env = &engine.turns.env;
        for entry in &entries {
            announce(
                env,
                &entry.name,
                server,
                env.pins.observe(
                    &entry.name,
                    server,
                    &entry.spec,
                    entry.policy.on_tool_change,
                ),
                entry.policy.on_tool_change,
            );
        }
        engine.registry.replace(&origin, entries);
    }

    fn server_state(&self, server: &str, state: ServerStateKind, detail: Option<String>) {
        if let Some(engine) = self.engine.upgrade() {
            engine.servers.report(server, state, detail);
        }
    }

    fn server_protocol(&self, server: &str, protocol: &str) {
        if let Some(engine) = self.engine.upgrade() {
            engine.servers.reached_in(server, protocol);
        }
    }

    fn set_abandoned(&self, server: &str, count: u64) {
        if let Some(engine) = self.engine.upgrade() {
            engine.turns.metrics.set_abandoned(server, count);
        }
    }

    fn late_result(&self, meta: &AttemptMeta, tool: &str, is_error: bool, after: Duration) {
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        let scope = Arc::new(EventScope {
            principal: Some(meta.principal.clone()),
            session_id: Some(meta.session_id.clone()),
            turn_id: Some(meta.turn_id.clone()),
            call_id: Some(meta.call_id.clone()),
            tool: Some(tool.into()),
        });
        engine.turns.env.bus.emit(
            &scope,
            EventKind::ToolLateResult {
                is_error,
                after_ms: after.as_millis() as u64,
            },
        );
    }
}

/// Records what a server's listing of `tool` said about its pin: `tool_accepted` for a tool
/// first seen (its pin), `tool_changed` for a changed definition (and `tool_accepted` when
/// `on_tool_change = "accept"` pinned it at once).
fn announce(
    env: &crate::call::CallEnv,
    tool: &str,
    server: &str,
    seen: crate::pins::Listed,
    action: toolwarden_protocol::OnToolChange,
) {
    use crate::pins::Listed;
    let scope = Arc::new(EventScope {
        tool: Some(Arc::from(tool)),
        ..EventScope::default()
    });
    let accepted = |definition: crate::pins::Definition| EventKind::ToolAccepted {
        server: server.to_owned(),
        digest: definition.digest,
        definition: definition.value,
        by: None,
    };
    match seen {
        Listed::Same => {}
        // Recorded, unless the pins could not be read back (it may be a changed definition).
        Listed::First(definition) if env.pins.records_first() => {
            env.bus.emit(&scope, accepted(definition));
        }
        Listed::First(_) => {}
        Listed::Changed {
            old_digest,
            new,
            diff,
        } => {
            tracing::warn!(
                tool,
                server,
                action = action.as_str(),
                "a server changed a pinned tool's definition"
            );
            env.bus.emit(
                &scope,
                EventKind::ToolChanged {
                    server: server.to_owned(),
                    old_digest,
                    new_digest: new.digest.clone(),
                    diff,
                    action,
                },
            );
            if action == toolwarden_protocol::OnToolChange::Accept {
                env.bus.emit(&scope, accepted(new));
            }
        }
    }
}
