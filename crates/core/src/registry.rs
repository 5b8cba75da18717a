//! The registry of tools: what each exposed name runs on, under which policy. Registering a
//! tool resolves its policy (from the engine's policy source) and compiles its input schema once;
//! its breaker and metric handles outlive re-registration.

use crate::maps::FastMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, RwLock};
use toolwarden_protocol::{Concurrency, Policy, ToolSpec};

use crate::backend::Backend;
use crate::breaker::CircuitBreaker;
use crate::metrics::{Metrics, ToolMetrics};
use crate::policy::{PolicySource, ToolOrigin};
use crate::suggest;

/// What outlives a tool's re-registration (a server's `tools/list_changed`): its breaker and
/// metric handles.
pub(crate) struct ToolRuntime {
    pub(crate) breaker: CircuitBreaker,
    pub(crate) metrics: ToolMetrics,
}

/// One exposed tool.
pub(crate) struct ToolEntry {
    pub(crate) name: Arc<str>,
    pub(crate) spec: ToolSpec,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) backend_tool: Arc<str>,
    pub(crate) origin: ToolOrigin,
    pub(crate) policy: Policy,
    pub(crate) validator: Option<jsonschema::Validator>,
    pub(crate) runtime: Arc<ToolRuntime>,
}

pub(crate) struct Registry {
    tools: RwLock<FastMap<Arc<str>, Arc<ToolEntry>>>,
    runtimes: Mutex<FastMap<Arc<str>, Arc<ToolRuntime>>>,
    /// Bumped on every change of the tool set, so front doors can tell their clients.
    generation: tokio::sync::watch::Sender<u64>,
    /// Where tools' policies come from.
    policies: RwLock<Arc<dyn PolicySource>>,
    metrics: Arc<Metrics>,
    /// Whether any registered tool is exclusive (docs/SCALE-OUT.md: only then do calls take a
    /// place in their session's gate across replicas).
    exclusive: Arc<AtomicBool>,
    /// The policy source's `[[rules]]`, `[hooks]` and `[[quotas]]`, as calls read them (replaced
    /// with the source).
    guards: GuardsCell,
}

/// What decides, call by call, whether a call may run besides its tool's policy.
#[derive(Clone, Default)]
pub(crate) struct Guards {
    pub(crate) rules: Option<Arc<crate::rules::Rules>>,
    pub(crate) hooks: Option<Arc<crate::hooks::HookSet>>,
    pub(crate) quotas: Option<Arc<crate::quotas::Quotas>>,
}

impl Guards {
    fn of(policies: &dyn PolicySource) -> Guards {
        Guards {
            rules: policies.rules(),
            hooks: policies.hooks(),
            quotas: policies.quotas(),
        }
    }
}

/// Where calls find the guards in force.
pub(crate) type GuardsCell = Arc<RwLock<Guards>>;

impl Registry {
    pub(crate) fn new(policies: Arc<dyn PolicySource>, metrics: Arc<Metrics>) -> Self {
        Self {
            tools: RwLock::default(),
            runtimes: Mutex::default(),
            generation: tokio::sync::watch::Sender::new(0),
            guards: Arc::new(RwLock::new(Guards::of(&*policies))),
            policies: RwLock::new(policies),
            metrics,
            exclusive: Arc::default(),
        }
    }

    /// The guards in force, kept up to date.
    pub(crate) fn guards_cell(&self) -> GuardsCell {
        self.guards.clone()
    }

    /// The flag that says whether any registered tool is exclusive, kept up to date.
    pub(crate) fn exclusive_tools(&self) -> Arc<AtomicBool> {
        self.exclusive.clone()
    }

    fn runtime(&self, name: &Arc<str>) -> Arc<ToolRuntime> {
        self.runtimes
            .lock()
            .entry(name.clone())
            .or_insert_with(|| {
                Arc::new(ToolRuntime {
                    breaker: CircuitBreaker::default(),
                    metrics: self.metrics.tool(name),
                })
            })
            .clone()
    }

    /// The breaker and metric handles of tool `name`, made now if it has none yet (another
    /// replica's breaker may open before this replica's server lists the tool).
    pub(crate) fn runtime_of(&self, name: &str) -> Arc<ToolRuntime> {
        self.runtime(&Arc::from(name))
    }

    /// Builds the entry of tool `name`: resolves its policy, compiles its input schema.
    pub(crate) fn entry(
        &self,
        name: String,
        spec: ToolSpec,
        backend: Arc<dyn Backend>,
        origin: ToolOrigin,
    ) -> ToolEntry {
        let policy = self
            .policies
            .read()
            .policy(&name, &spec.name, &origin, &spec.annotations);
        let validator = match jsonschema::validator_for(&spec.input_schema) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(tool = %name, error = %e, "input schema does not compile; inputs will not be validated");
                None
            }
        };
        let name: Arc<str> = name.into();
        let runtime = self.runtime(&name);
        let backend_tool: Arc<str> = spec.name.as_str().into();
        ToolEntry {
            name,
            spec,
            backend,
            backend_tool,
            origin,
            policy,
            validator,
            runtime,
        }
    }

    /// The policy of a tool its server has not listed yet: from the config alone.
    pub(crate) fn provisional_policy(
        &self,
        name: &str,
        backend_tool: &str,
        origin: &ToolOrigin,
    ) -> Policy {
        self.policies
            .read()
            .policy(name, backend_tool, origin, &Default::default())
    }

    /// Replaces where policies come from and re-resolves every registered tool.
    pub(crate) fn set_policies(&self, policies: Arc<dyn PolicySource>) {
        *self.guards.write() = Guards::of(&*policies);
        *self.policies.write() = policies;
        for e in self.list() {
            let entry = self.entry(
                e.name.to_string(),
                e.spec.clone(),
                e.backend.clone(),
                e.origin.clone(),
            );
            self.insert(entry);
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<Arc<ToolEntry>> {
        self.tools.read().get(name).cloned()
    }

    pub(crate) fn insert(&self, entry: ToolEntry) {
        self.tools
            .write()
            .insert(entry.name.clone(), Arc::new(entry));
        self.changed();
    }

    /// Replaces every tool of `origin` with `entries`.
    pub(crate) fn replace(&self, origin: &ToolOrigin, entries: Vec<ToolEntry>) {
        let mut tools = self.tools.write();
        tools.retain(|_, e| &e.origin != origin);
        for entry in entries {
            tools.insert(entry.name.clone(), Arc::new(entry));
        }
        drop(tools);
        self.changed();
    }

    /// Removes one tool; whether it existed.
    pub(crate) fn remove(&self, name: &str) -> bool {
        let removed = self.tools.write().remove(name).is_some();
        if removed {
            self.changed();
        }
        removed
    }

    /// A receiver that sees the generation bumped after every change of the tool set.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    fn changed(&self) {
        let any = self
            .tools
            .read()
            .values()
            .any(|e| e.policy.concurrency == Concurrency::Exclusive);
        self.exclusive.store(any, Ordering::Relaxed);
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Every tool, by name.
    pub(crate) fn list(&self) -> Vec<Arc<ToolEntry>> {
        let mut v: Vec<Arc<ToolEntry>> = self.tools.read().values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// A sentence naming the known tools closest to `name`, for an unknown-tool error.
    pub(crate) fn suggest(&self, name: &str) -> Option<String> {
        let tools = self.tools.read();
        if tools.is_empty() {
            return Some("No tools are available.".to_owned());
        }
        // Names are compared part by part — the server's (`SERVER__`) and the tool's own — so
        // that sharing a server is no closeness: `test__nope` is not near `test__wipe`. A name
        // given without its server is near the tools of any server that carry it.
        let wanted = name.to_lowercase();
        let (wanted_server, wanted_tool) = split_exposed(&wanted);
        let limit = suggest::limit(wanted_tool);
        let mut scored: Vec<(usize, &str)> = tools
            .keys()
            .filter_map(|k| {
                let candidate = k.to_lowercase();
                let (server, tool) = split_exposed(&candidate);
                let tool_d = suggest::edit_distance(wanted_tool, tool);
                let server_d = match (wanted_server, server) {
                    (Some(w), Some(s)) => suggest::edit_distance(w, s),
                    (Some(w), None) => w.chars().count(),
                    (None, _) => 0,
                };
                let ok = tool_d <= limit && server_d <= wanted_server.map_or(0, suggest::limit);
                ok.then_some((tool_d + server_d, &**k))
            })
            .collect();
        scored.sort();
        let close: Vec<&str> = scored.iter().take(3).map(|(_, n)| *n).collect();
        if close.is_empty() {
            let mut all: Vec<&str> = tools.keys().map(|k| &**k).collect();
            all.sort_unstable();
            let shown = all.len().min(10);
            let more = if all.len() > shown {
                format!(" and {} more", all.len() - shown)
            } else {
                String::new()
            };
            Some(format!(
                "Available tools: {}{more}.",
                all[..shown].join(", ")
            ))
        } else {
            Some(format!(
                "Did you mean {}?",
                close
                    .iter()
                    .map(|n| format!("\"{n}\""))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ))
        }
    }
}

/// An exposed name's server part (`SERVER__`, if any) and the tool's own name.
fn split_exposed(name: &str) -> (Option<&str>, &str) {
    match name.split_once("__") {
        Some((server, tool)) if !server.is_empty() => (Some(server), tool),
        _ => (None, name),
    }
}
