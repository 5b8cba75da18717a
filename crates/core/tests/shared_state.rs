//! The engine against a replica's shared state, without Redis (`shared::fake::FakeShared`, the
//! `fakes` feature): a cacheable call leads, follows another replica's run or takes its
//! result, and when the shared state is away the cache and the loop detector go on with this
//! replica's own state (docs/SCALE-OUT.md, "When Redis is away"). Against a real Redis,
//! crates/toolwarden/tests/scale_out.rs runs two replicas sharing one run, and Redis going away
//! under load.
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

mod common;

use std::sync::Arc;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::json;
use toolwarden_core::shared::fake::FakeShared;
use toolwarden_core::shared::{CacheClaim, SharedState};

const CACHED_ECHO: &str = r#"
[tools.echo]
idempotent = true
cache_ttl = "60s"
"#;

fn with_fake(config: &str, fake: &Arc<FakeShared>) -> Harness {
    let shared: Arc<dyn SharedState> = fake.clone();
    Harness::with(config, move |b| b.shared(shared))
}

fn locked<T: Clone>(m: &std::sync::Mutex<T>) -> T {
    m.lock().unwrap().clone()
}

#[tokio::test(start_paused = true)]
async fn a_leader_runs_the_call_and_puts_its_result_for_the_other_replicas() {
    let fake = Arc::new(FakeShared::new(2));
    let mut h = with_fake(CACHED_ECHO, &fake);
    let r = h.call("c1", "echo", json!({"q": "weather"})).await;
    assert_eq!(r.outcome.status.name(), "ok");
    assert_eq!(h.log.runs("echo"), 1);
    let claimed = locked(&fake.claimed);
    let puts = locked(&fake.puts);
    assert_eq!(claimed.len(), 1, "one claim for one call");
    assert_eq!(puts.len(), 1, "the leader puts its result");
    assert_eq!(puts[0].0, claimed[0], "under the key it claimed");
    assert_eq!(puts[0].2, secs(60), "fresh for the tool's cache_ttl");
    assert!(locked(&fake.released).is_empty());
    // Its own cache serves the same call next, without asking the shared state again.
    let hit = h.call("c2", "echo", json!({"q": "weather"})).await;
    assert!(hit.outcome.provenance.as_ref().unwrap().cache_hit);
    assert_eq!(locked(&fake.claimed).len(), 1);
    assert_eq!(h.log.runs("echo"), 1);
}

#[tokio::test(start_paused = true)]
async fn another_replicas_result_is_served_with_its_provenance_and_the_tool_does_not_run() {
    // What a leader on another replica put.
    let other = Arc::new(FakeShared::new(2));
    let mut leader = with_fake(CACHED_ECHO, &other);
    let original = leader.call("c1", "echo", json!({"q": "weather"})).await;
    let (_, stored, _) = locked(&other.puts).pop().unwrap();

    let fake = Arc::new(FakeShared::new(2));
    fake.script_claims([CacheClaim::Hit {
        value: stored,
        ttl: secs(30),
    }]);
    let mut h = with_fake(CACHED_ECHO, &fake);
    let hit = h.call("c9", "echo", json!({"q": "weather"})).await;
    assert_eq!(h.log.runs("echo"), 0, "served from the other replica's run");
    let provenance = hit.outcome.provenance.clone().unwrap();
    let theirs = original.outcome.provenance.clone().unwrap();
    assert!(provenance.cache_hit);
    assert_eq!(provenance.digest, theirs.digest);
    assert_eq!(
        provenance.fetched_at, theirs.fetched_at,
        "the original's time"
    );
    assert_eq!(hit.structured_content, original.structured_content);
    assert!(locked(&fake.puts).is_empty(), "a follower puts nothing");
}

#[tokio::test(start_paused = true)]
async fn a_follower_waits_while_another_replica_runs_the_call_then_leads_when_it_gave_up() {
    let fake = Arc::new(FakeShared::new(2));
    fake.script_claims([CacheClaim::Follow, CacheClaim::Follow, CacheClaim::Lead]);
    let mut h = with_fake(CACHED_ECHO, &fake);
    let r = h.call("c1", "echo", json!({"q": "weather"})).await;
    assert_eq!(r.outcome.status.name(), "ok");
    assert_eq!(
        locked(&fake.claimed).len(),
        3,
        "it looked again until it could lead"
    );
    assert_eq!(h.log.runs("echo"), 1);
    assert_eq!(locked(&fake.puts).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn with_the_shared_state_away_the_call_runs_here_and_this_replicas_cache_keeps_it() {
    let fake = Arc::new(FakeShared::new(2));
    fake.set_up(false);
    let mut h = with_fake(CACHED_ECHO, &fake);
    let first = h.call("c1", "echo", json!({"q": "weather"})).await;
    assert_eq!(first.outcome.status.name(), "ok");
    assert!(locked(&fake.puts).is_empty(), "nothing shared while away");
    let again = h.call("c2", "echo", json!({"q": "weather"})).await;
    assert!(again.outcome.provenance.as_ref().unwrap().cache_hit);
    assert_eq!(h.log.runs("echo"), 1);
    // Back: the next new call leads and shares again.
    fake.set_up(true);
    h.call("c3", "echo", json!({"q": "rain"})).await;
    assert_eq!(locked(&fake.puts).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn with_the_shared_state_away_the_loop_detector_counts_on_this_replica() {
    let fake = Arc::new(FakeShared::new(2));
    fake.set_up(false);
    let mut h = with_fake("", &fake);
    let mut statuses = Vec::new();
    for n in 1..=6 {
        let r = h.call(&format!("c{n}"), "echo", json!({"q": "same"})).await;
        statuses.push(r.outcome.status.name().to_owned());
    }
    assert_eq!(
        statuses,
        ["ok", "ok", "ok", "ok", "denied", "denied"],
        "denied from the 5th identical call in a row, as without shared state"
    );
    assert_eq!(h.log.runs("echo"), 4);
}
