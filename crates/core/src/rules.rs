//! `[[rules]]`: what may run, by tool, principal and arguments (docs/RULES.md).
//!
//! A rule matches a call when one of its `tools` globs matches the tool's name, one of its
//! `principals` globs (when it has any) the caller's, and its `when` — a CEL expression over the
//! call, compiled when the config loads — is true. Every matching rule applies and the **most
//! restrictive** decision wins (`deny` > `confirm` > `ask` > `allow`), so the order of the rules
//! never matters. No rule matches: the tool's `approval` key decides, as it always did.
//!
//! Two choices made for safety, where CEL or the spec leave room:
//! - A `when` that fails to evaluate (a key the input lacks, a type mismatch) makes a restrictive
//!   rule (`ask`, `confirm`, `deny`) apply and an `allow` rule not apply: an error never opens a
//!   door. Write `has(args.path) && …` for a key that may be absent.
//! - For the `exec` tool, `args.commands` and `args.opaque` describe the shell line
//!   ([`crate::shell`]); an `allow` rule whose `when` does not mention `opaque` does not apply to
//!   a line the parser could not judge (`opaque`), however the rest of the expression reads.

use std::sync::Arc;

use serde_json::{Map, Value};
use toolwarden_protocol::{Approval, Principal, RuleConfig, RuleDecision, ToolAnnotations};

use toolwarden_protocol::EXEC_TOOL;

/// The variables a `when` may read.
pub const VARIABLES: [&str; 7] = [
    "tool",
    "args",
    "principal",
    "scopes",
    "session_id",
    "annotations",
    "server",
];

/// A rule that cannot be compiled: which, which key, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    /// Its index in `[[rules]]` (from 0).
    pub index: usize,
    /// The key at fault (`tools`, `when`, `decision`, …).
    pub key: &'static str,
    /// What is wrong, in words.
    pub message: String,
}

struct Rule {
    index: usize,
    tools: Vec<String>,
    principals: Option<Vec<String>>,
    when: Option<cel::Program>,
    /// Which variables its `when` reads (only those are made for a call).
    reads: Needs,
    mentions_opaque: bool,
    decision: RuleDecision,
    reason: Option<String>,
}

/// Which of the call's variables some expression reads.
#[derive(Clone, Copy, Default)]
struct Needs {
    bits: u8,
}

impl Needs {
    fn add(&mut self, name: &str) {
        if let Some(i) = VARIABLES.iter().position(|v| *v == name) {
            self.bits |= 1 << i;
        }
    }

    fn has(self, name: &str) -> bool {
        VARIABLES
            .iter()
            .position(|v| *v == name)
            .is_some_and(|i| self.bits & (1 << i) != 0)
    }
}

/// The compiled `[[rules]]`.
pub struct Rules {
    rules: Vec<Rule>,
    env: Arc<cel::Env>,
    /// For each tool name seen, the rules whose `tools` globs match it (globs are matched once
    /// per name, not once per call).
    by_tool: parking_lot::RwLock<crate::maps::FastMap<Box<str>, Arc<[usize]>>>,
}

/// How many tool names [`Rules::candidates`] remembers before it starts over.
const REMEMBERED_TOOLS: usize = 4096;

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rules")
            .field("rules", &self.rules.len())
            .finish_non_exhaustive()
    }
}

/// What a rule that matched said.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Matched {
    /// Its index in `[[rules]]` (from 0).
    pub index: usize,
    /// Its decision.
    pub decision: RuleDecision,
    /// Its reason, if it gives one; for a `when` that failed to evaluate, why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The rules' verdict on a call: the most restrictive decision of those that matched, and all of
/// them, in file order.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Verdict {
    /// What happens to the call.
    pub decision: RuleDecision,
    /// Every rule that matched.
    pub rules: Vec<Matched>,
}

impl Verdict {
    /// The reason of the first deciding rule that gives one.
    pub fn reason(&self) -> Option<&str> {
        self.rules
            .iter()
            .filter(|m| m.decision == self.decision)
            .find_map(|m| m.reason.as_deref())
    }

    /// The deciding rules' indexes, for messages: `rules[2]`, `rules[2], rules[5]`.
    pub fn deciding(&self) -> String {
        self.rules
            .iter()
            .filter(|m| m.decision == self.decision)
            .map(|m| format!("rules[{}]", m.index))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What the rules see of a call.
pub struct Facts<'a> {
    /// The tool's name as agents call it.
    pub tool: &'a str,
    /// The call's input.
    pub args: &'a Value,
    /// Who calls.
    pub principal: &'a Principal,
    /// The call's session, if it has one.
    pub session_id: Option<&'a str>,
    /// The tool's annotations.
    pub annotations: Option<&'a ToolAnnotations>,
    /// The MCP server that offers the tool (`None` for exec and in-process tools).
    pub server: Option<&'a str>,
}

impl Rules {
    /// Compiles `[[rules]]`; `None` when there are none. The first bad rule is the error.
    pub fn compile(configs: &[RuleConfig]) -> Result<Option<Rules>, RuleError> {
        if configs.is_empty() {
            return Ok(None);
        }
        let env = Arc::new(cel::Env::stdlib());
        let mut rules = Vec::with_capacity(configs.len());
        for (index, c) in configs.iter().enumerate() {
            let fail = |key, message: String| RuleError {
                index,
                key,
                message,
            };
            if c.tools.is_empty() {
                return Err(fail(
                    "tools",
                    "a rule needs tools = [\"GLOB\", …]: the tools it is about (\"*\" for every tool)"
                        .to_owned(),
                ));
            }
            if let Some(bad) = c.tools.iter().find(|t| t.trim().is_empty()) {
                return Err(fail(
                    "tools",
                    format!("{bad:?}: a tool glob must not be empty"),
                ));
            }
            if let Some(principals) = &c.principals {
                if principals.is_empty() {
                    return Err(fail(
                        "principals",
                        "an empty list matches nobody: leave principals out to match every principal"
                            .to_owned(),
                    ));
                }
                if let Some(bad) = principals.iter().find(|p| p.trim().is_empty()) {
                    return Err(fail(
                        "principals",
                        format!("{bad:?}: a principal glob must not be empty"),
                    ));
                }
            }
            let Some(decision) = c.decision else {
                return Err(fail(
                    "decision",
                    "a rule needs decision = \"allow\", \"ask\", \"confirm\" or \"deny\""
                        .to_owned(),
                ));
            };
            let mut reads = Needs::default();
            let when = match &c.when {
                None => None,
                Some(src) => {
                    let program = env.compile(src).map_err(|e| {
                        fail(
                            "when",
                            format!(
                                "the expression does not compile: {}",
                                e.to_string().replace('\n', " ")
                            ),
                        )
                    })?;
                    let refs = program.references();
                    let bound = bound_names(src);
                    for name in refs.variables() {
                        if bound.contains(&name) {
                            continue;
                        }
                        if !VARIABLES.contains(&name) {
                            return Err(fail(
                                "when",
                                format!(
                                    "unknown variable {name:?}: an expression reads {}",
                                    VARIABLES.join(", ")
                                ),
                            ));
                        }
                        reads.add(name);
                    }
                    Some(program)
                }
            };
            rules.push(Rule {
                index,
                tools: c.tools.clone(),
                principals: c.principals.clone(),
                mentions_opaque: c
                    .when
                    .as_deref()
                    .is_some_and(|w| without_strings(w).contains("args.opaque")),
                when,
                reads,
                decision,
                reason: c.reason.clone().filter(|r| !r.trim().is_empty()),
            });
        }
        Ok(Some(Rules {
            rules,
            env,
            by_tool: Default::default(),
        }))
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether there are none (never: [`Rules::compile`] gives `None` then).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The verdict on a call: `None` when no rule matches (the tool's `approval` decides).
    pub fn decide(&self, facts: &Facts<'_>) -> Option<Verdict> {
        let by_tool = self.candidates(facts.tool);
        if by_tool.is_empty() {
            return None;
        }
        let candidates: Vec<&Rule> = by_tool
            .iter()
            .map(|&i| &self.rules[i])
            .filter(|r| r.names_principal(&facts.principal.name))
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let mut vars = Vars::default();
        // One context for every expression of the call, with the variables any of them reads.
        let reads = candidates.iter().fold(Needs::default(), |acc, r| Needs {
            bits: acc.bits | r.reads.bits,
        });
        let mut ctx: Option<Result<cel::Context<'static, 'static>, String>> = None;
        let mut matched = Vec::new();
        for rule in candidates {
            let applies = match &rule.when {
                None => Some(None),
                Some(program) => {
                    let opaque_line = facts.tool == EXEC_TOOL && vars.opaque(facts);
                    if rule.decision == RuleDecision::Allow && opaque_line && !rule.mentions_opaque
                    {
                        None
                    } else {
                        let ctx = ctx.get_or_insert_with(|| vars.context(&self.env, reads, facts));
                        let result = match ctx {
                            Ok(ctx) => run(program, ctx),
                            Err(e) => Err(e.clone()),
                        };
                        match result {
                            Ok(true) => Some(None),
                            Ok(false) => None,
                            // An error never opens a door: restrictive rules apply.
                            Err(e) if rule.decision != RuleDecision::Allow => Some(Some(format!(
                                "its condition could not be evaluated ({e}), so it applies"
                            ))),
                            Err(_) => None,
                        }
                    }
                }
            };
            if let Some(failed) = applies {
                matched.push(Matched {
                    index: rule.index,
                    decision: rule.decision,
                    reason: match (&rule.reason, failed) {
                        (Some(r), Some(f)) => Some(format!("{r}; {f}")),
                        (r, f) => r.clone().or(f),
                    },
                });
            }
        }
        let decision = matched.iter().map(|m| m.decision).max()?;
        Some(Verdict {
            decision,
            rules: matched,
        })
    }

    /// The rules whose `tools` globs match `tool`, in file order.
    fn candidates(&self, tool: &str) -> Arc<[usize]> {
        if let Some(found) = self.by_tool.read().get(tool) {
            return found.clone();
        }
        let found: Arc<[usize]> = self
            .rules
            .iter()
            .filter(|r| r.tools.iter().any(|g| glob(g, tool)))
            .map(|r| r.index)
            .collect();
        let mut by_tool = self.by_tool.write();
        if by_tool.len() >= REMEMBERED_TOOLS {
            by_tool.clear();
        }
        by_tool.insert(tool.into(), found.clone());
        found
    }

    /// Whether `tool` is denied to `principal` by a rule without a condition: such a tool is left
    /// out of that principal's tool lists (called by name anyway, the rule denies it).
    pub fn hides(&self, tool: &str, principal: &str) -> bool {
        self.candidates(tool).iter().any(|&i| {
            let r = &self.rules[i];
            r.decision == RuleDecision::Deny && r.when.is_none() && r.names_principal(principal)
        })
    }
}

impl Rule {
    /// Whether its principal globs match (its tools being matched already).
    fn names_principal(&self, principal: &str) -> bool {
        self.principals
            .as_ref()
            .is_none_or(|ps| ps.iter().any(|g| glob(g, principal)))
    }
}

/// Runs a `when` against a call's context: its truth, or why it has none.
fn run(program: &cel::Program, ctx: &cel::Context<'static, 'static>) -> Result<bool, String> {
    match program.execute(ctx) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        Ok(other) => Err(format!("it gave {other:?}, not true or false")),
        Err(e) => Err(e.to_string()),
    }
}

/// The call's variables, made once per call when a first expression needs them.
#[derive(Default)]
struct Vars {
    /// `args`, with `commands` and `opaque` for exec.
    args: Option<Value>,
    line: Option<crate::shell::ShellLine>,
}

impl Vars {
    fn line(&mut self, facts: &Facts<'_>) -> &crate::shell::ShellLine {
        self.line.get_or_insert_with(|| {
            let command = facts
                .args
                .get("command")
                .and_then(Value::as_str)
                .unwrap_or("");
            let mut line = crate::shell::analyze(command);
            // Variables the call sets change what runs as `X=1 cmd` would (PATH, LD_PRELOAD,
            // GIT_EXTERNAL_DIFF, ...): such a line is not judged by its commands alone.
            if facts
                .args
                .get("env")
                .and_then(Value::as_object)
                .is_some_and(|env| !env.is_empty())
                && !line.opaque
            {
                line.opaque = true;
                line.why_opaque = Some("the call sets environment variables (`env`)".to_owned());
            }
            line
        })
    }

    fn opaque(&mut self, facts: &Facts<'_>) -> bool {
        self.line(facts).opaque
    }

    fn args(&mut self, facts: &Facts<'_>) -> Value {
        if self.args.is_none() {
            let args = if facts.tool == EXEC_TOOL {
                let line = self.line(facts).clone();
                let mut map = match facts.args {
                    Value::Object(m) => m.clone(),
                    _ => Map::new(),
                };
                map.insert(
                    "commands".to_owned(),
                    serde_json::to_value(&line.commands).unwrap_or_default(),
                );
                map.insert("opaque".to_owned(), Value::Bool(line.opaque));
                Value::Object(map)
            } else {
                facts.args.clone()
            };
            self.args = Some(args);
        }
        self.args.clone().unwrap_or_default()
    }

    /// The CEL context of a call with the variables in `reads`.
    fn context(
        &mut self,
        env: &Arc<cel::Env>,
        reads: Needs,
        facts: &Facts<'_>,
    ) -> Result<cel::Context<'static, 'static>, String> {
        let mut ctx = cel::Context::with_env(env.clone());
        let put = |ctx: &mut cel::Context<'_, '_>, name: &str, value: &dyn erased::Ser| {
            value
                .to_cel()
                .map(|v| ctx.add_variable_from_value(name.to_owned(), v))
                .map_err(|e| format!("{name}: {e}"))
        };
        if reads.has("tool") {
            put(&mut ctx, "tool", &facts.tool)?;
        }
        if reads.has("args") {
            let args = self.args(facts);
            put(&mut ctx, "args", &args)?;
        }
        if reads.has("principal") {
            put(&mut ctx, "principal", &&*facts.principal.name)?;
        }
        if reads.has("scopes") {
            // `admin` holds every scope: a rule asking for one finds it.
            let granted = if facts
                .principal
                .scopes
                .iter()
                .any(|s| s == toolwarden_protocol::Scope::Admin)
            {
                toolwarden_protocol::Scopes::all()
            } else {
                facts.principal.scopes
            };
            let scopes: Vec<&str> = granted.iter().map(|s| s.as_str()).collect();
            put(&mut ctx, "scopes", &scopes)?;
        }
        if reads.has("session_id") {
            put(&mut ctx, "session_id", &facts.session_id)?;
        }
        if reads.has("annotations") {
            let annotations = facts
                .annotations
                .map(serde_json::to_value)
                .transpose()
                .map_err(|e| e.to_string())?
                .unwrap_or_else(|| Value::Object(Map::new()));
            put(&mut ctx, "annotations", &annotations)?;
        }
        if reads.has("server") {
            put(&mut ctx, "server", &facts.server)?;
        }
        Ok(ctx)
    }
}

/// A value made into CEL's.
mod erased {
    pub(super) trait Ser {
        fn to_cel(&self) -> Result<cel::Value, String>;
    }

    impl<T: serde::Serialize> Ser for T {
        fn to_cel(&self) -> Result<cel::Value, String> {
            cel::to_value(self).map_err(|e| e.to_string())
        }
    }
}

/// `check --explain` and `GET /v1/tools/{name}/explain`: every rule that matched a call, and the
/// decision — the rules', or the tool's `approval` when none matched (`fallback`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Explanation {
    /// `allow`, `ask`, `confirm` or `deny`.
    pub decision: &'static str,
    /// The rules that matched, in file order.
    pub rules: Vec<Matched>,
    /// Whether no rule matched, so the tool's `approval` decided.
    pub fallback: bool,
    /// For `exec`: the line as the rules see it (`args.commands`, `args.opaque`, and why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<LineView>,
}

/// An `exec` line as the rules see it, for explain.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LineView {
    /// Every simple command of the line.
    pub commands: Vec<crate::shell::SimpleCommand>,
    /// Whether the line could not be judged command by command.
    pub opaque: bool,
    /// Why, when it is opaque.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_opaque: Option<String>,
}

/// Explains the decision on a call: `rules` (if any) on `facts`, else `approval`.
pub fn explain(rules: Option<&Rules>, facts: &Facts<'_>, approval: Approval) -> Explanation {
    let line = (facts.tool == EXEC_TOOL).then(|| {
        let line = Vars::default().line(facts).clone();
        LineView {
            commands: line.commands,
            opaque: line.opaque,
            why_opaque: line.why_opaque,
        }
    });
    match rules.and_then(|r| r.decide(facts)) {
        Some(v) => Explanation {
            decision: v.decision.as_str(),
            rules: v.rules,
            fallback: false,
            line,
        },
        None => Explanation {
            decision: match approval {
                Approval::Auto => "allow",
                Approval::Ask => "ask",
                Approval::Confirm => "confirm",
                Approval::Deny => "deny",
            },
            rules: Vec::new(),
            fallback: true,
            line,
        },
    }
}

/// `src` with its string literals emptied and its `//` comments removed, so that a word inside
/// one is not read as code.
fn without_strings(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut comment = false;
    let mut chars = src.chars().peekable();
    while let Some(ch) = chars.next() {
        if comment {
            if ch == '\n' {
                comment = false;
                out.push(ch);
            }
            continue;
        }
        if quote.is_none() && ch == '/' && chars.peek() == Some(&'/') {
            comment = true;
            continue;
        }
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if ch == '\\' {
                    escaped = true;
                } else if ch == q {
                    quote = None;
                    out.push(ch);
                }
            }
            None => {
                if ch == '"' || ch == '\'' {
                    quote = Some(ch);
                }
                out.push(ch);
            }
        }
    }
    out
}

/// The names the macros of `src` bind (`c` in `args.commands.all(c, …)`): CEL reports them among
/// the variables an expression reads.
fn bound_names(src: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for mac in [
        ".all(",
        ".exists(",
        ".exists_one(",
        ".existsOne(",
        ".map(",
        ".filter(",
        ".optMap(",
        ".optFlatMap(",
    ] {
        let mut rest = src;
        while let Some(at) = rest.find(mac) {
            rest = &rest[at + mac.len()..];
            if let Some((name, _)) = rest.split_once(',') {
                let name = name.trim();
                if !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_') {
                    out.push(name);
                }
            }
        }
    }
    out
}

/// Whether `text` matches `pattern`, where `*` is any run of characters and `?` one character.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests;
