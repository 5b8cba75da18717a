use std::sync::Arc;
use std::time::Duration;

use toolwarden_protocol::{DenyReason, QuotaConfig, QuotaPer};

use super::{QuotaFacts, Quotas, Rate};

fn quotas(configs: &[QuotaConfig]) -> Arc<Quotas> {
    Arc::new(Quotas::compile(configs).unwrap().unwrap())
}

fn facts<'a>(tool: &'a str, principal: &'a str) -> QuotaFacts<'a> {
    QuotaFacts {
        tool,
        principal,
        session: "s",
    }
}

#[test]
fn rates_parse_as_count_per_period() {
    let r = |t: &str| Rate::parse(t).unwrap();
    assert_eq!(r("60/min").count, 60);
    assert_eq!(r("60/min").period, Duration::from_secs(60));
    assert_eq!(r("5/s").period, Duration::from_secs(1));
    assert_eq!(r("1000/h").period, Duration::from_secs(3600));
    assert_eq!(r("100/day").period, Duration::from_secs(86_400));
    assert_eq!(r("10/30s").period, Duration::from_secs(30));
    for bad in [
        "5 per minute",
        "5",
        "/min",
        "x/min",
        "5/fortnight",
        "0/min",
        "5/0s",
    ] {
        assert!(Rate::parse(bad).is_err(), "{bad}");
    }
    assert!(
        Rate::parse("5 per minute")
            .unwrap_err()
            .contains("\"60/min\"")
    );
}

#[test]
fn a_quota_needs_a_rate_or_a_concurrency() {
    let e = Quotas::compile(&[QuotaConfig::default()]).unwrap_err();
    assert_eq!(e.key, "rate");
    let e = Quotas::compile(&[QuotaConfig {
        concurrency: Some(0),
        ..Default::default()
    }])
    .unwrap_err();
    assert_eq!(e.key, "concurrency");
}

#[tokio::test(start_paused = true)]
async fn the_sixth_call_of_five_per_minute_waits_twelve_seconds() {
    let q = quotas(&[QuotaConfig {
        rate: Some("5/min".into()),
        ..Default::default()
    }]);
    for _ in 0..5 {
        assert!(
            q.take(&facts("t", "alice"), None, "m", Duration::from_secs(1))
                .await
                .is_ok()
        );
    }
    let refused = q
        .take(&facts("t", "alice"), None, "m", Duration::from_secs(1))
        .await
        .err()
        .unwrap();
    assert_eq!(refused.reason, DenyReason::RateLimit);
    assert_eq!(refused.bucket, "alice");
    assert_eq!(refused.retry_after, Duration::from_secs(12));
    // Another principal has its own bucket.
    assert!(
        q.take(&facts("t", "bob"), None, "m", Duration::from_secs(1))
            .await
            .is_ok()
    );
    // A token comes back after 12 s.
    tokio::time::advance(Duration::from_secs(12)).await;
    assert!(
        q.take(&facts("t", "alice"), None, "m", Duration::from_secs(1))
            .await
            .is_ok()
    );
    assert!(
        q.take(&facts("t", "alice"), None, "m", Duration::from_secs(1))
            .await
            .is_err()
    );
}

#[tokio::test(start_paused = true)]
async fn concurrency_is_held_until_the_call_ends_and_a_refusal_takes_nothing() {
    let q = quotas(&[
        QuotaConfig {
            concurrency: Some(1),
            per: Some(QuotaPer::Global),
            ..Default::default()
        },
        QuotaConfig {
            tools: Some(vec!["t".into()]),
            rate: Some("2/min".into()),
            ..Default::default()
        },
    ]);
    let lease = Duration::from_secs(1);
    let held = q.take(&facts("t", "a"), None, "m", lease).await.unwrap();
    let refused = q
        .take(&facts("t", "b"), None, "m", lease)
        .await
        .err()
        .unwrap();
    assert_eq!(refused.reason, DenyReason::Concurrency);
    assert_eq!(refused.bucket, "global");
    drop(held);
    // b's refusal took no token from the rate: it still has two.
    assert!(q.take(&facts("t", "b"), None, "m", lease).await.is_ok());
    assert!(q.take(&facts("t", "b"), None, "m", lease).await.is_ok());
    let refused = q
        .take(&facts("t", "b"), None, "m", lease)
        .await
        .err()
        .unwrap();
    assert_eq!(refused.reason, DenyReason::RateLimit);
    // A tool the rate does not name is held by the concurrency cap alone.
    assert!(q.take(&facts("other", "b"), None, "m", lease).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn full_buckets_are_forgotten_when_sessions_pile_up() {
    let q = quotas(&[QuotaConfig {
        rate: Some("5/min".into()),
        per: Some(QuotaPer::Session),
        ..Default::default()
    }]);
    let lease = Duration::from_secs(1);
    for i in 0..=super::EVICT_AT {
        let session = format!("s{i}");
        let facts = QuotaFacts {
            tool: "t",
            principal: "p",
            session: &session,
        };
        assert!(q.take(&facts, None, "m", lease).await.is_ok());
    }
    // A minute on, every bucket is full again: the next call forgets them.
    tokio::time::advance(Duration::from_secs(60)).await;
    let facts = QuotaFacts {
        tool: "t",
        principal: "p",
        session: "new",
    };
    assert!(q.take(&facts, None, "m", lease).await.is_ok());
    assert!(q.buckets.lock().len() <= 1, "{}", q.buckets.lock().len());
}

/// With shared state: the shared buckets decide, and a concurrency place is renewed while held
/// and given back when dropped. Away: each limit is this replica's share — divided by the live
/// replicas last counted, rounded up — never no limit.
#[tokio::test(start_paused = true)]
async fn shared_state_decides_and_when_away_each_replica_keeps_its_share() {
    use crate::shared::SharedState;
    use crate::shared::fake::FakeShared;

    let q = quotas(&[QuotaConfig {
        rate: Some("5/min".into()),
        concurrency: Some(3),
        per: Some(QuotaPer::Global),
        ..Default::default()
    }]);
    let fake = std::sync::Arc::new(FakeShared::new(3));
    let shared: std::sync::Arc<dyn SharedState> = fake.clone();
    let lease = Duration::from_secs(2);
    let held = q
        .take(&facts("t", "a"), Some(&shared), "t1/c1", lease)
        .await
        .unwrap();
    {
        let takes = fake.takes.lock().unwrap();
        assert_eq!(takes.len(), 1);
        assert_eq!(takes[0].0[0].bucket, "0:global");
        assert_eq!(takes[0].1, "t1/c1");
    }
    // Renewed every half lease while held, given back when dropped.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    drop(held);
    let writes = fake.writes.lock().unwrap().clone();
    assert_eq!(
        writes.iter().map(|w| w.0).collect::<Vec<_>>(),
        ["renew", "renew", "release"],
        "{writes:?}"
    );

    // Redis away: 5/min over 3 replicas is 2 here, 3 at once is 1.
    *fake.up.lock().unwrap() = false;
    let first = q
        .take(&facts("t", "a"), Some(&shared), "t2/c1", lease)
        .await
        .unwrap();
    let refused = q
        .take(&facts("t", "a"), Some(&shared), "t3/c1", lease)
        .await
        .err()
        .unwrap();
    assert_eq!(refused.reason, DenyReason::Concurrency);
    drop(first);
    assert!(
        q.take(&facts("t", "a"), Some(&shared), "t4/c1", lease)
            .await
            .is_ok()
    );
    let refused = q
        .take(&facts("t", "a"), Some(&shared), "t5/c1", lease)
        .await
        .err()
        .unwrap();
    assert_eq!(refused.reason, DenyReason::RateLimit);
}
