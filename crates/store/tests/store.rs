//! The audit trail under a real engine: what is stored, when, what survives a crash, what is never
//! written, and how bad files are refused. Every scenario that is not about SQLite's file runs
//! twice, on SQLite and on PostgreSQL (`NAME::sqlite`, `NAME::postgres`): one suite, two
//! backends. PostgreSQL tests each use a schema of their own (see `toolwarden_testkit::pg`).

// clippy's allow-unwrap-in-tests covers #[test] functions only, not this file's helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use toolwarden_core::interaction::{InteractionRequest, Interactor};
use toolwarden_core::protocol::{
    AuditQuery, Interaction, InteractionAnswer, InteractionKind, StoreDurability, TaskRecord,
    Timestamp, ToolCall, TurnId, TurnRunState,
};
use toolwarden_core::protocol::{Principal, Scopes};
use toolwarden_core::{
    AnswerSender, AuditStore, Engine, InProcessTool, StoreHealth, ToolError, TurnRequest,
};
use toolwarden_store::{AuditReader, OpenError, Opened, SqliteStore, StoreOptions, TrailReader};
use toolwarden_testkit::pg::TestSchema;

fn dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("toolwarden-store-")
        .tempdir()
        .unwrap()
}

/// Where a test's trail lives: an SQLite file in a temporary directory, or a PostgreSQL schema.
enum Trail {
    Sqlite {
        _dir: tempfile::TempDir,
        path: PathBuf,
    },
    Postgres {
        schema: TestSchema,
        /// The URL the store connects to (the schema's, or a proxy's in front of it).
        url: String,
    },
}

impl Trail {
    fn sqlite() -> Trail {
        let dir = dir();
        let path = dir.path().join("audit.db");
        Trail::Sqlite { _dir: dir, path }
    }

    fn postgres() -> Trail {
        let schema = TestSchema::new();
        let url = schema.url().to_owned();
        Trail::Postgres { schema, url }
    }

    fn options(&self) -> StoreOptions {
        self.options_as("replica-a")
    }

    fn options_as(&self, replica: &str) -> StoreOptions {
        match self {
            Trail::Sqlite { path, .. } => StoreOptions::new(path),
            Trail::Postgres { url, .. } => StoreOptions::postgres(url.as_str(), replica),
        }
    }

    fn open_with(&self, options: StoreOptions) -> Opened {
        toolwarden_store::open(options).unwrap()
    }

    fn open(&self) -> Opened {
        self.open_with(self.options())
    }

    fn reader(&self) -> TrailReader {
        TrailReader::open(&self.options()).unwrap()
    }

    fn events(&self, query: AuditQuery) -> Vec<Value> {
        self.reader()
            .events(&query)
            .unwrap()
            .events
            .iter()
            .map(|e| serde_json::from_str(e.body.get()).unwrap())
            .collect()
    }

    /// Everything the database holds, as bytes: the SQLite file and its WAL, or every row of
    /// the trail's tables as text.
    fn contents(&self) -> Vec<u8> {
        match self {
            Trail::Sqlite { path, .. } => file_bytes(path),
            Trail::Postgres { schema, .. } => schema
                .query(
                    "SELECT string_agg(t::text, ' ') FROM toolwarden_events t UNION ALL \
                     SELECT string_agg(t::text, ' ') FROM toolwarden_calls t UNION ALL \
                     SELECT string_agg(t::text, ' ') FROM toolwarden_turns t",
                )
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" ")
                .into_bytes(),
        }
    }
}

/// Runs scenario `$name(Trail)` once per backend, as `$name::sqlite` and `$name::postgres`.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            // On two worker threads, as the binary runs.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(super::Trail::sqlite()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(super::Trail::postgres()).await;
            }
        }
    )*};
}

both_backends!(
    every_event_is_stored_in_order_and_seq_goes_on_after_a_restart,
    with_before_execution_a_tool_runs_only_once_its_start_is_committed,
    reads_filter_and_page_events_calls_and_turns,
    a_call_left_running_by_a_dead_process_is_recorded_interrupted_on_the_next_open,
    a_password_answer_and_an_api_key_input_never_reach_the_database,
    async_durability_does_not_wait_and_still_stores_everything,
    commits_are_counted_and_parallel_calls_share_them,
    a_task_is_kept_with_its_turn_across_a_restart_and_pruned_after_its_ttl,
    a_turn_id_used_again_continues_its_turn_and_its_calls,
    every_record_names_its_principal_and_reads_filter_by_it,
);

fn open(path: &Path) -> Arc<SqliteStore> {
    open_options(StoreOptions::new(path))
}

fn open_options(options: StoreOptions) -> Arc<SqliteStore> {
    Arc::new(SqliteStore::open(options).unwrap())
}

/// A store that moves nothing into the database unless a read asks (or it closes): its
/// commits stay in its pending files.
fn open_holding(path: &Path) -> Arc<SqliteStore> {
    open_options(StoreOptions {
        apply_after: Duration::from_secs(3600),
        ..StoreOptions::new(path)
    })
}

/// Waits until everything `engine` recorded is committed.
async fn caught_up(engine: &Engine) {
    engine
        .store_caught_up(Duration::from_secs(5))
        .await
        .unwrap();
}

/// An engine recording into `store`, with `echo`, `hang` and `check_recorded` (which reads the
/// trail itself to see whether its own `tool_start` was committed before it ran).
fn engine(store: Arc<dyn AuditStore>) -> Engine {
    let reads = store.clone();
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
            let reads = reads.clone();
            async move {
                // Everything appended so far, made readable (SQLite keeps its latest commits in
                // a pending file until a read asks or their time comes).
                reads
                    .readable(None)
                    .await
                    .map_err(|e| ToolError::new(e.to_string()))?;
                let page = reads
                    .events(AuditQuery {
                        turn: Some(ctx.meta().turn_id.clone()),
                        kind: Some("tool_start".into()),
                        ..AuditQuery::default()
                    })
                    .await
                    .map_err(|e| ToolError::new(e.to_string()))?;
                Ok::<_, ToolError>(format!("{}", page.events.len()))
            }
        },
    ));
    engine
}

async fn every_event_is_stored_in_order_and_seq_goes_on_after_a_restart(trail: Trail) {
    let store = trail.open().store;
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
    caught_up(&engine).await;
    let last = engine.events().last_seq();
    store.close().await;
    drop(engine);
    drop(store);
    let all = trail.events(AuditQuery {
        limit: 1000,
        ..AuditQuery::default()
    });
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

    let store = trail.open().store;
    assert_eq!(store.last_seq(), last);
    let engine = self::engine(store.clone());
    engine
        .call("s1", ToolCall::new("again", "echo", json!({})))
        .await;
    caught_up(&engine).await;
    let page = store
        .events(AuditQuery {
            after: Some(last),
            own: true,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(page.events.first().map(|e| e.seq), Some(last + 1));
    assert_eq!(page.events.len(), 4);
}

async fn with_before_execution_a_tool_runs_only_once_its_start_is_committed(trail: Trail) {
    let engine = engine(trail.open().store);
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

/// A caller may choose its turn ids: a turn id used again continues the same turn, and a call id
/// used again in it the same call, each run's events found under them.
async fn a_turn_id_used_again_continues_its_turn_and_its_calls(trail: Trail) {
    let store = trail.open().store;
    let engine = engine(store.clone());
    for i in 0..2 {
        let mut req = toolwarden_core::TurnRequest::new(
            "s",
            vec![ToolCall::new("c1", "echo", json!({"run": i}))],
        );
        req.turn_id = Some(TurnId::new("t-again"));
        let out = engine.run_turn(req).await.unwrap();
        assert_eq!(out.results[0].text(), format!("{{\"run\":{i}}}"));
    }
    caught_up(&engine).await;
    let calls = store
        .calls(AuditQuery {
            turn: Some("t-again".into()),
            ..AuditQuery::default()
        })
        .await
        .unwrap()
        .calls;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].call_id.as_str(), "c1");
    assert_eq!(calls[0].status.as_deref(), Some("ok"));
    let events = trail.events(AuditQuery {
        turn: Some("t-again".into()),
        ..AuditQuery::default()
    });
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "turn_start",
            "tool_start",
            "tool_result",
            "turn_end",
            "turn_start",
            "tool_start",
            "tool_result",
            "turn_end"
        ]
    );
    assert_eq!(events[6]["content"][0]["text"], json!("{\"run\":1}"));
    let turn = store.turn(TurnId::new("t-again")).await.unwrap().unwrap();
    assert_eq!(turn.state, TurnRunState::Ended);
}

async fn reads_filter_and_page_events_calls_and_turns(trail: Trail) {
    let store = trail.open().store;
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
    caught_up(&engine).await;

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

async fn a_call_left_running_by_a_dead_process_is_recorded_interrupted_on_the_next_open(
    trail: Trail,
) {
    let store = trail.open().store;
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
    // ... and `b` has ended, its result committed.
    for _ in 0..500 {
        let ended = store
            .calls(AuditQuery {
                call: Some("b".into()),
                status: Some("ok".into()),
                ..AuditQuery::default()
            })
            .await
            .unwrap();
        if !ended.calls.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    caught_up(&engine).await;
    // The process "dies": its store stops writing with the call still running.
    store.close().await;
    handle.detach();

    let opened = trail.open();
    assert_eq!(opened.interrupted, 1);
    let store = opened.store;
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
    assert_eq!(trail.open().interrupted, 0);
}

/// Copies the store at `from` (database, WAL, pending file) to `to`, as a process that dies now
/// leaves it.
fn copy_store(from: &Path, to: &Path) {
    for suffix in ["", "-wal", ".pending", ".pending.2"] {
        let name = |p: &Path| {
            let mut n = p.as_os_str().to_owned();
            n.push(suffix);
            PathBuf::from(n)
        };
        if name(from).exists() {
            std::fs::copy(name(from), name(to)).unwrap();
        }
    }
}

/// The two pending files (commits go to one while the other's records are moved into the
/// database).
fn pending_files(path: &Path) -> [PathBuf; 2] {
    [".pending", ".pending.2"].map(|suffix| {
        let mut n = path.as_os_str().to_owned();
        n.push(suffix);
        PathBuf::from(n)
    })
}

/// How many bytes wait in the pending files.
fn pending_bytes(path: &Path) -> u64 {
    pending_files(path)
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum()
}

/// Events committed to the pending file and not yet moved into the database when the process
/// dies are in the trail once it opens again (and for `toolwarden audit` before that), the call
/// that was running recorded `interrupted`; a damaged pending file gives up its records before
/// the damage and is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_in_the_pending_file_when_the_process_dies_are_recovered() {
    let tmp = dir();
    let path = tmp.path().join("audit.db");
    let store = open_holding(&path);
    let first = engine(store.clone());
    let turn_id = hanging_turn(&first, "a").await;
    first
        .call("s", ToolCall::new("b", "echo", json!({"x": 1})))
        .await;
    let last = first.events().last_seq();
    store.durable(last).await.unwrap();
    assert!(
        pending_bytes(&path) > 0,
        "the events wait in the pending file"
    );
    // The process dies here: its files as they are.
    let dead = dir();
    let copy = dead.path().join("audit.db");
    copy_store(&path, &copy);
    let reader_copy = dead.path().join("reader.db");
    copy_store(&path, &reader_copy);
    store.close().await;

    // `toolwarden audit` reads them before any writer opens the store.
    let reader = AuditReader::open(&reader_copy).unwrap();
    let calls = reader
        .calls(&AuditQuery {
            call: Some("b".into()),
            ..AuditQuery::default()
        })
        .unwrap();
    assert_eq!(calls.calls[0].status.as_deref(), Some("ok"));
    assert_eq!(pending_bytes(&reader_copy), 0);

    let reopened = SqliteStore::open(StoreOptions::new(&copy)).unwrap();
    assert_eq!(reopened.interrupted(), 1);
    let seqs: Vec<u64> = stored_seqs(&reopened)
        .await
        .into_iter()
        .take_while(|s| *s <= last)
        .collect();
    assert_eq!(
        seqs,
        (1..=last).collect::<Vec<_>>(),
        "nothing committed is missing"
    );
    assert_eq!(
        status_of(&(Arc::new(reopened) as Arc<dyn AuditStore>), &turn_id)
            .await
            .as_deref(),
        Some("interrupted")
    );

    // Damage in the middle of a pending file: the records before it are recovered, the file kept.
    let damaged = tmp.path().join("damaged.db");
    let store = open_holding(&damaged);
    let engine2 = engine(store.clone());
    for i in 0..3 {
        engine2
            .call("s", ToolCall::new(format!("d{i}"), "echo", json!({"i": i})))
            .await;
    }
    store.durable(engine2.events().last_seq()).await.unwrap();
    let left = dir();
    let copy = left.path().join("audit.db");
    copy_store(&damaged, &copy);
    store.close().await;
    // Nothing was read from this store: its commits are all in the first file.
    let [pending, _] = pending_files(&copy);
    let mut bytes = std::fs::read(&pending).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&pending, &bytes).unwrap();
    let reopened = SqliteStore::open(StoreOptions::new(&copy)).unwrap();
    let mut kept = pending.into_os_string();
    kept.push(".damaged");
    assert_eq!(
        std::fs::read(PathBuf::from(kept)).unwrap(),
        bytes,
        "kept as it was"
    );
    assert_eq!(
        call_status(&reopened, "d0").await.as_deref(),
        Some("ok"),
        "recovered before the damage"
    );
}

/// A process that dies while one pending file's records are being moved into the database and
/// newer commits wait in the other: both are replayed, the older first whichever file holds it,
/// and records the database already has are skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_pending_files_are_replayed_in_seq_order() {
    let tmp = dir();
    let path = tmp.path().join("audit.db");
    let store = open_holding(&path);
    let engine = engine(store.clone());
    for id in ["c0", "c1"] {
        engine.call("s", ToolCall::new(id, "echo", json!({}))).await;
    }
    store.durable(engine.events().last_seq()).await.unwrap();
    // Before: c0 and c1 only in the first pending file.
    let before = dir();
    copy_store(&path, &before.path().join("audit.db"));
    // A read moves them into the database; c2 is committed to the other file.
    caught_up(&engine).await;
    let _ = stored_seqs(&*store).await;
    engine
        .call("s", ToolCall::new("c2", "echo", json!({})))
        .await;
    let last = engine.events().last_seq();
    store.durable(last).await.unwrap();
    let after = dir();
    copy_store(&path, &after.path().join("audit.db"));
    store.close().await;
    let [first, second] = pending_files(&before.path().join("audit.db"));
    let older = std::fs::read(first).unwrap();
    assert!(!older.is_empty() && std::fs::read(second).unwrap().is_empty());
    let [first, second] = pending_files(&after.path().join("audit.db"));
    assert!(std::fs::read(&first).unwrap().is_empty());
    let newer = std::fs::read(second).unwrap();
    assert!(!newer.is_empty());

    for (database, older_in, newer_in, what) in [
        // Died before the transaction moving c0 and c1 committed: the database lacks them.
        (&before, 1, 0, "the older file not yet in the database"),
        // Died after it, before the file was emptied: the database has them.
        (&after, 1, 0, "the older file already in the database"),
        (&before, 0, 1, "the files the other way round"),
    ] {
        let dead = dir();
        let copy = dead.path().join("audit.db");
        copy_store(&database.path().join("audit.db"), &copy);
        let files = pending_files(&copy);
        std::fs::write(&files[older_in], &older).unwrap();
        std::fs::write(&files[newer_in], &newer).unwrap();
        let reopened = SqliteStore::open(StoreOptions::new(&copy)).unwrap();
        assert_eq!(
            stored_seqs(&reopened).await,
            (1..=last).collect::<Vec<_>>(),
            "{what}"
        );
        for id in ["c0", "c1", "c2"] {
            assert_eq!(
                call_status(&reopened, id).await.as_deref(),
                Some("ok"),
                "{what}: {id}"
            );
        }
        assert_eq!(pending_bytes(&copy), 0, "{what}");
    }
}

/// A read made right after a call answered sees the call with its outcome: the events nobody
/// waited for (its result, its turn's end; with `async`, all of them), still queued for the
/// writer's next commit, are committed and made readable for the read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_right_after_a_call_sees_its_outcome() {
    let tmp = dir();
    let store = open_options(StoreOptions {
        durability: StoreDurability::Async,
        ..StoreOptions::new(tmp.path().join("audit.db"))
    });
    let engine = engine(store.clone());
    for i in 0..20 {
        let id = format!("r{i}");
        let r = engine
            .call("s", ToolCall::new(id.clone(), "echo", json!({"i": i})))
            .await;
        assert_eq!(r.outcome.status.name(), "ok");
        store.readable(None).await.unwrap();
        assert_eq!(
            call_status(&*store, &id).await.as_deref(),
            Some("ok"),
            "call {id}"
        );
    }
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
    for suffix in ["-wal", ".pending", ".pending.2"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        bytes.extend(std::fs::read(PathBuf::from(name)).unwrap_or_default());
    }
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

async fn a_password_answer_and_an_api_key_input_never_reach_the_database(trail: Trail) {
    let store = trail.open().store;
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
    caught_up(&engine).await;
    let bytes = trail.contents();
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
    let bytes = trail.contents();
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
    caught_up(&engine).await;

    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = ran.clone();
    engine.register(InProcessTool::new(
        "count",
        "Counts its runs",
        json!({"type": "object"}),
        move |_input, _ctx| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<_, ToolError>("counted") }
        },
    ));

    // Another connection holds the database's write lock. A call's start still commits (to the
    // pending file), but moving it into the database fails: the store is degraded.
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let r = engine
        .call("s", ToolCall::new("first", "echo", json!({})))
        .await;
    assert_eq!(r.outcome.status.name(), "ok", "{r:?}");
    for _ in 0..200 {
        if store.health() != StoreHealth::Ok {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(matches!(store.health(), StoreHealth::Degraded(_)));
    // From then on a call is not started: its backend never runs.
    let r = engine
        .call("s", ToolCall::new("blocked", "count", json!({})))
        .await;
    assert_eq!(r.outcome.status.name(), "error", "{r:?}");
    assert!(
        r.text().contains("audit trail cannot be written")
            && r.text().contains("the call was not started"),
        "{}",
        r.text()
    );
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 0);

    blocker.execute_batch("COMMIT").unwrap();
    drop(blocker);
    for _ in 0..200 {
        if store.health() == StoreHealth::Ok {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    caught_up(&engine).await;
    assert_eq!(store.health(), StoreHealth::Ok);
    assert_eq!(
        stored_seqs(&*store).await,
        (1..=engine.events().last_seq()).collect::<Vec<_>>()
    );
    assert_eq!(call_status(&*store, "first").await.as_deref(), Some("ok"));
    assert_eq!(
        call_status(&*store, "blocked").await.as_deref(),
        Some("error")
    );
}

/// The `seq`s of the trail's first thousand events, in order.
async fn stored_seqs(store: &dyn AuditStore) -> Vec<u64> {
    let page = store
        .events(AuditQuery {
            limit: 1000,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    page.events.iter().map(|e| e.seq).collect()
}

/// The status of the (first) call of that id in the trail.
async fn call_status(store: &dyn AuditStore, call_id: &str) -> Option<String> {
    let page = store
        .calls(AuditQuery {
            call: Some(call_id.into()),
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    page.calls[0].status.clone()
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

async fn async_durability_does_not_wait_and_still_stores_everything(trail: Trail) {
    let store = trail
        .open_with(StoreOptions {
            durability: StoreDurability::Async,
            ..trail.options()
        })
        .store;
    assert_eq!(store.durability(), StoreDurability::Async);
    let engine = engine(store.clone());
    for i in 0..50 {
        engine
            .call("s", ToolCall::new(format!("c{i}"), "echo", json!({"i": i})))
            .await;
    }
    caught_up(&engine).await;
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

/// The store counts its commits and the events they wrote (`toolwarden_store_commits_total`,
/// `toolwarden_store_events_committed_total`), and a turn's calls running side by side share
/// commits (group commit): the writer takes everything queued since its last commit.
async fn commits_are_counted_and_parallel_calls_share_them(trail: Trail) {
    const CALLS: u64 = 20;
    const PARALLEL: usize = 32;
    for durability in [StoreDurability::BeforeExecution, StoreDurability::Async] {
        let store = trail
            .open_with(StoreOptions {
                durability,
                ..trail.options()
            })
            .store;
        let engine = engine(store.clone());
        let before = store.commits();
        for i in 0..CALLS {
            let result = engine
                .call("s", ToolCall::new(format!("c{i}"), "echo", json!({"i": i})))
                .await;
            assert_eq!(result.outcome.status.name(), "ok", "{result:?}");
        }
        caught_up(&engine).await;
        let after = store.commits();
        let (commits, events) = (after.commits - before.commits, after.events - before.events);
        // Four events a call: turn_start, tool_start, tool_result, turn_end.
        assert_eq!(events, 4 * CALLS, "{durability:?}");
        assert!((1..=events).contains(&commits), "{durability:?}: {commits}");

        let calls = (0..PARALLEL)
            .map(|i| ToolCall::new(format!("p{i}"), "echo", json!({"p": i})))
            .collect();
        let output = engine
            .run_turn(toolwarden_core::TurnRequest::new("s", calls))
            .await
            .unwrap();
        assert_eq!(output.results.len(), PARALLEL);
        caught_up(&engine).await;
        let last = store.commits();
        let (commits, events) = (last.commits - after.commits, last.events - after.events);
        // turn_start, a tool_start and a tool_result per call, turn_end.
        assert_eq!(events, 2 + 2 * PARALLEL as u64, "{durability:?}");
        assert!(
            commits < events,
            "{durability:?}: {commits} commits for {events} events of parallel calls"
        );

        let metrics = engine.metrics_text();
        for line in [
            format!("toolwarden_store_commits_total {}", last.commits),
            format!("toolwarden_store_events_committed_total {}", last.events),
        ] {
            assert!(metrics.contains(&line), "{line} not in {metrics}");
        }
        drop(engine);
        store.close().await;
    }
}

// ---- PostgreSQL only: what sharing one database between replicas brings. ----

/// Starts a turn with one `hang` call and waits until the call runs and its start is committed.
async fn hanging_turn(engine: &Engine, call_id: &str) -> TurnId {
    let handle = engine
        .start_turn(toolwarden_core::TurnRequest::new(
            "s",
            vec![ToolCall::new(call_id, "hang", json!({}))],
        ))
        .unwrap();
    let turn_id = handle.turn_id().clone();
    handle.detach();
    for _ in 0..500 {
        let running = engine.active_turns().iter().any(|t| {
            t.turn_id == turn_id
                && t.calls[0].state == toolwarden_core::protocol::CallState::Running
        });
        if running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    caught_up(engine).await;
    turn_id
}

async fn status_of(store: &Arc<dyn AuditStore>, turn_id: &TurnId) -> Option<String> {
    let page = store
        .calls(AuditQuery {
            turn: Some(turn_id.clone()),
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(page.calls.len(), 1, "{turn_id}");
    page.calls[0].status.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_recovery_closes_only_this_replicas_calls_and_seq_is_per_replica() {
    let trail = Trail::postgres();
    let a = trail.open_with(trail.options_as("a")).store;
    let b = trail.open_with(trail.options_as("b")).store;
    let engine_a = engine(a.clone());
    let engine_b = engine(b.clone());
    let turn_a = hanging_turn(&engine_a, "ha").await;
    let turn_b = hanging_turn(&engine_b, "hb").await;
    for i in 0..3 {
        engine_b
            .call("s", ToolCall::new(format!("e{i}"), "echo", json!({"i": i})))
            .await;
    }
    caught_up(&engine_b).await;

    // Each replica numbers its own events from 1: its own stream resumes by its own seq.
    for (store, engine) in [(&a, &engine_a), (&b, &engine_b)] {
        let own = store
            .events(AuditQuery {
                after: Some(0),
                own: true,
                limit: 1000,
                ..AuditQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(
            own.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (1..=engine.events().last_seq()).collect::<Vec<_>>()
        );
    }
    // The shared trail has both, paged by its own cursor without a miss or a repeat.
    let total = engine_a.events().last_seq() + engine_b.events().last_seq();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = a
            .events(AuditQuery {
                after,
                limit: 3,
                ..AuditQuery::default()
            })
            .await
            .unwrap();
        seen.extend(page.events.iter().map(|e| {
            let v: Value = serde_json::from_str(e.body.get()).unwrap();
            (v["turn_id"].as_str().map(str::to_owned), e.seq)
        }));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen.len() as u64, total, "{seen:?}");
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "no event twice: {seen:?}");

    // A dies with its call running. Another replica starting meanwhile leaves A's call alone.
    a.close().await;
    drop(engine_a);
    drop(a);
    let c = trail.open_with(trail.options_as("c"));
    assert_eq!(c.interrupted, 0);
    assert_eq!(
        status_of(&c.store, &turn_a).await,
        None,
        "A's call is untouched"
    );

    // A starts again with the same id: its call is interrupted; B's call still runs.
    let a = trail.open_with(trail.options_as("a"));
    assert_eq!(a.interrupted, 1);
    assert_eq!(
        status_of(&a.store, &turn_a).await.as_deref(),
        Some("interrupted")
    );
    assert_eq!(status_of(&a.store, &turn_b).await, None, "B's call runs on");
    assert_eq!(
        a.store.turn(turn_b.clone()).await.unwrap().unwrap().state,
        TurnRunState::Running
    );
    // B's call ends normally, and the trail has it.
    engine_b.shutdown(Duration::from_secs(5)).await;
    caught_up(&engine_b).await;
    assert_eq!(
        status_of(&a.store, &turn_b).await.as_deref(),
        Some("cancelled")
    );
    // A second process as replica B while B runs is refused.
    let e = toolwarden_store::open(trail.options_as("b")).unwrap_err();
    assert!(matches!(e, OpenError::ReplicaInUse { .. }), "{e}");
    assert!(e.to_string().contains("\"b\""), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_retain_prunes_rows_older_than_it_on_open() {
    let trail = Trail::postgres();
    let Trail::Postgres { schema, .. } = &trail else {
        unreachable!()
    };
    let store = trail.open().store;
    let engine = engine(store.clone());
    for i in 0..4 {
        engine
            .call("s", ToolCall::new(format!("c{i}"), "echo", json!({})))
            .await;
    }
    caught_up(&engine).await;
    store.close().await;
    drop(engine);
    drop(store);
    // Two of the calls are made 40 days old.
    let day = "86400000::bigint";
    schema.query(&format!(
        "UPDATE toolwarden_events SET ts = ts - 40 * {day} WHERE call_id IN ('c0', 'c1') \
         OR turn_id IN (SELECT turn_id FROM toolwarden_calls WHERE call_id IN ('c0', 'c1')); \
         UPDATE toolwarden_calls SET started_at = started_at - 40 * {day}, \
         ended_at = ended_at - 40 * {day} WHERE call_id IN ('c0', 'c1'); \
         UPDATE toolwarden_turns SET started_at = started_at - 40 * {day}, \
         ended_at = ended_at - 40 * {day} WHERE turn_id IN \
         (SELECT turn_id FROM toolwarden_calls WHERE call_id IN ('c0', 'c1')); SELECT 1"
    ));
    let store = trail.open().store; // retain: 30 days by default
    let calls = store.calls(AuditQuery::default()).await.unwrap();
    let mut left: Vec<_> = calls.calls.iter().map(|c| c.call_id.to_string()).collect();
    left.sort();
    assert_eq!(left, vec!["c2", "c3"]);
    assert_eq!(
        schema.query("SELECT count(*) FROM toolwarden_events"),
        vec![Some("8".to_owned())]
    );
    assert_eq!(
        schema.query("SELECT count(*) FROM toolwarden_turns"),
        vec![Some("2".to_owned())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_bad_databases_are_refused_with_clear_errors() {
    // Nobody listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("postgres://someone:hunter2@127.0.0.1:{port}/x");
    let e = toolwarden_store::open(StoreOptions::postgres(url.as_str(), "a")).unwrap_err();
    assert!(matches!(e, OpenError::Postgres { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&format!("postgres://someone@127.0.0.1:{port}/x")),
        "{text}"
    );
    assert!(
        !text.contains("hunter2"),
        "the password is not shown: {text}"
    );

    // No trail yet, for a reader.
    let trail = Trail::postgres();
    assert!(matches!(
        TrailReader::open(&trail.options()),
        Err(OpenError::PostgresMissing { .. })
    ));

    // Written by a newer toolwarden: refused, untouched.
    let Trail::Postgres { schema, .. } = &trail else {
        unreachable!()
    };
    trail.open().store.close().await;
    schema.query("UPDATE toolwarden_schema SET version = 99; SELECT 1");
    let e = toolwarden_store::open(trail.options()).unwrap_err();
    assert!(
        matches!(e, OpenError::PostgresNewer { found: 99, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("newer toolwarden"), "{e}");
    assert!(matches!(
        TrailReader::open(&trail.options()),
        Err(OpenError::PostgresNewer { .. })
    ));
    assert_eq!(
        schema.query("SELECT version::text FROM toolwarden_schema"),
        vec![Some("99".to_owned())]
    );
}

/// A TCP relay in front of the PostgreSQL server that a test can cut (every connection dropped,
/// new ones refused) and restore: a database that goes away and comes back.
struct Relay {
    port: u16,
    cut: Arc<std::sync::atomic::AtomicBool>,
    dropped: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(target: String) -> Relay {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let dropped = Arc::new(tokio::sync::Notify::new());
        let task = {
            let cut = cut.clone();
            let dropped = dropped.clone();
            tokio::spawn(async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    if cut.load(Ordering::SeqCst) {
                        continue; // dropped at once
                    }
                    let target = target.clone();
                    let dropped = dropped.clone();
                    tokio::spawn(async move {
                        let Ok(mut server) = tokio::net::TcpStream::connect(target).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            () = dropped.notified() => {}
                        }
                    });
                }
            })
        };
        Relay {
            port,
            cut,
            dropped,
            task,
        }
    }

    fn cut(&self, on: bool) {
        self.cut.store(on, std::sync::atomic::Ordering::SeqCst);
        if on {
            self.dropped.notify_waiters();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `url` with its `host:port` replaced by `127.0.0.1:port`; also answers the old `host:port`.
fn through(url: &str, port: u16) -> (String, String) {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (user, rest) = rest.split_once('@').map_or(("", rest), |(u, r)| (u, r));
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let host = &rest[..end];
    let host = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    };
    let at = if user.is_empty() { "" } else { "@" };
    (
        format!("{scheme}://{user}{at}127.0.0.1:{port}{}", &rest[end..]),
        host,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_lost_connection_degrades_the_store_runs_no_backend_and_reconnects() {
    let schema = TestSchema::new();
    let (_, target) = through(schema.url(), 0);
    let relay = Relay::start(target).await;
    let (url, _) = through(schema.url(), relay.port);
    let trail = Trail::Postgres { schema, url };
    let store = trail.open().store;
    let engine = engine(store.clone());
    engine
        .call("s", ToolCall::new("before", "echo", json!({})))
        .await;
    caught_up(&engine).await;

    relay.cut(true);
    let r = engine
        .call("s", ToolCall::new("blocked", "echo", json!({})))
        .await;
    assert_eq!(r.outcome.status.name(), "error", "{r:?}");
    assert!(
        r.text().contains("audit trail cannot be written"),
        "{}",
        r.text()
    );
    assert!(matches!(store.health(), StoreHealth::Degraded(_)));

    relay.cut(false);
    for _ in 0..300 {
        if store.health() == StoreHealth::Ok {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.health(), StoreHealth::Ok, "reconnected");
    caught_up(&engine).await;
    assert_eq!(
        stored_seqs(&*store).await,
        (1..=engine.events().last_seq()).collect::<Vec<_>>()
    );
    let blocked = store
        .calls(AuditQuery {
            call: Some("blocked".into()),
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(blocked.calls[0].status.as_deref(), Some("error"));
}

/// A task toward an MCP client is one row naming its turn: committed when `put_task` resolves,
/// read back by id (also by a new process, after the turn was recovered as interrupted), and
/// deleted once its turn ended more than its `ttl_ms` ago.
async fn a_task_is_kept_with_its_turn_across_a_restart_and_pruned_after_its_ttl(trail: Trail) {
    let store = trail.open().store;
    let engine = engine(store.clone());
    let turn_id = hanging_turn(&engine, "c1").await;
    let task = |id: &str, ttl_ms: u64| TaskRecord {
        task_id: id.to_owned(),
        principal: "local".into(),
        turn_id: turn_id.clone(),
        call_id: "c1".into(),
        session_id: Some("s".into()),
        tool: "hang".to_owned(),
        created_at: Timestamp::from_unix_millis(1_700_000_000_000),
        ttl_ms,
        poll_interval_ms: 1000,
    };
    store.put_task(task("task_kept", 3_600_000)).await.unwrap();
    store.put_task(task("task_brief", 0)).await.unwrap();
    // A task whose turn never reached the trail (toolwarden stopped as it was made), long ago.
    let orphan = TaskRecord {
        turn_id: "turn_never_recorded".into(),
        ..task("task_orphan", 0)
    };
    store.put_task(orphan).await.unwrap();
    assert_eq!(
        store.task("task_kept".into()).await.unwrap(),
        Some(task("task_kept", 3_600_000))
    );
    assert_eq!(store.task("task_nope".into()).await.unwrap(), None);
    // The process dies with the call running.
    store.close().await;
    drop(engine);

    let mut options = trail.options();
    options.retain = Some(Duration::from_secs(3600));
    let opened = trail.open_with(options);
    assert_eq!(opened.interrupted, 1);
    let store = opened.store;
    let kept = store.task("task_kept".into()).await.unwrap().unwrap();
    let turn = store.turn(kept.turn_id.clone()).await.unwrap().unwrap();
    assert_eq!(turn.state, TurnRunState::Ended);
    assert_eq!(turn.outcome.as_deref(), Some("interrupted"));
    // Its turn ended (at recovery) more than 0 ms ago: pruned as the store opened.
    assert_eq!(store.task("task_brief".into()).await.unwrap(), None);
    // No turn, and created more than a day past its ttl: pruned too.
    assert_eq!(store.task("task_orphan".into()).await.unwrap(), None);
    store.close().await;
}

async fn every_record_names_its_principal_and_reads_filter_by_it(trail: Trail) {
    let store = trail.open().store;
    let engine = engine(store.clone());
    let mut turns = Vec::new();
    for (who, session) in [("alice", "s1"), ("bob", "s1"), ("alice", "s2")] {
        let mut req = TurnRequest::new(session, vec![ToolCall::new("c", "echo", json!({}))]);
        req.principal = Principal::new(who, Scopes::all());
        turns.push(engine.run_turn(req).await.unwrap().turn_id);
    }
    engine
        .call("s1", ToolCall::new("c", "echo", json!({})))
        .await;
    // An event about no turn (a server's state), which every principal's live stream shows.
    engine.events().emit(
        &Arc::new(toolwarden_core::EventScope::default()),
        toolwarden_core::protocol::EventKind::ServerState {
            server: "docs".into(),
            state: toolwarden_core::protocol::ServerStateKind::Up,
            detail: None,
        },
    );
    caught_up(&engine).await;

    let calls_of = |who: &str| {
        let page = trail
            .reader()
            .calls(&AuditQuery {
                principal: Some(who.into()),
                ..AuditQuery::default()
            })
            .unwrap();
        let mut turns: Vec<String> = page
            .calls
            .iter()
            .map(|c| {
                assert_eq!(c.principal, who, "{c:?}");
                c.turn_id.to_string()
            })
            .collect();
        turns.sort();
        turns
    };
    let mut alices = vec![turns[0].to_string(), turns[2].to_string()];
    alices.sort();
    assert_eq!(calls_of("alice"), alices);
    assert_eq!(calls_of("bob"), vec![turns[1].to_string()]);
    assert_eq!(
        calls_of("local").len(),
        1,
        "a turn with no principal is local's"
    );
    assert!(calls_of("carol").is_empty());

    // Events: bob's turn's four (turn_start, tool_start, tool_result, turn_end), each naming him.
    let bobs = trail.events(AuditQuery {
        principal: Some("bob".into()),
        ..AuditQuery::default()
    });
    assert_eq!(bobs.len(), 4, "{bobs:#?}");
    assert!(bobs.iter().all(|e| e["principal"] == "bob"), "{bobs:#?}");
    // …and with the events about no turn, as `/v1/events` resumes for him.
    let with_unattributed = trail.events(AuditQuery {
        principal: Some("bob".into()),
        with_unattributed: true,
        ..AuditQuery::default()
    });
    assert_eq!(with_unattributed.len(), 5, "{with_unattributed:#?}");
    assert_eq!(with_unattributed[4]["type"], "server_state");
    // Two principals' `s1` are two sessions: the session filter alone sees both, with the
    // principal filter one.
    let s1_of_alice = trail.events(AuditQuery {
        principal: Some("alice".into()),
        session: Some("s1".into()),
        ..AuditQuery::default()
    });
    assert_eq!(s1_of_alice.len(), 4);
    assert!(
        s1_of_alice
            .iter()
            .all(|e| e["turn_id"] == turns[0].as_str())
    );

    let record = store.turn(turns[1].clone()).await.unwrap().unwrap();
    assert_eq!(&*record.principal, "bob");
}
