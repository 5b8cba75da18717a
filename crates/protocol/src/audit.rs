//! The audit trail as front doors read it (docs/AUDIT.md): filters, pages of events, pages of calls,
//! and a turn's record. `GET /v1/audit`, `GET /v1/audit/calls`, `GET /v1/turns/{id}` and
//! `toolwarden audit` all speak these types.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::ids::{CallId, SessionId, TurnId};
use crate::time::Timestamp;

/// The default number of items on a page.
pub const AUDIT_DEFAULT_LIMIT: u32 = 100;
/// The largest page.
pub const AUDIT_MAX_LIMIT: u32 = 1000;

/// What to read from the trail. Every filter that is set must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// Events (and calls) of turns this principal made.
    pub principal: Option<String>,
    /// With `principal`: the events about no turn too (server states, breakers), which every
    /// principal's live stream shows (how `/v1/events` resumes from the trail).
    pub with_unattributed: bool,
    /// Events of turns of this session.
    pub session: Option<SessionId>,
    /// Events of this turn.
    pub turn: Option<TurnId>,
    /// Events of calls with this id (call ids are unique within a turn only).
    pub call: Option<CallId>,
    /// Events of calls of this tool.
    pub tool: Option<String>,
    /// Events of calls whose outcome has this status name (`ok`, `timeout`, `interrupted`, ...).
    pub status: Option<String>,
    /// Events of this type (`tool_start`, ...).
    pub kind: Option<String>,
    /// Events (or calls) at or after this time.
    pub since: Option<Timestamp>,
    /// Events with a `seq` above this (the paging cursor of events).
    pub after: Option<u64>,
    /// Only the events the reading process wrote itself, `after` being one of its own `seq`s (how
    /// `/v1/events` resumes). A trail that several replicas write orders events across replicas
    /// by its own cursor, and each replica numbers its events with its own `seq`; a trail one
    /// process writes (SQLite) is the same either way.
    pub own: bool,
    /// Calls older than this cursor (the paging cursor of calls, as [`CallsPage::next`] gave it).
    pub cursor: Option<u64>,
    /// At most this many items (capped at [`AUDIT_MAX_LIMIT`]).
    pub limit: u32,
}

impl AuditQuery {
    /// The page size to use: the limit, or the default, capped.
    pub fn page_size(&self) -> u32 {
        match self.limit {
            0 => AUDIT_DEFAULT_LIMIT,
            n => n.min(AUDIT_MAX_LIMIT),
        }
    }

    /// Whether a filter names calls (so that only events of calls can match).
    pub fn filters_calls(&self) -> bool {
        self.call.is_some() || self.tool.is_some() || self.status.is_some()
    }
}

/// One stored event: its JSON exactly as `/v1/events` sends it (inputs and outputs masked and
/// truncated as the trail stores them).
#[derive(Clone, Debug)]
pub struct AuditEvent {
    /// Its `seq`.
    pub seq: u64,
    /// Its `type`.
    pub kind: String,
    /// The event's JSON.
    pub body: Box<RawValue>,
}

impl Serialize for AuditEvent {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.body.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for AuditEvent {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Head {
            seq: u64,
            #[serde(rename = "type")]
            kind: String,
        }
        let body = Box::<RawValue>::deserialize(deserializer)?;
        let head: Head = serde_json::from_str(body.get()).map_err(serde::de::Error::custom)?;
        Ok(Self {
            seq: head.seq,
            kind: head.kind,
            body,
        })
    }
}

/// A page of events, ascending `seq`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AuditPage {
    /// The events.
    pub events: Vec<AuditEvent>,
    /// The `after` of the next page; `None` when this page is the last one so far.
    pub next: Option<u64>,
}

/// One call as the trail knows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AuditCall {
    /// The call.
    pub call_id: CallId,
    /// Its turn.
    pub turn_id: TurnId,
    /// Who made its turn (`local` for records made before principals existed).
    #[serde(default = "local_principal")]
    pub principal: String,
    /// Its session.
    pub session_id: Option<SessionId>,
    /// Its tool.
    pub tool: Option<String>,
    /// Its outcome's status; `None` while it runs.
    pub status: Option<String>,
    /// Its first recorded event.
    pub started_at: Timestamp,
    /// Its outcome, once it has one.
    pub ended_at: Option<Timestamp>,
    /// From arrival to outcome.
    pub duration_ms: Option<u64>,
    /// How many attempts ran.
    pub attempts: Option<u32>,
    /// Its events, ascending `seq`.
    pub events: Vec<AuditEvent>,
}

/// A page of calls, newest first.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CallsPage {
    /// The calls.
    pub calls: Vec<AuditCall>,
    /// The `cursor` of the next (older) page; `None` on the last one.
    #[serde(with = "opaque_cursor")]
    pub next: Option<u64>,
}

/// The calls cursor travels as an opaque string (`"c<n>"`).
mod opaque_cursor {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(n) => s.collect_str(&format_args!("c{n}")),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        let v = Option::<String>::deserialize(d)?;
        v.map(|s| super::parse_calls_cursor(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Reads a calls cursor (`"c<n>"`, as [`CallsPage::next`] writes it).
pub fn parse_calls_cursor(s: &str) -> Result<u64, String> {
    s.strip_prefix('c')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("expected a cursor from an earlier page's \"next\", got {s:?}"))
}

fn local_principal() -> String {
    crate::principal::LOCAL_PRINCIPAL.to_owned()
}

/// Whether a turn runs or has ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnRunState {
    /// Still running.
    Running,
    /// Ended: its results are known.
    Ended,
}

/// A turn as `GET /v1/turns/{id}` answers it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TurnRecord {
    /// The turn.
    pub turn_id: TurnId,
    /// Who made it (`local` for records made before principals existed).
    #[serde(default = "local_principal")]
    pub principal: String,
    /// Its session.
    pub session_id: Option<SessionId>,
    /// Running or ended.
    pub state: TurnRunState,
    /// When it started.
    pub started_at: Timestamp,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Timestamp>,
    /// How it ended (`completed`, `partial`, `aborted`, `interrupted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Once ended: the results, as `turn_end` carried them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<Box<RawValue>>,
}

/// A task toward an MCP client (docs/GATEWAY.md, "Tasks"): a call answered with a task id instead
/// of its result, kept in the trail so that its outcome outlives the client's connection and a
/// restart of toolwarden. Its status and result are its turn's (the turn holds the one call).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The id the client polls it by.
    pub task_id: String,
    /// The turn that runs the call.
    pub turn_id: TurnId,
    /// The call's id within the turn.
    pub call_id: CallId,
    /// Who asked for it: only this principal may poll, read or cancel it.
    #[serde(default = "local_principal")]
    pub principal: String,
    /// The session the call runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    /// The tool called.
    pub tool: String,
    /// When the task was made.
    pub created_at: Timestamp,
    /// How long its outcome is kept once the call has ended, in milliseconds.
    pub ttl_ms: u64,
    /// The wait between polls suggested to the client, in milliseconds.
    pub poll_interval_ms: u64,
}

/// A replica sharing a PostgreSQL trail, as `GET /v1/replicas` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    /// Its id in the trail (`TOOLWARDEN_REPLICA`).
    pub replica: String,
    /// Its name among replicas on Redis (the id and a random suffix), once it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `live` (renewing its lease), `late` (its lease ran out; about to be declared dead),
    /// `dead` (declared dead: a survivor recorded its open calls), or `stopped` (it stopped
    /// cleanly).
    pub state: String,
    /// Whether it is the replica answering.
    #[serde(default)]
    pub this: bool,
    /// When it started (or rejoined).
    pub started_at: Timestamp,
    /// Its last renewal of its lease.
    pub heartbeat_at: Timestamp,
    /// How long it may go without renewing, in milliseconds.
    pub lease_ms: u64,
    /// How many times it has started or rejoined under this id.
    pub generation: u64,
    /// When it was declared dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_at: Option<Timestamp>,
    /// The replica that recorded what it left open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_over_by: Option<String>,
    /// How many of its calls that replica recorded as `interrupted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<u64>,
    /// When it stopped cleanly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<Timestamp>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_travel_as_their_own_json_and_cursors_as_opaque_strings() {
        let e: AuditEvent = serde_json::from_str(
            r#"{"seq":7,"ts":"1970-01-01T00:00:00.000Z","type":"turn_abort"}"#,
        )
        .unwrap();
        assert_eq!((e.seq, e.kind.as_str()), (7, "turn_abort"));
        let page = CallsPage {
            calls: Vec::new(),
            next: Some(42),
        };
        let text = serde_json::to_string(&page).unwrap();
        assert_eq!(text, r#"{"calls":[],"next":"c42"}"#);
        let back: CallsPage = serde_json::from_str(&text).unwrap();
        assert_eq!(back.next, Some(42));
        assert!(parse_calls_cursor("42").is_err());
        let ev = AuditPage {
            events: vec![e],
            next: None,
        };
        assert_eq!(
            serde_json::to_string(&ev).unwrap(),
            r#"{"events":[{"seq":7,"ts":"1970-01-01T00:00:00.000Z","type":"turn_abort"}],"next":null}"#
        );
    }
}
