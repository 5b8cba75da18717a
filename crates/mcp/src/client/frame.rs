//! The frame guard: a filter between a stdio server's stdout and rmcp.
//!
//! rmcp's stdio transport never closes the connection over a bad line — which is good — but it
//! drops the line silently: text that is not JSON is ignored, an oversized line is discarded, and
//! JSON of the wrong shape gets an `Invalid Request` reply. When the bad line was the *answer* to
//! one of our calls, that call would wait for an answer that will never come. The guard reads
//! every line first, forwards only well-formed ones, and for a bad one reports which request it
//! touched (the top-level `"id"`, scanned even from a truncated or oversized frame), so that call
//! ends at once with a clear transport error. Lines that touch no call are only logged.
//!
//! It also takes the hot path off rmcp's parser: an answer to one of our `tools/call` requests
//! (the guard is told their ids as they go out) is parsed straight into a `CallToolResult` and
//! handed over as a message, where rmcp would try every kind of result in turn.

use std::str::FromStr as _;
use std::sync::Arc;

use parking_lot::Mutex;
use rmcp::RoleClient;
use rmcp::model::{
    CallToolResult, ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, JsonRpcResponse,
    JsonRpcVersion2_0, NumberOrString, RequestId, ServerJsonRpcMessage, ServerResult,
};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::io::{
    AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader, DuplexStream,
};
use tokio::sync::mpsc;

/// A line from the server that was not forwarded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BadFrame {
    /// The request it answers, when an id could be read from it.
    pub(crate) id: Option<RequestId>,
    /// What was wrong with it.
    pub(crate) problem: String,
}

/// Receives the bad frames of one connection.
pub(crate) type OnBadFrame = Arc<dyn Fn(BadFrame) + Send + Sync>;

/// The ids of our `tools/call` requests whose answers have not come yet. Only an optimization
/// rides on it: an answer whose id is missing takes rmcp's general path, which is just as right.
#[derive(Default)]
pub(crate) struct PendingCalls(Mutex<std::collections::HashSet<RequestId>>);

impl PendingCalls {
    /// More than this many unanswered calls (abandoned ones never answer) and the set starts over.
    const MAX: usize = 65_536;

    fn insert(&self, id: RequestId) {
        let mut ids = self.0.lock();
        if ids.len() >= Self::MAX {
            ids.clear();
        }
        ids.insert(id);
    }

    fn take(&self, id: &RequestId) -> bool {
        self.0.lock().remove(id)
    }
}

/// Starts guarding `src` (a server's stdout) and returns the transport rmcp talks to the server
/// through: it writes to `stdin` and reads what the guard lets through. rmcp sees the server
/// close its pipe when `src` ends (or fails).
pub(crate) fn guard<W>(
    src: impl AsyncRead + Unpin + Send + 'static,
    stdin: W,
    max_line: usize,
    on_bad: OnBadFrame,
) -> Guarded<W>
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (for_rmcp, to_rmcp) = tokio::io::duplex(256 * 1024);
    let (answers_tx, answers) = mpsc::unbounded_channel();
    let calls = Arc::new(PendingCalls::default());
    tokio::spawn(run(
        src,
        to_rmcp,
        answers_tx,
        calls.clone(),
        max_line,
        on_bad,
    ));
    Guarded {
        inner: AsyncRwTransport::new(for_rmcp, stdin),
        answers,
        calls,
    }
}

/// rmcp's stdio transport behind the guard, plus the answers the guard parsed itself.
pub(crate) struct Guarded<W: AsyncWrite> {
    inner: AsyncRwTransport<RoleClient, DuplexStream, W>,
    answers: mpsc::UnboundedReceiver<ServerJsonRpcMessage>,
    calls: Arc<PendingCalls>,
}

impl<W> Transport<RoleClient> for Guarded<W>
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let JsonRpcMessage::Request(request) = &item
            && matches!(request.request, ClientRequest::CallToolRequest(_))
        {
            self.calls.insert(request.id.clone());
        }
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        // What rmcp reads first when both are ready, so that a call's progress, read before
        // its answer, is handled before it too.
        tokio::select! {
            biased;
            message = self.inner.receive() => match message {
                Some(message) => Some(message),
                // The guard sends every answer it parsed before it closes rmcp's stream.
                None => self.answers.try_recv().ok(),
            },
            Some(answer) = self.answers.recv() => Some(answer),
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

async fn run(
    src: impl AsyncRead + Unpin,
    mut dst: DuplexStream,
    answers: mpsc::UnboundedSender<ServerJsonRpcMessage>,
    calls: Arc<PendingCalls>,
    max_line: usize,
    on_bad: OnBadFrame,
) {
    let mut src = BufReader::with_capacity(64 * 1024, src);
    let mut line: Vec<u8> = Vec::new();
    // Set while skipping the rest of an oversized line: its id scanner and size so far.
    let mut oversized: Option<(IdScanner, usize)> = None;
    loop {
        let (take, complete) = {
            let buf = match src.fill_buf().await {
                Ok(buf) => buf,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the server's stdout failed");
                    break;
                }
            };
            if buf.is_empty() {
                break;
            }
            let newline = buf.iter().position(|b| *b == b'\n');
            let take = newline.map_or(buf.len(), |i| i + 1);
            let chunk = &buf[..take];
            if let Some((scanner, size)) = oversized.as_mut() {
                scanner.feed(chunk);
                *size += take;
            } else if line.len() + take > max_line {
                let mut scanner = IdScanner::default();
                scanner.feed(&line);
                scanner.feed(chunk);
                oversized = Some((scanner, line.len() + take));
                line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
            (take, newline.is_some())
        };
        src.consume(take);
        if !complete {
            continue;
        }
        if let Some((scanner, size)) = oversized.take() {
            on_bad(BadFrame {
                id: scanner.finish(),
                problem: format!(
                    "the server sent a message of {size} bytes, over the {max_line}-byte limit"
                ),
            });
            continue;
        }
        match check(&line, &|id| calls.take(id)) {
            Verdict::Forward => {
                if dst.write_all(&line).await.is_err() {
                    break;
                }
            }
            Verdict::Answer(answer) => {
                if answers.send(*answer).is_err() {
                    break;
                }
            }
            Verdict::Skip => {}
            Verdict::Bad(bad) => on_bad(bad),
        }
        line.clear();
        if line.capacity() > 1 << 20 {
            line.shrink_to(64 * 1024);
        }
    }
    // An unterminated last line is dropped, as rmcp would. Dropping `dst` ends rmcp's input.
}

enum Verdict {
    Forward,
    /// The answer to one of our calls, parsed.
    Answer(Box<ServerJsonRpcMessage>),
    Skip,
    Bad(BadFrame),
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The top-level members a JSON-RPC message may have, borrowed from the line: checking a frame
/// this way validates its JSON without building a value.
#[derive(serde::Deserialize)]
struct Frame<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// Judges one line. `our_call` says (once) whether an id is one of our pending `tools/call`s.
fn check(line: &[u8], our_call: &dyn Fn(&RequestId) -> bool) -> Verdict {
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    let body = body.strip_suffix(b"\r").unwrap_or(body);
    let body = body.strip_prefix(BOM).unwrap_or(body);
    if body.iter().all(u8::is_ascii_whitespace) {
        return Verdict::Skip;
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
            return Verdict::Bad(
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
    if frame.method.is_some() {
        // A request or notification: rmcp's business (it ignores unknown notifications).
        return Verdict::Forward;
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
    if well_formed {
        // Any answer (an error too) settles the call, so its id is taken in every case.
        let ours = id.as_ref().is_some_and(our_call);
        if let Some(id) = id
            && ours
            && let Some(result) = frame.result
            && let Ok(result) = serde_json::from_str::<CallToolResult>(result.get())
        {
            return Verdict::Answer(Box::new(ServerJsonRpcMessage::Response(JsonRpcResponse {
                jsonrpc: JsonRpcVersion2_0,
                id,
                result: ServerResult::CallToolResult(result),
            })));
        }
        return Verdict::Forward;
    }
    match serde_json::from_slice::<ServerJsonRpcMessage>(body) {
        Ok(ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_)) => Verdict::Forward,
        Ok(_) | Err(_) if id.is_none() => Verdict::Bad(BadFrame {
            id: None,
            problem: format!(
                "the server wrote a JSON object that is not a JSON-RPC message: {}",
                preview(body)
            ),
        }),
        Ok(_) => Verdict::Forward,
        Err(e) => Verdict::Bad(BadFrame {
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

/// Finds the top-level `"id"` of a JSON object from its bytes, fed in pieces, without
/// buffering the message: works on truncated frames (if the id came before the cut) and on
/// oversized ones (wherever the id is).
#[derive(Default)]
pub(crate) struct IdScanner {
    started: bool,
    dead: bool,
    depth: u32,
    in_string: bool,
    escape: bool,
    expect_key: bool,
    capturing_key: bool,
    key_done: bool,
    key: Vec<u8>,
    value: Value_,
    found: Option<RequestId>,
}

#[derive(Default, PartialEq)]
enum Value_ {
    #[default]
    None,
    Start,
    Str(Vec<u8>),
    Num(Vec<u8>),
}

impl IdScanner {
    /// Scans one whole (possibly broken) frame.
    pub(crate) fn scan(bytes: &[u8]) -> Option<RequestId> {
        let mut s = Self::default();
        s.feed(bytes);
        s.finish()
    }

    /// Feeds the next bytes.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.dead || self.found.is_some() {
                return;
            }
            self.step(b);
        }
    }

    /// The id, if one was found (a number cut off at the end of the input counts).
    pub(crate) fn finish(mut self) -> Option<RequestId> {
        if self.found.is_none()
            && let Value_::Num(digits) = &self.value
        {
            self.found = parse_number(digits);
        }
        self.found
    }

    fn step(&mut self, b: u8) {
        if !self.started {
            if b.is_ascii_whitespace() || BOM.contains(&b) {
                return;
            }
            if b == b'{' {
                self.started = true;
                self.depth = 1;
                self.expect_key = true;
            } else {
                self.dead = true;
            }
            return;
        }
        match &mut self.value {
            Value_::None => {}
            Value_::Start => {
                if b.is_ascii_whitespace() {
                    return;
                }
                if b == b'"' {
                    self.value = Value_::Str(Vec::new());
                } else if b == b'-' || b.is_ascii_digit() {
                    self.value = Value_::Num(vec![b]);
                } else {
                    // `null` or a structure: not an id we can route.
                    self.dead = true;
                }
                return;
            }
            Value_::Str(s) => {
                if self.escape {
                    self.escape = false;
                    s.push(b);
                } else if b == b'\\' {
                    self.escape = true;
                } else if b == b'"' {
                    self.found = std::str::from_utf8(s)
                        .ok()
                        .map(|s| NumberOrString::String(s.into()));
                    self.dead = self.found.is_none();
                } else if s.len() < 256 {
                    s.push(b);
                } else {
                    self.dead = true;
                }
                return;
            }
            Value_::Num(digits) => {
                if b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E') {
                    if digits.len() < 32 {
                        digits.push(b);
                    }
                } else {
                    self.found = parse_number(digits);
                    self.dead = self.found.is_none();
                }
                return;
            }
        }
        if self.in_string {
            if self.escape {
                self.escape = false;
                if self.capturing_key {
                    self.key.push(b);
                }
            } else if b == b'\\' {
                self.escape = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.capturing_key {
                    self.capturing_key = false;
                    self.key_done = true;
                }
            } else if self.capturing_key && self.key.len() < 8 {
                self.key.push(b);
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.expect_key = false;
                    self.capturing_key = true;
                    self.key.clear();
                }
            }
            b':' if self.depth == 1 && self.key_done => {
                self.key_done = false;
                if self.key == b"id" {
                    self.value = Value_::Start;
                }
            }
            b',' if self.depth == 1 => {
                self.expect_key = true;
                self.key_done = false;
            }
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    self.dead = true;
                }
            }
            _ => {}
        }
    }
}

fn parse_number(digits: &[u8]) -> Option<RequestId> {
    let s = std::str::from_utf8(digits).ok()?;
    i64::from_str(s).ok().map(NumberOrString::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn num(n: i64) -> Option<RequestId> {
        Some(NumberOrString::Number(n))
    }

    fn string(s: &str) -> Option<RequestId> {
        Some(NumberOrString::String(s.into()))
    }

    #[test]
    fn scanner_finds_top_level_ids() {
        let cases: &[(&str, Option<RequestId>)] = &[
            (r#"{"jsonrpc":"2.0","id":5,"result":{}}"#, num(5)),
            (r#"{"result":{"id":9,"x":[1,{"id":3}]},"id":12}"#, num(12)),
            (r#"{"jsonrpc":"2.0","id":"abc","result":{"#, string("abc")),
            (
                r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"te"#,
                num(7),
            ),
            (r#"{"jsonrpc":"2.0","id":42"#, num(42)),
            (r#"{"text":"has \"id\":3 inside","id":-4}"#, num(-4)),
            (r#"{"jsonrpc":"2.0","id":null,"error":{}}"#, None),
            (r#"{"jsonrpc":"2.0","result":{}}"#, None),
            ("this is not json", None),
            (r#"[{"id":1}]"#, None),
        ];
        for (input, want) in cases {
            assert_eq!(&IdScanner::scan(input.as_bytes()), want, "input {input}");
        }
    }

    #[test]
    fn scanner_works_across_pieces() {
        let frame = br#"{"jsonrpc":"2.0","result":{"content":"xxxx"},"id":123}"#;
        for split in 0..frame.len() {
            let mut s = IdScanner::default();
            s.feed(&frame[..split]);
            s.feed(&frame[split..]);
            assert_eq!(s.finish(), num(123), "split at {split}");
        }
    }

    fn verdict(line: &str) -> Result<bool, BadFrame> {
        match check(line.as_bytes(), &|_| false) {
            Verdict::Forward | Verdict::Answer(_) => Ok(true),
            Verdict::Skip => Ok(false),
            Verdict::Bad(b) => Err(b),
        }
    }

    #[test]
    fn answers_to_our_calls_are_parsed_here_and_others_left_to_rmcp() {
        let answer = "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}}\n";
        let Verdict::Answer(parsed) =
            check(answer.as_bytes(), &|id| *id == NumberOrString::Number(7))
        else {
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
            check(answer.as_bytes(), &|_| false),
            Verdict::Forward
        ));
        // An error settles the call too: its id is taken, the error goes to rmcp.
        let taken = std::cell::Cell::new(false);
        let error =
            "{\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":-32602,\"message\":\"no\"}}\n";
        assert!(matches!(
            check(error.as_bytes(), &|_| {
                taken.set(true);
                true
            }),
            Verdict::Forward
        ));
        assert!(taken.get());
    }

    #[test]
    fn pending_calls_stay_bounded() {
        let calls = PendingCalls::default();
        for n in 0..(PendingCalls::MAX as i64 + 10) {
            calls.insert(NumberOrString::Number(n));
        }
        assert!(calls.0.lock().len() <= PendingCalls::MAX);
        assert!(calls.take(&NumberOrString::Number(PendingCalls::MAX as i64 + 5)));
        assert!(!calls.take(&NumberOrString::Number(PendingCalls::MAX as i64 + 5)));
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
