//! Where a turn, its calls and their attempts sit in a trace.
//!
//! The engine does not make spans: an exporter builds them from the events (the `trace` of
//! `turn_start`, then each call's events). What the engine does is give each turn its span id
//! when spans are exported, and tell each attempt's backend the trace context to pass on to the
//! server it calls. Both sides must agree on the ids of the call and attempt spans without the
//! engine sending them in every event, so they are derived: a call's span id from its turn's span
//! id and its call id, an attempt's from its call's span id and its number. The turn's span id is
//! random, so two turns never share a call's span id even when a client reuses call ids.

use std::hash::{BuildHasher, Hasher};

use toolwarden_protocol::{CallId, SpanId, TraceId, TraceParent, TurnTrace};

/// A turn's trace context, as its calls see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TurnContext {
    /// Spans are exported: the turn has its own span, its calls and attempts theirs.
    Spans(TurnTrace),
    /// Spans are not exported but the client gave a context: it is passed on unchanged.
    Forward(TraceParent),
}

impl TurnContext {
    /// The context of a new turn: with spans exported, a span under `client`'s (or under
    /// `parent`'s, a parent turn's, or a new trace); without, `client`'s passed on.
    pub(crate) fn new(
        export: bool,
        client: Option<TraceParent>,
        parent: Option<TurnContext>,
    ) -> Option<Self> {
        if !export {
            return client.map(TurnContext::Forward);
        }
        let (trace_id, parent_span_id, sampled) = match (client, parent) {
            (Some(c), _) => (c.trace_id, Some(c.parent_id), c.sampled()),
            (None, Some(TurnContext::Spans(p))) => (p.trace_id, Some(p.span_id), p.sampled),
            (None, _) => (new_trace_id(), None, true),
        };
        Some(TurnContext::Spans(TurnTrace {
            trace_id,
            span_id: new_span_id(),
            parent_span_id,
            sampled,
        }))
    }

    /// What `turn_start` says of it: only exported spans have ids worth telling.
    pub(crate) fn turn_trace(&self) -> Option<TurnTrace> {
        match self {
            TurnContext::Spans(t) => Some(*t),
            TurnContext::Forward(_) => None,
        }
    }

    /// The context attempt `n` of `call_id` passes on to its server.
    pub(crate) fn for_attempt(&self, call_id: &CallId, n: u32) -> TraceParent {
        match self {
            TurnContext::Spans(t) => TraceParent {
                trace_id: t.trace_id,
                parent_id: attempt_span(call_span(t.span_id, call_id), n),
                flags: u8::from(t.sampled),
            },
            TurnContext::Forward(client) => *client,
        }
    }
}

/// The span id of the call `call_id` of the turn whose span is `turn`.
pub fn call_span(turn: SpanId, call_id: &CallId) -> SpanId {
    derive(&turn.0, call_id.as_str().as_bytes())
}

/// The span id of attempt `n` (1 for the first) of the call whose span is `call`.
pub fn attempt_span(call: SpanId, n: u32) -> SpanId {
    derive(&call.0, &n.to_le_bytes())
}

/// A fixed-key hash of `parent` and `label`: the same in every part of a process, never zero.
fn derive(parent: &[u8; 8], label: &[u8]) -> SpanId {
    let mut h = foldhash::quality::FixedState::with_seed(0x746f_6f6c_7761_7264).build_hasher();
    h.write(parent);
    h.write_usize(label.len());
    h.write(label);
    nonzero(h.finish())
}

fn nonzero(n: u64) -> SpanId {
    SpanId(if n == 0 { 1 } else { n }.to_be_bytes())
}

fn new_span_id() -> SpanId {
    nonzero(rand::random::<u64>())
}

fn new_trace_id() -> TraceId {
    let n = rand::random::<u128>();
    TraceId(if n == 0 { 1 } else { n }.to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn client() -> TraceParent {
        TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").expect("ok")
    }

    #[test]
    fn without_export_the_clients_context_is_passed_on_unchanged() {
        assert_eq!(TurnContext::new(false, None, None), None);
        let ctx = TurnContext::new(false, Some(client()), None).expect("forwarded");
        assert_eq!(ctx.turn_trace(), None);
        assert_eq!(ctx.for_attempt(&CallId::from("c1"), 2), client());
    }

    #[test]
    fn with_export_a_turn_hangs_under_the_client_and_attempts_under_their_call() {
        let ctx = TurnContext::new(true, Some(client()), None).expect("spans");
        let t = ctx.turn_trace().expect("a turn trace");
        assert_eq!(t.trace_id, client().trace_id);
        assert_eq!(t.parent_span_id, Some(client().parent_id));
        let call = call_span(t.span_id, &CallId::from("c1"));
        let sent = ctx.for_attempt(&CallId::from("c1"), 2);
        assert_eq!(sent.trace_id, t.trace_id);
        assert_eq!(sent.parent_id, attempt_span(call, 2));
        assert!(sent.sampled());
        assert_ne!(attempt_span(call, 1), attempt_span(call, 2));
        assert_ne!(call, call_span(t.span_id, &CallId::from("c2")));
    }

    #[test]
    fn a_child_turn_without_a_context_hangs_under_its_parent_turn() {
        let parent = TurnContext::new(true, None, None);
        let p = parent.and_then(|p| p.turn_trace()).expect("a new trace");
        assert_eq!(p.parent_span_id, None);
        let child = TurnContext::new(true, None, parent)
            .and_then(|c| c.turn_trace())
            .expect("spans");
        assert_eq!(
            (child.trace_id, child.parent_span_id),
            (p.trace_id, Some(p.span_id))
        );
    }
}
