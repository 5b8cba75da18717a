//! The audit trail under a real engine: what is stored, when, what survives a crash, what is never
//! written, and how bad files are refused.

// clippy's allow-unwrap-in-tests covers #[test] functions only, not this file's helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use toolwarden_core::interaction::{InteractionRequest, Interactor};
use toolwarden_core::protocol::{
    AuditQuery, Interaction, InteractionAnswer, InteractionKind, StoreDurability, ToolCall, TurnId,
    TurnRunState,
};
use toolwarden_core::{AnswerSender, AuditStore, Engine, InProcessTool, StoreHealth, ToolError};
use toolwarden_store::{AuditReader, OpenError, SqliteStore, StoreOptions};

fn dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("toolwarden-store-")
        .tempdir()
        .unwrap()
}

fn open(path: &Path) -> Arc<SqliteStore> {
    Arc::new(SqliteStore::open(StoreOptions::new(path)).unwrap())
}

/// An engine recording into `store`, with `echo`, `hang` and `check_recorded` (which reads the
/// trail itself to see whether its own `tool_start` was committed before it ran).
fn engine(store: Arc<SqliteStore>) -> Engine {
    let path = store.path().to_owned();
    let engine = Engine::builder().store(store).build();
    engine.register(InProcessTool::new(
        "echo",
        "Answers its input",
        json!({"type": "object"}),
        |input, _ctx| async move { Ok::<_, ToolError>(input.to_string()) },
    ));
    engine.register(InProcessTool::new(
        "hang",
        "Never answers",
        json!({"type": "object"}),
        |_input, ctx| async move {
            ctx.cancelled().await;
            Ok::<_, ToolError>("stopped")
        },
    ));
    engine.register(InProcessTool::new(
        "check_recorded",
        "Says whether its own tool_start is in the trail",
        json!({"type": "object"}),
        move |_input, ctx| {
            let path = path.clone();
            async move {
                let reader = AuditReader::open(&path).map_err(|e| ToolError::new(e.to_string()))?;
                let page = reader
                    .events(&AuditQuery {
                        turn: Some(ctx.meta().turn_id.clone()),
                        kind: Some("tool_start".into()),
                        ..AuditQuery::default()
                    })
                    .map_err(|e| ToolError::new(e.to_string()))?;
                Ok::<_, ToolError>(format!("{}", page.events.len()))
            }
        },
    ));
    engine
}

fn events_of(path: &Path, query: AuditQuery) -> Vec<Value> {
    let reader = AuditReader::open(path).unwrap();
    reader
        .events(&query)
        .unwrap()
        .events
        .iter()
        .map(|e| serde_json::from_str(e.body.get()).unwrap())
        .collect()
}

// On two worker threads, as the binary runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_is_stored_in_order_and_seq_goes_on_after_a_restart() {
    let tmp = dir();
    let path = tmp.path().join("audit.db");
    let store = open(&path);
    let engine = engine(store.clone());
    for i in 0..20 {
        let r = engine
            .call(
                "s1",
                ToolCall::new(format!("c{i}"), "echo", json!({"i": i})),
            )
            .await;
        assert_eq!(r.text(), format!("{{\"i\":{i}}}"));
    }
    engine
        .store_caught_up(Duration::from_secs(5))
        .await
        .unwrap();
    let last = engine.events().last_seq();
    store.close().await;
    let all = events_of(
        &path,
        AuditQuery {
            limit: 1000,
            ..AuditQuery::default()
        },
    );
    assert_eq!(
        all.iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        (1..=last).collect::<Vec<_>>()
    );
    assert_eq!(
        all.len(),
        80,
        "turn_start, tool_start, tool_result, turn_end per call"
    );

    let store = open(&path);
    assert_eq!(store.last_seq(), last);
    let engine = self::engine(store.clone());
    engine
        .call("s1", ToolCall::new("again", "echo", json!({})))
        .await;
    engine
        .store_caught_up(Duration::from_secs(5))
        .await
        .unwrap();
    let page = store
        .events(AuditQuery {
            after: Some(last),
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(page.events.first().map(|e| e.seq), Some(last + 1));
    assert_eq!(page.events.len(), 4);
}

// On two worker threads, as the binary runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_before_execution_a_tool_runs_only_once_its_start_is_committed() {
    let tmp = dir();
    let store = open(&tmp.path().join("audit.db"));
    let engine = engine(store);
    for i in 0..10 {
        let r = engine
            .call(
                "s",
                ToolCall::new(format!("c{i}"), "check_recorded", json!({"i": i})),
            )
            .await;
        assert_eq!(r.text(), "1", "{r:?}");
    }
}

#[tokio::test]
async fn reads_filter_and_page_events_calls_and_turns() {
    let tmp = dir();
    let store = open(&tmp.path().join("audit.db"));
    let engine = engine(store.clone());
    for i in 0..5 {
        engine
            .call(
                format!("s{}", i % 2),
                ToolCall::new("c", "echo", json!({"i": i})),
            )
            .await;
    }
    let unknown = engine
        .call("s0", ToolCall::new("u", "nope", json!({})))
        .await;
    engine
        .store_caught_up(Duration::from_secs(5))
        .await
        .unwrap();

    let page = store
        .events(AuditQuery {
            session: Some("s1".into()),
            limit: 3,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(page.events.len(), 3);
    let next = store
        .events(AuditQuery {
            session: Some("s1".into()),
            after: page.next,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.events.len() + next.events.len(),
        8,
        "two turns of four events"
    );
    assert_eq!(next.next, None);

    let invalid = store
        .calls(AuditQuery {
            status: Some("invalid".into()),
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(invalid.calls.len(), 1);
    let call = &invalid.calls[0];
    assert_eq!(
        (
            call.call_id.as_str(),
            call.tool.as_deref(),
            call.status.as_deref(),
            call.attempts
        ),
        ("u", Some("nope"), Some("invalid"), Some(0))
    );
    assert_eq!(
        call.events
            .iter()
            .map(|e| e.kind.as_str())
            .collect::<Vec<_>>(),
        vec!["tool_result"]
    );

    let echo = store
        .calls(AuditQuery {
            tool: Some("echo".into()),
            limit: 2,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(echo.calls.len(), 2);
    let older = store
        .calls(AuditQuery {
            tool: Some("echo".into()),
            cursor: echo.next,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(older.calls.len(), 3);
    assert!(older.calls[0].started_at <= echo.calls[1].started_at);

    let turn = store
        .turn(unknown.outcome.turn_id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(turn.state, TurnRunState::Ended);
    let results: Value = serde_json::from_str(turn.results.unwrap().get()).unwrap();
    assert_eq!(results[0]["outcome"]["status"], "invalid");
    assert!(store.turn(TurnId::from("t_nope")).await.unwrap().is_none());
}

#[tokio::test]
async fn a_call_left_running_by_a_dead_process_is_recorded_interrupted_on_the_next_open() {
    let tmp = dir();
    let path = tmp.path().join("audit.db");
    let store = open(&path);
    let engine = engine(store.clone());
    let handle = engine
        .start_turn(toolwarden_core::TurnRequest::new(
            "s",
            vec![
                ToolCall::new("a", "hang", json!({})),
                ToolCall::new("b", "echo", json!({"x": 1})),
            ],
        ))
        .unwrap();
    let turn_id = handle.turn_id().clone();
    // Wait until `a` runs (its start is committed: before_execution).
    for _ in 0..200 {
        if engine.active_turns()[0].calls[0].state == toolwarden_core::protocol::CallState::Running
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    engine
        .store_caught_up(Duration::from_secs(5))
        .await
        .unwrap();
    // The process "dies": its store stops writing with the call still running.
    store.close().await;
    handle.detach();

    let store = open(&path);
    assert_eq!(store.interrupted(), 1);
    let page = store
        .calls(AuditQuery {
            turn: Some(turn_id.clone()),
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    let statuses: Vec<_> = page
        .calls
        .iter()
        .map(|c| (c.call_id.as_str().to_owned(), c.status.clone()))
        .collect();
    assert_eq!(
        statuses,
        vec![
            ("b".into(), Some("ok".into())),
            ("a".into(), Some("interrupted".into()))
        ]
    );
    let a = &page.calls[1];
    let result: Value = serde_json::from_str(a.events.last().unwrap().body.get()).unwrap();
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["outcome"]["status"], "interrupted");
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("[INTERRUPTED]")
    );
    let turn = store.turn(turn_id).await.unwrap().unwrap();
    assert_eq!(
        (turn.state, turn.outcome.as_deref()),
        (TurnRunState::Ended, Some("interrupted"))
    );
    let results: Value = serde_json::from_str(turn.results.unwrap().get()).unwrap();
    assert_eq!(results[0]["outcome"]["status"], "interrupted");
    assert_eq!(results[1]["outcome"]["status"], "ok");
    // Opening again finds nothing more to recover.
    store.close().await;
    drop(store);
    assert_eq!(open(&path).interrupted(), 0);
}

struct Passive;

impl Interactor for Passive {
    fn name(&self) -> &str {
        "http"
    }
    fn can_answer(&self, _: &Interaction) -> bool {
        true
    }
    fn present(&self, _: &Interaction, _: AnswerSender) {}
}

/// The bytes of the database and its WAL.
fn file_bytes(path: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(path).unwrap_or_default();
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    bytes.extend(std::fs::read(PathBuf::from(wal)).unwrap_or_default());
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test]
async fn a_password_answer_and_an_api_key_input_never_reach_the_file() {
    let tmp = dir();
    let path = tmp.path().join("audit.db");
    let store = open(&path);
    let engine = engine(store.clone());
    engine.interactions().attach(Arc::new(Passive));
    let asker = {
        let interactions = engine.interactions().clone();
        tokio::spawn(async move {
            interactions
                .ask(
                    InteractionRequest {
                        kind: InteractionKind::Password,
                        message: "DB password?".into(),
                        scope: Arc::default(),
                        input: None,
                        details: None,
                        timeout: Duration::from_secs(60),
                        default_action: None,
                    },
                    std::future::pending(),
                )
                .await
        })
    };
    let id = loop {
        if let Some(i) = engine.interactions().pending().first() {
            break i.id.clone();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let secret = "hunter2-a-password-answer";
    engine
        .interactions()
        .answer(
            &id,
            InteractionAnswer {
                value: Some(secret.into()),
                ..InteractionAnswer::approve()
            },
            "http",
        )
        .unwrap();
    asker.await.unwrap().unwrap();
    let key = "sk-an-api-key-input-0123456789";
    engine
        .call(
            "s",
            ToolCall::new(
                "k",
                "check_recorded",
                json!({"api_key": key, "nested": {"Authorization": key}}),
            ),
        )
        .await;
    engine
        .store_caught_up(Duration::from_secs(5))
        .await
        .unwrap();
    let bytes = file_bytes(&path);
    assert!(
        contains(&bytes, "interaction_answered"),
        "the answer is recorded"
    );
    assert!(
        contains(&bytes, "[MASKED]"),
        "the input is recorded, masked"
    );
    assert!(
        !contains(&bytes, secret),
        "the password answer is in the file"
    );
    assert!(!contains(&bytes, key), "the api_key is in the file");
    store.close().await;
    let bytes = file_bytes(&path);
    assert!(!contains(&bytes, secret) && !contains(&bytes, key));
}

// On two worker threads, as the binary runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_write_runs_no_backend_says_so_and_loses_nothing() {
    let tmp = dir();
    let path = tmp.path().join("audit.db");
    let store = open(&path);
    let engine = engine(store.clone());
    engine
        .call("s", ToolCall::new("before", "echo", json!({})))
        .await;
    engine
        .store_caught_up(Duration::from_secs(5))
        .await
        .unwrap();

    // Another connection holds the database's write lock.
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let r = engine
        .call("s", ToolCall::new("blocked", "check_recorded", json!({})))
        .await;
    assert_eq!(r.outcome.status.name(), "error", "{r:?}");
    assert!(
        r.text().contains("audit trail cannot be written"),
        "{}",
        r.text()
    );
    assert!(matches!(store.health(), StoreHealth::Degraded(_)));

    blocker.execute_batch("COMMIT").unwrap();
    drop(blocker);
    for _ in 0..200 {
        if store.health() == StoreHealth::Ok {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    engine
        .store_caught_up(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(store.health(), StoreHealth::Ok);
    let all = store
        .events(AuditQuery {
            limit: 1000,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    let seqs: Vec<u64> = all.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=engine.events().last_seq()).collect::<Vec<_>>());
    let blocked = store
        .calls(AuditQuery {
            call: Some("blocked".into()),
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(blocked.calls[0].status.as_deref(), Some("error"));
}

fn open_err(path: &Path) -> OpenError {
    SqliteStore::open(StoreOptions::new(path)).unwrap_err()
}

#[tokio::test]
async fn bad_files_are_refused_by_name_and_left_untouched() {
    let tmp = dir();
    // A directory that cannot be created: its parent is a file.
    let blocker = tmp.path().join("file");
    std::fs::write(&blocker, "x").unwrap();
    let e = open_err(&blocker.join("sub").join("audit.db"));
    assert!(matches!(e, OpenError::CreateDir { .. }), "{e}");
    assert!(
        e.to_string().contains(&format!(
            "{}",
            blocker.join("sub").join("audit.db").display()
        )),
        "{e}"
    );

    // Not a database at all.
    let junk = tmp.path().join("junk.db");
    std::fs::write(&junk, "this is not a database, it is a text file\n").unwrap();
    let e = open_err(&junk);
    assert!(matches!(e, OpenError::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains(&junk.display().to_string()), "{e}");
    assert_eq!(
        std::fs::read_to_string(&junk).unwrap(),
        "this is not a database, it is a text file\n"
    );

    // A real trail, damaged in the middle.
    let damaged = tmp.path().join("damaged.db");
    {
        let store = open(&damaged);
        let engine = engine(store.clone());
        for i in 0..200 {
            engine
                .call(
                    "s",
                    ToolCall::new(
                        format!("c{i}"),
                        "echo",
                        json!({"i": i, "pad": "x".repeat(200)}),
                    ),
                )
                .await;
        }
        store.close().await;
    }
    let mut bytes = std::fs::read(&damaged).unwrap();
    for b in &mut bytes[4096..] {
        *b = 0x5a;
    }
    std::fs::write(&damaged, &bytes).unwrap();
    let e = open_err(&damaged);
    assert!(matches!(e, OpenError::Corrupt { .. }), "{e}");
    assert!(
        e.to_string().contains(&damaged.display().to_string()),
        "{e}"
    );
    assert_eq!(std::fs::read(&damaged).unwrap(), bytes, "untouched");
    let read = AuditReader::open(&damaged).and_then(|r| {
        r.events(&AuditQuery {
            limit: 1000,
            ..AuditQuery::default()
        })
    });
    assert!(
        matches!(read, Err(OpenError::Corrupt { .. })),
        "{:?}",
        read.err()
    );

    // Written by a newer toolwarden.
    let newer = tmp.path().join("newer.db");
    {
        let store = open(&newer);
        store.close().await;
    }
    let conn = rusqlite::Connection::open(&newer).unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    let before = std::fs::read(&newer).unwrap();
    let e = open_err(&newer);
    assert!(matches!(e, OpenError::Newer { found: 99, .. }), "{e}");
    assert!(e.to_string().contains(&newer.display().to_string()), "{e}");
    assert_eq!(std::fs::read(&newer).unwrap(), before, "untouched");
    assert!(matches!(
        AuditReader::open(&newer),
        Err(OpenError::Newer { .. })
    ));

    // In use by another writer.
    let used = tmp.path().join("used.db");
    let first = open(&used);
    let e = open_err(&used);
    assert!(matches!(e, OpenError::InUse { pid: Some(_), .. }), "{e}");
    first.close().await;

    // Missing, for a reader.
    assert!(matches!(
        AuditReader::open(&tmp.path().join("none.db")),
        Err(OpenError::Missing { .. })
    ));
}

#[tokio::test]
async fn async_durability_does_not_wait_and_still_stores_everything() {
    let tmp = dir();
    let path = tmp.path().join("audit.db");
    let store = Arc::new(
        SqliteStore::open(StoreOptions {
            durability: StoreDurability::Async,
            ..StoreOptions::new(&path)
        })
        .unwrap(),
    );
    let engine = engine(store.clone());
    for i in 0..50 {
        engine
            .call("s", ToolCall::new(format!("c{i}"), "echo", json!({"i": i})))
            .await;
    }
    engine
        .store_caught_up(Duration::from_secs(5))
        .await
        .unwrap();
    let calls = store
        .calls(AuditQuery {
            status: Some("ok".into()),
            limit: 1000,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(calls.calls.len(), 50);
}
