//! Where a tool's effective policy comes from.
//!
//! The engine asks a [`PolicySource`] for the policy of every tool it registers. The config file
//! ([`crate::Config`]) is the source: built-in defaults → `[defaults]` → the server's (or
//! `[exec]`'s, or an in-process tool's in-code) layer → `[tools."NAME"]` → annotations; a bare
//! library engine uses [`crate::Config::builtin`].

use toolwarden_protocol::{Policy, PolicyConfig, ToolAnnotations};

use std::sync::Arc;

use crate::config::Config;
use crate::rules::Rules;

/// Where a tool comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolOrigin {
    /// An MCP server of the config.
    Server(String),
    /// The built-in `exec` tool.
    Exec,
    /// An in-process tool, with the policy its code set (applied like a server's layer: above
    /// `[defaults]`, below `[tools."NAME"]`).
    InProcess(Box<PolicyConfig>),
}

impl ToolOrigin {
    /// The backend's name for this origin (server name, `exec`, `inprocess`).
    pub fn backend_name(&self) -> &str {
        match self {
            ToolOrigin::Server(s) => s,
            ToolOrigin::Exec => "exec",
            ToolOrigin::InProcess(_) => crate::inproc::INPROCESS,
        }
    }
}

/// Resolves the effective policy of a tool.
pub trait PolicySource: Send + Sync + 'static {
    /// The policy of a tool, before any per-call hint. `exposed` is the name agents call it by
    /// (`SERVER__TOOL`, `exec`, an in-process name); `own` is its backend's name for it.
    fn policy(
        &self,
        exposed: &str,
        own: &str,
        origin: &ToolOrigin,
        annotations: &ToolAnnotations,
    ) -> Policy;

    /// The `[[rules]]` that decide, per call, whether it may run (none by default: a source
    /// that wraps a [`Config`] must pass its rules on, or they do not apply).
    fn rules(&self) -> Option<Arc<Rules>> {
        None
    }

    /// The `[hooks.NAME]` asked about each matching call (none by default).
    fn hooks(&self) -> Option<Arc<crate::hooks::HookSet>> {
        None
    }

    /// The `[[quotas]]` each matching call takes from (none by default).
    fn quotas(&self) -> Option<Arc<crate::quotas::Quotas>> {
        None
    }
}

impl PolicySource for Config {
    fn policy(
        &self,
        exposed: &str,
        own: &str,
        origin: &ToolOrigin,
        annotations: &ToolAnnotations,
    ) -> Policy {
        match origin {
            ToolOrigin::Server(server) => self.policy_for(own, Some(server), annotations),
            ToolOrigin::Exec => self.policy_for(crate::config::EXEC_TOOL, None, annotations),
            ToolOrigin::InProcess(layer) => self.policy_for_in_process(exposed, layer, annotations),
        }
    }

    fn rules(&self) -> Option<Arc<Rules>> {
        self.rules.clone()
    }

    fn hooks(&self) -> Option<Arc<crate::hooks::HookSet>> {
        self.hooks.clone()
    }

    fn quotas(&self) -> Option<Arc<crate::quotas::Quotas>> {
        self.quotas.clone()
    }
}
