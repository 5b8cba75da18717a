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
    }
}
