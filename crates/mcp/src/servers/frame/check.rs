//! Frame checks: whether one line from a server is a message rmcp will read, an answer to one
//! of our calls the guard can parse itself (or must, when rmcp never saw the request), a
//! progress report the guard can deliver as it reads it, or a bad frame that must fail the call
//! it names (rmcp would drop it silently and leave that call waiting).

use rmcp::model::{
    CallToolResult, JsonRpcError, JsonRpcResponse, JsonRpcVersion2_0, NumberOrString,
    ProgressNotificationParam, RequestId, ServerJsonRpcMessage, ServerResult,
};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::oneshot;

use super::id_scanner::{BOM, IdScanner};
use super::pending::Waiter;

/// A line from the server that was not forwarded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BadFrame {
    /// The request it answers, when an id could be read from it.
    pub(crate) id: Option<RequestId>,
    /// What was wrong with it.
    pub(crate) problem: String,
}

/// What the guard does with a line.
pub(super) enum LineAction {
    /// Pass it to rmcp as it is.
    Forward,
    /// The answer to one of our calls sent through rmcp, parsed.
    Answer(Box<ServerJsonRpcMessage>),
    /// The answer to one of our calls sent past rmcp, for the call that waits for it.
    Direct(
        oneshot::Sender<ServerJsonRpcMessage>,
        Box<ServerJsonRpcMessage>,
    ),
    /// A progress report: to its call now, or to rmcp if no call takes it.
    Progress(Box<ProgressNotificationParam>),
    /// Drop it: a blank line.
    Skip,
    /// Drop it and fail the call it names.
    Bad(BadFrame),
    /// The same, for a call sent past rmcp, whose waiter was taken: it is dropped only once the
    /// call has been failed, so that the call does not take it for the connection's end.
    BadAnswer(oneshot::Sender<ServerJsonRpcMessage>, BadFrame),
}

/// The top-level members a JSON-RPC message may have, borrowed from the line: checking a frame
/// this way validates its JSON without building a value.
#[derive(serde::Deserialize)]
struct Frame<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// Judges one line. `our_call` takes (once) who waits for an id, if it is one of our pending
/// `tools/call`s.
pub(super) fn check(line: &[u8], our_call: &dyn Fn(&RequestId) -> Option<Waiter>) -> LineAction {
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    let body = body.strip_suffix(b"\r").unwrap_or(body);
    let body = body.strip_prefix(BOM).unwrap_or(body);
    if body.iter().all(u8::is_ascii_whitespace) {
        return LineAction::Skip;
    }
    // The usual line, a tool's result, is read in one pass; anything else, or anything odd
    // about it, takes the general path below, which judges it exactly as before.
    if let Some(answer) = ToolAnswer::read(body) {
        return answer.act(our_call);
    }
    check_frame(body, our_call)
}

/// The usual answer to a `tools/call` — version `"2.0"`, a number or string id, a result object
/// that is a tool's result, no `error` and no `method` — read in one pass. Reading stops at the
/// first member that rules it out (`method`, `error`), so a notification or an error costs
/// little before the general path reads it.
#[derive(serde::Deserialize)]
struct ToolAnswer<'a> {
    #[serde(borrow)]
    jsonrpc: &'a RawValue,
    id: AnswerId,
    result: ToolResultObject,
    #[serde(rename = "method", default, deserialize_with = "ruled_out")]
    _method: (),
    #[serde(rename = "error", default, deserialize_with = "ruled_out")]
    _error: (),
    /// Read only so that a repeated `params` fails here as it fails the general path.
    #[serde(rename = "params", default)]
    _params: Option<serde::de::IgnoredAny>,
}

impl ToolAnswer<'_> {
    fn read(body: &[u8]) -> Option<ToolAnswer<'_>> {
        // An array would fill the struct by position: only an object can be a message.
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return None;
        }
        // serde_json checks the text of a member it skips only when it reads from a string:
        // a line that is not UTF-8 anywhere takes the general path, which judges it whole.
        let body = std::str::from_utf8(body).ok()?;
        serde_json::from_str::<ToolAnswer<'_>>(body)
            .ok()
            .filter(|answer| answer.jsonrpc.get() == "\"2.0\"")
    }

    /// What the general path does with a well-formed tool's result.
    fn act(self, our_call: &dyn Fn(&RequestId) -> Option<Waiter>) -> LineAction {
        let id = self.id.0;
        // Any answer settles the call, so its id is taken in every case.
        let waiter = our_call(&id);
        let answer = || {
            Box::new(ServerJsonRpcMessage::Response(JsonRpcResponse {
                jsonrpc: JsonRpcVersion2_0,
                id: id.clone(),
                result: ServerResult::CallToolResult(self.result.0),
            }))
        };
        match waiter {
            None => LineAction::Forward,
            Some(Waiter::Rmcp) => LineAction::Answer(answer()),
            Some(Waiter::Direct(tx)) => LineAction::Direct(tx, answer()),
        }
    }
}

/// A request id as the general path reads one ([`id_of`]): an integer that fits an `i64`, or a
/// string.
struct AnswerId(RequestId);

impl<'de> serde::Deserialize<'de> for AnswerId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = AnswerId;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an integer or a string")
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<AnswerId, E> {
                Ok(AnswerId(NumberOrString::Number(n)))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<AnswerId, E> {
                i64::try_from(n)
                    .map(|n| AnswerId(NumberOrString::Number(n)))
                    .map_err(|_| E::custom("an id beyond i64"))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<AnswerId, E> {
                Ok(AnswerId(NumberOrString::String(s.into())))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A `result` that is a JSON object and reads as a tool's result.
struct ToolResultObject(CallToolResult);

impl<'de> serde::Deserialize<'de> for ToolResultObject {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ToolResultObject;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a tool's result object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<ToolResultObject, A::Error> {
                use serde::Deserialize as _;
                CallToolResult::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(ToolResultObject)
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// A member whose presence, whatever its value (`null` too), rules a line out of
/// [`ToolAnswer`]: reading fails on it at once.
fn ruled_out<'de, D: serde::Deserializer<'de>>(_: D) -> Result<(), D::Error> {
    Err(serde::de::Error::custom("not a tool's result"))
}

/// The general path: any line, judged member by member.
fn check_frame(body: &[u8], our_call: &dyn Fn(&RequestId) -> Option<Waiter>) -> LineAction {
    let is_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let parsed = if is_object {
        serde_json::from_slice::<Frame<'_>>(body)
    } else {
        // Not an object (an array parses into the struct by position): never a message.
        serde_json::from_slice::<serde::de::IgnoredAny>(body)
            .and_then(|_| Err(serde::de::Error::custom("not an object")))
    };
    let frame: Frame<'_> = match parsed {
        Ok(frame) => frame,
        Err(e) => {
            return LineAction::Bad(
                match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                    // Valid JSON, but not an object.
                    Ok(_) => BadFrame {
                        id: None,
                        problem: format!(
                            "the server wrote JSON that is not a JSON-RPC message: {}",
                            preview(body)
                        ),
                    },
                    Err(_) => BadFrame {
                        id: IdScanner::scan(body),
                        problem: format!(
                            "the server wrote a line that is not JSON ({e}): {}",
                            preview(body)
                        ),
                    },
                },
            );
        }
    };
    if let Some(method) = frame.method {
        if method.get() == "\"notifications/progress\""
            && frame.id.is_none()
            && let Some(params) = frame.params
            && let Ok(progress) = serde_json::from_str::<ProgressNotificationParam>(params.get())
        {
            return LineAction::Progress(Box::new(progress));
        }
        // A request or notification: rmcp's business (it ignores unknown notifications).
        return LineAction::Forward;
    }
    let id = frame
        .id
        .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok())
        .and_then(|v| id_of(&v));
    // The usual answer — version 2.0, an id, and either a result object or an error with a code
    // and a message — is what rmcp parses; only anything else is checked the way rmcp will parse
    // it, or its call would never hear of it.
    let well_formed = frame.jsonrpc.is_some_and(|v| v.get() == "\"2.0\"")
        && id.is_some()
        && match (frame.result, frame.error) {
            (Some(result), None) => result.get().starts_with('{'),
            (None, Some(error)) => {
                serde_json::from_str::<rmcp::model::ErrorData>(error.get()).is_ok()
            }
            _ => false,
        };
    if well_formed && let Some(id) = id.clone() {
        // Any answer (an error too) settles the call, so its id is taken in every case.
        let waiter = our_call(&id);
        let tool_result = || {
            frame
                .result
                .and_then(|result| serde_json::from_str::<CallToolResult>(result.get()).ok())
                .map(|result| {
                    Box::new(ServerJsonRpcMessage::Response(JsonRpcResponse {
                        jsonrpc: JsonRpcVersion2_0,
                        id: id.clone(),
                        result: ServerResult::CallToolResult(result),
                    }))
                })
        };
        return match waiter {
            None => LineAction::Forward,
            Some(Waiter::Rmcp) => tool_result().map_or(LineAction::Forward, LineAction::Answer),
            Some(Waiter::Direct(tx)) => {
                if let Some(answer) = tool_result() {
                    return LineAction::Direct(tx, answer);
                }
                if let Some(error) = frame.error
                    && let Ok(error) = serde_json::from_str::<rmcp::ErrorData>(error.get())
                {
                    return LineAction::Direct(
                        tx,
                        Box::new(ServerJsonRpcMessage::Error(JsonRpcError {
                            jsonrpc: JsonRpcVersion2_0,
                            id: Some(id),
                            error,
                        })),
                    );
                }
                // Another kind of result (a task, say): parsed as rmcp would.
                match serde_json::from_slice::<ServerJsonRpcMessage>(body) {
                    Ok(answer) => LineAction::Direct(tx, Box::new(answer)),
                    Err(e) => LineAction::BadAnswer(
                        tx,
                        BadFrame {
                            id: Some(id),
                            problem: format!("the server sent a malformed response ({e})"),
                        },
                    ),
                }
            }
        };
    }
    match serde_json::from_slice::<ServerJsonRpcMessage>(body) {
        Ok(answer @ (ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_))) => {
            let answered = match &answer {
                ServerJsonRpcMessage::Response(response) => Some(&response.id),
                ServerJsonRpcMessage::Error(error) => error.id.as_ref(),
                _ => None,
            };
            match answered.and_then(our_call) {
                Some(Waiter::Direct(tx)) => LineAction::Direct(tx, Box::new(answer)),
                _ => LineAction::Forward,
            }
        }
        Ok(_) | Err(_) if id.is_none() => LineAction::Bad(BadFrame {
            id: None,
            problem: format!(
                "the server wrote a JSON object that is not a JSON-RPC message: {}",
                preview(body)
            ),
        }),
        Ok(_) => LineAction::Forward,
        Err(e) => LineAction::Bad(BadFrame {
            id,
            problem: format!("the server sent a malformed response ({e})"),
        }),
    }
}

fn id_of(v: &Value) -> Option<RequestId> {
    match v {
        Value::Number(n) => n.as_i64().map(NumberOrString::Number),
        Value::String(s) => Some(NumberOrString::String(s.as_str().into())),
        _ => None,
    }
}

/// The start of a line, printable, for logs and error details.
fn preview(body: &[u8]) -> String {
    const MAX: usize = 120;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX)]);
    let mut out: String = text.chars().filter(|c| !c.is_control()).collect();
    if body.len() > MAX {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn num(n: i64) -> Option<RequestId> {
        Some(NumberOrString::Number(n))
    }

    fn verdict(line: &str) -> Result<bool, BadFrame> {
        match check(line.as_bytes(), &|_| None) {
            LineAction::Forward
            | LineAction::Answer(_)
            | LineAction::Direct(..)
            | LineAction::Progress(_) => Ok(true),
            LineAction::Skip => Ok(false),
            LineAction::Bad(b) | LineAction::BadAnswer(_, b) => Err(b),
        }
    }

    #[test]
    fn answers_to_our_calls_are_parsed_here_and_others_left_to_rmcp() {
        let answer = "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}}\n";
        let LineAction::Answer(parsed) = check(answer.as_bytes(), &|id| {
            (*id == NumberOrString::Number(7)).then_some(Waiter::Rmcp)
        }) else {
            panic!("an answer to our call is parsed");
        };
        let ServerJsonRpcMessage::Response(response) = *parsed else {
            panic!("as a response");
        };
        assert_eq!(response.id, NumberOrString::Number(7));
        let ServerResult::CallToolResult(result) = response.result else {
            panic!("as a tool's result");
        };
        assert_eq!(result.content.len(), 1);
        // Not one of our calls (e.g. tools/list): rmcp parses it.
        assert!(matches!(
            check(answer.as_bytes(), &|_| None),
            LineAction::Forward
        ));
        // An error settles the call too: its id is taken, the error goes to rmcp.
        let taken = std::cell::Cell::new(false);
        let error =
            "{\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":-32602,\"message\":\"no\"}}\n";
        assert!(matches!(
            check(error.as_bytes(), &|_| {
                taken.set(true);
                Some(Waiter::Rmcp)
            }),
            LineAction::Forward
        ));
        assert!(taken.get());
    }

    #[test]
    fn answers_to_calls_sent_past_rmcp_go_to_them_whatever_they_are() {
        let direct = |line: &str| {
            let (tx, _rx) = oneshot::channel();
            let tx = std::cell::Cell::new(Some(tx));
            match check(line.as_bytes(), &|_| tx.take().map(Waiter::Direct)) {
                LineAction::Direct(_, answer) => Some(*answer),
                LineAction::Bad(bad) | LineAction::BadAnswer(_, bad) => {
                    panic!("bad frame: {bad:?}")
                }
                _ => None,
            }
        };
        let Some(ServerJsonRpcMessage::Response(response)) = direct(
            "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}}\n",
        ) else {
            panic!("a tool's result");
        };
        assert!(matches!(response.result, ServerResult::CallToolResult(_)));
        let Some(ServerJsonRpcMessage::Error(error)) = direct(
            "{\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":-32602,\"message\":\"no\"}}\n",
        ) else {
            panic!("an error");
        };
        assert_eq!(error.id, num(7));
        assert_eq!(error.error.message, "no");
        let Some(ServerJsonRpcMessage::Response(response)) = direct(
            "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"task\":{\"taskId\":\"t1\",\"status\":\"working\",\"createdAt\":\"2026-01-01T00:00:00Z\",\"lastUpdatedAt\":\"2026-01-01T00:00:00Z\",\"ttl\":null}}}\n",
        ) else {
            panic!("another result");
        };
        assert!(
            !matches!(response.result, ServerResult::CallToolResult(_)),
            "{:?}",
            response.result
        );
        // An answer of an odd shape is never left to rmcp, which does not know the request:
        // the call gets it, or fails on it.
        let (tx, _rx) = oneshot::channel();
        let tx = std::cell::Cell::new(Some(tx));
        assert!(matches!(
            check(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":[1]}\n", &|_| tx
                .take()
                .map(Waiter::Direct)),
            LineAction::Direct(..)
                | LineAction::BadAnswer(..)
                | LineAction::Bad(BadFrame { id: Some(_), .. })
        ));
    }

    /// What a line came to, for comparing two ways of judging it: the action, the answer as
    /// JSON, and the id taken from the pending calls.
    fn outcome(
        action: LineAction,
        taken: Option<RequestId>,
    ) -> (String, Option<String>, Option<RequestId>) {
        let json = |m: &ServerJsonRpcMessage| serde_json::to_string(m).unwrap();
        let (kind, detail) = match action {
            LineAction::Forward => ("forward".to_owned(), None),
            LineAction::Answer(m) => ("answer".to_owned(), Some(json(&m))),
            LineAction::Direct(_, m) => ("direct".to_owned(), Some(json(&m))),
            LineAction::Progress(p) => ("progress".to_owned(), Some(format!("{p:?}"))),
            LineAction::Skip => ("skip".to_owned(), None),
            LineAction::Bad(b) => ("bad".to_owned(), Some(format!("{b:?}"))),
            LineAction::BadAnswer(_, b) => ("bad answer".to_owned(), Some(format!("{b:?}"))),
        };
        (kind, detail, taken)
    }

    /// A way of judging a line: [`check`] or [`check_frame`].
    type Judge = fn(&[u8], &dyn Fn(&RequestId) -> Option<Waiter>) -> LineAction;

    /// Judges `line` with `judge`, the pending call waiting as `waiter` says (0: none, 1: rmcp,
    /// 2: a call sent past rmcp).
    fn judged(
        judge: Judge,
        line: &[u8],
        waiter: u8,
    ) -> (String, Option<String>, Option<RequestId>) {
        let taken = std::cell::RefCell::new(None);
        let (tx, _rx) = oneshot::channel();
        let tx = std::cell::Cell::new(Some(tx));
        let action = judge(line, &|id| {
            *taken.borrow_mut() = Some(id.clone());
            match waiter {
                1 => Some(Waiter::Rmcp),
                2 => tx.take().map(Waiter::Direct),
                _ => None,
            }
        });
        outcome(action, taken.into_inner())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// The one-pass read of a tool's result judges every line as the general path does:
        /// random members (right and wrong versions, ids of every JSON type, results that are
        /// and are not a tool's, `error` and `method` with any value, `null` too, unknown and
        /// repeated members, unknown ones inside `result` and `params`), in any order; now and then
        /// their values alone, as an array; now and then a byte that is not UTF-8.
        #[test]
        fn the_one_pass_read_judges_as_the_general_path(
            members in proptest::collection::vec((0u8..8, 0usize..21, proptest::prelude::any::<u8>()), 7),
            waiter in 0u8..3,
            array in proptest::prelude::any::<bool>(),
            bad_byte in proptest::prelude::any::<bool>(),
        ) {
            const JSONRPC: [&str; 4] = ["\"2.0\"", "\"1.0\"", "\"2\\u002e0\"", "2"];
            const ID: [&str; 8] = ["7", "\"a\"", "-1", "7.0", "null", "9223372036854775808", "true", "{}"];
            const RESULT: [&str; 10] = [
                "{\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}",
                "{\"content\":[]}",
                "{\"content\":[],\"isError\":true,\"structuredContent\":{\"a\":1}}",
                "{\"task\":{\"taskId\":\"t1\",\"status\":\"working\",\"createdAt\":\"2026-01-01T00:00:00Z\",\"lastUpdatedAt\":\"2026-01-01T00:00:00Z\",\"ttl\":null}}",
                "[1]",
                "\"x\"",
                "null",
                "{\"content\":\"no\"}",
                "{}",
                "{\"content\":[],\"x\":{\"BAD\":\"BAD\"}}",
            ];
            const ERROR: [&str; 3] = ["{\"code\":-32602,\"message\":\"no\"}", "null", "\"x\""];
            const METHOD: [&str; 3] = ["\"notifications/progress\"", "null", "\"tools/call\""];
            const PARAMS: [&str; 3] = ["{\"progressToken\":5,\"progress\":2}", "null", "{\"BAD\":[\"BAD\"]}"];
            // Each member: how often it comes (the usual answer's three members mostly once, the
            // others mostly not at all, any of them now and then twice), its value (the usual
            // one half of the time) and its place.
            let mut placed: Vec<(u8, String)> = Vec::new();
            for (key, &(presence, value, place)) in members.iter().enumerate() {
                let usual = matches!(key, 0..=2);
                let times = match presence {
                    0 => usize::from(!usual),
                    7 => 2,
                    _ => usize::from(usual),
                };
                let value = value.saturating_sub(9);
                let member = match key {
                    0 => format!("\"jsonrpc\":{}", JSONRPC[value % JSONRPC.len()]),
                    1 => format!("\"id\":{}", ID[value % ID.len()]),
                    2 => format!("\"result\":{}", RESULT[value % RESULT.len()]),
                    3 => format!("\"error\":{}", ERROR[value % ERROR.len()]),
                    4 => format!("\"method\":{}", METHOD[value % METHOD.len()]),
                    5 => format!("\"params\":{}", PARAMS[value % PARAMS.len()]),
                    _ => format!("\"other\":\"BAD{value}\""),
                };
                for n in 0..times {
                    placed.push((place.wrapping_add(n as u8 * 97), member.clone()));
                }
            }
            placed.sort();
            let body: Vec<String> = placed.into_iter().map(|(_, member)| member).collect();
            // Now and then the members' values alone, as an array (never a message).
            let line = if array {
                let values: Vec<&str> = body
                    .iter()
                    .filter_map(|member| member.split_once(':').map(|(_, value)| value))
                    .collect();
                format!("[{}]\n", values.join(","))
            } else {
                format!("{{{}}}\n", body.join(","))
            };
            // Now and then a byte that is not UTF-8 where `BAD` stands (a value or a key that
            // either path may skip).
            let line = if bad_byte {
                line.replace("BAD", "\u{1}").into_bytes().into_iter().map(|b| if b == 1 { 0xff } else { b }).collect()
            } else {
                line.into_bytes()
            };
            let body = line.strip_suffix(b"\n").unwrap();
            proptest::prop_assert_eq!(
                judged(check, &line, waiter),
                judged(check_frame, body, waiter),
                "{}", String::from_utf8_lossy(&line)
            );
        }
    }

    /// The one-pass read is taken for the usual answer (a member ruled out makes it fail).
    #[test]
    fn the_usual_answer_is_read_in_one_pass() {
        let answer = b"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[]}}";
        assert!(ToolAnswer::read(answer).is_some());
        for odd in [
            &b"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[]},\"error\":null}"[..],
            b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":null,\"result\":{\"content\":[]}}",
            b"{\"jsonrpc\":\"2.0\",\"id\":7.0,\"result\":{\"content\":[]}}",
            b"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":[]}",
            b"{\"jsonrpc\":\"2.0\",\"id\":7,\"id\":8,\"result\":{\"content\":[]}}",
            b"[\"2.0\",7,{\"content\":[]}]",
        ] {
            assert!(
                ToolAnswer::read(odd).is_none(),
                "{}",
                String::from_utf8_lossy(odd)
            );
        }
    }

    #[test]
    fn progress_reports_are_read_for_the_guard() {
        let LineAction::Progress(p) = check(
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":5,\"progress\":2,\"total\":4}}\n",
            &|_| None,
        ) else {
            panic!("a progress report");
        };
        assert_eq!(p.progress_token.0, NumberOrString::Number(5));
        assert_eq!(p.total, Some(4.0));
        // A malformed one is rmcp's to judge.
        assert!(matches!(
            check(
                b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n",
                &|_| None
            ),
            LineAction::Forward
        ));
    }

    #[test]
    fn check_forwards_messages_and_reports_bad_frames() {
        assert_eq!(
            verdict("{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[]}}\n"),
            Ok(true)
        );
        assert_eq!(
            verdict(
                "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n"
            ),
            Ok(true)
        );
        assert_eq!(
            verdict(
                "{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"code\":-32602,\"message\":\"bad\"}}\r\n"
            ),
            Ok(true)
        );
        assert_eq!(verdict("   \n"), Ok(false));
        let bad = verdict("{\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{\"content\":[{\"type\n")
            .unwrap_err();
        assert_eq!(bad.id, num(8));
        assert!(bad.problem.contains("not JSON"), "{}", bad.problem);
        let bad = verdict("{\"jsonrpc\":\"2.0\",\"id\":9,\"unexpected\":true}\n").unwrap_err();
        assert_eq!(bad.id, num(9));
        assert!(
            bad.problem.contains("malformed response"),
            "{}",
            bad.problem
        );
        assert_eq!(verdict("garbage\n").unwrap_err().id, None);
        assert_eq!(verdict("[1,2]\n").unwrap_err().id, None);
        // An array that would fill an answer by position is not one either.
        assert_eq!(
            verdict("[\"2.0\",7,{\"content\":[]}]\n").unwrap_err().id,
            None
        );
    }
}
