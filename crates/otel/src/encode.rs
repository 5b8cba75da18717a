//! Spans as OTLP protobuf, named and attributed by the OpenTelemetry GenAI and MCP semantic
//! conventions (docs/OBSERVABILITY.md lists every name and attribute).
//!
//! - a turn: `toolwarden.turn`, internal;
//! - a call: `execute_tool {gen_ai.tool.name}`, internal (the GenAI tool execution span);
//! - an attempt of an MCP server's tool: `tools/call {gen_ai.tool.name}`, client (the MCP client
//!   span; the tool's name is the server's own); of any other tool: `attempt {tool}`, internal.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status, span, status,
};
use toolwarden_core::ToolBacking;
use toolwarden_protocol::{CallResult, ProvenanceSource, Status as CallStatus};

use crate::assemble::{AttemptSpanEnd, SpanRecord, What};

/// Finds where a tool runs (the engine's registry), to name an attempt's span.
pub type Resolver = std::sync::Arc<dyn Fn(&str) -> Option<ToolBacking> + Send + Sync>;

/// `Span.flags`: the W3C flags in bits 0–7, then "whether the parent is remote is known"
/// (bit 8) and "the parent is remote" (bit 9).
const PARENT_REMOTE_KNOWN: u32 = 0x100;
const PARENT_REMOTE: u32 = 0x200;

/// One export request of `spans`.
pub(crate) fn request(spans: &[SpanRecord], resolve: &Resolver) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", "toolwarden"),
                    kv("service.version", env!("CARGO_PKG_VERSION")),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "toolwarden".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                spans: spans.iter().map(|s| span(s, resolve)).collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

fn span(s: &SpanRecord, resolve: &Resolver) -> Span {
    let mut attributes = Vec::with_capacity(11);
    if let Some(principal) = &s.scope.principal {
        attributes.push(kv("enduser.id", principal));
    }
    if let Some(session) = &s.scope.session_id {
        attributes.push(kv("gen_ai.conversation.id", session.as_str()));
    }
    if let Some(turn) = &s.scope.turn_id {
        attributes.push(kv("toolwarden.turn.id", turn.as_str()));
    }
    let tool = s.scope.tool.as_deref().unwrap_or_default();
    let call_id = s
        .scope
        .call_id
        .as_ref()
        .map(|c| c.as_str())
        .unwrap_or_default();
    let (name, kind, error) = match &s.what {
        What::Turn {
            outcome,
            parent_turn,
            calls,
        } => {
            attributes.push(kv("toolwarden.turn.outcome", outcome.as_ref()));
            attributes.push(kv_int("toolwarden.turn.calls", *calls as i64));
            if let Some(parent) = parent_turn {
                attributes.push(kv("toolwarden.turn.parent_id", parent.as_str()));
            }
            let error = (outcome == "aborted").then(|| ("aborted".to_owned(), String::new()));
            (
                "toolwarden.turn".to_owned(),
                span::SpanKind::Internal,
                error,
            )
        }
        What::Call { result } => {
            attributes.push(kv("gen_ai.operation.name", "execute_tool"));
            attributes.push(kv("gen_ai.tool.name", tool));
            attributes.push(kv("gen_ai.tool.call.id", call_id));
            if let Some(description) = resolve(tool).and_then(|b| b.description) {
                attributes.push(kv("gen_ai.tool.description", &description));
            }
            attributes.push(kv("toolwarden.status", result.outcome.status.name()));
            attributes.push(kv_int(
                "toolwarden.attempts",
                i64::from(result.outcome.attempts),
            ));
            if result
                .outcome
                .provenance
                .as_ref()
                .is_some_and(|p| p.source == ProvenanceSource::Cache)
            {
                attributes.push(kv_bool("toolwarden.cache_hit", true));
            }
            let error = call_error(result);
            if let Some((ty, _)) = &error {
                attributes.push(kv("error.type", ty));
            }
            (
                format!("execute_tool {tool}"),
                span::SpanKind::Internal,
                error,
            )
        }
        What::Attempt { n, end } => {
            attributes.push(kv_int("toolwarden.attempt", i64::from(*n)));
            attributes.push(kv("gen_ai.tool.call.id", call_id));
            let error = match end {
                AttemptSpanEnd::Retried(cause) => Some((cause_type(cause), cause.clone())),
                AttemptSpanEnd::Last(result) => call_error(result),
            };
            if let Some((ty, _)) = &error {
                attributes.push(kv("error.type", ty));
            }
            match resolve(tool) {
                Some(ToolBacking {
                    server: Some(server),
                    tool: own,
                    ..
                }) => {
                    attributes.push(kv("gen_ai.operation.name", "execute_tool"));
                    attributes.push(kv("mcp.method.name", "tools/call"));
                    attributes.push(kv("gen_ai.tool.name", &own));
                    attributes.push(kv("toolwarden.server", &server));
                    (format!("tools/call {own}"), span::SpanKind::Client, error)
                }
                backing => {
                    attributes.push(kv("gen_ai.tool.name", tool));
                    if let Some(b) = backing {
                        attributes.push(kv("toolwarden.backend", &b.backend));
                    }
                    (format!("attempt {tool}"), span::SpanKind::Internal, error)
                }
            }
        }
    };
    let parent_remote = matches!(s.what, What::Turn { .. }) && s.parent.is_some();
    Span {
        trace_id: s.trace_id.0.to_vec(),
        span_id: s.span_id.0.to_vec(),
        parent_span_id: s.parent.map(|p| p.0.to_vec()).unwrap_or_default(),
        flags: 0x01 | PARENT_REMOTE_KNOWN | if parent_remote { PARENT_REMOTE } else { 0 },
        name,
        kind: kind as i32,
        start_time_unix_nano: nanos(s.start),
        end_time_unix_nano: nanos(s.end),
        attributes,
        status: Some(match error {
            Some((_, message)) => Status {
                message,
                code: status::StatusCode::Error as i32,
            },
            None => Status::default(),
        }),
        ..Default::default()
    }
}

/// A call that did not end `ok`: its `error.type` (the error's reason, or the status) and a
/// message.
fn call_error(result: &CallResult) -> Option<(String, String)> {
    let status = &result.outcome.status;
    let ty = match status {
        CallStatus::Ok => return None,
        CallStatus::Error { reason } => reason.as_str(),
        other => other.name(),
    };
    let message = result
        .outcome
        .detail
        .clone()
        .unwrap_or_else(|| status.name().to_owned());
    Some((ty.to_owned(), message))
}

/// The kind of a retried attempt's failure (`transport`, `crashed`, `timeout`, `tool_error`),
/// from the cause `tool_retry` gives (`transport: broken pipe`, `attempt timeout after 2s`).
fn cause_type(cause: &str) -> String {
    if cause.contains(" timeout after ") {
        return "timeout".to_owned();
    }
    cause.split(':').next().unwrap_or(cause).trim().to_owned()
}

fn nanos(t: toolwarden_protocol::Timestamp) -> u64 {
    u64::try_from(t.unix_millis()).unwrap_or(0) * 1_000_000
}

fn kv(key: &str, value: &str) -> KeyValue {
    attr(key, any_value::Value::StringValue(value.to_owned()))
}

fn kv_int(key: &str, value: i64) -> KeyValue {
    attr(key, any_value::Value::IntValue(value))
}

fn kv_bool(key: &str, value: bool) -> KeyValue {
    attr(key, any_value::Value::BoolValue(value))
}

fn attr(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn a_retried_attempts_error_type_is_the_kind_of_its_failure() {
        for (cause, ty) in [
            ("transport: broken pipe", "transport"),
            ("crashed: exit status 1", "crashed"),
            ("attempt timeout after 2s", "timeout"),
            ("tool_error", "tool_error"),
        ] {
            assert_eq!(cause_type(cause), ty, "{cause}");
        }
    }
}
