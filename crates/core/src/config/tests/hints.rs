//! Per-call deadline hints, clamped by `max_timeout`.

use pretty_assertions::assert_eq;

use super::*;

// Per-call hints (docs/GOVERNANCE.md, "Deadlines")

#[test]
fn hints_replace_deadlines_within_max_timeout() {
    let base = Policy {
        timeout: secs(120),
        idle_timeout: secs(30),
        attempt_timeout: secs(60),
        max_timeout: secs(600),
        ..Policy::default()
    };
    type Hints = (Option<u64>, Option<u64>);
    type Deadlines = (Duration, Duration, Duration);
    // (timeout_ms, idle_timeout_ms) → (timeout, idle, attempt)
    let cases: Vec<(Hints, Deadlines)> = vec![
        ((None, None), (secs(120), secs(30), secs(60))),
        ((Some(300_000), None), (secs(300), secs(30), secs(60))),
        ((Some(3_600_000), None), (secs(600), secs(30), secs(60))),
        // 0 asks for no cap: max_timeout still caps it.
        ((Some(0), None), (secs(600), secs(30), secs(60))),
        ((Some(10_000), None), (secs(10), secs(10), secs(10))),
        ((None, Some(5_000)), (secs(120), secs(5), secs(60))),
        ((None, Some(200_000)), (secs(120), secs(120), secs(60))),
        ((None, Some(0)), (secs(120), Duration::ZERO, secs(60))),
        ((Some(20_000), Some(90_000)), (secs(20), secs(20), secs(20))),
    ];
    let got: Vec<_> = cases
        .iter()
        .map(|(hint, _)| {
            let p = apply_hints(&base, hint.0, hint.1);
            (*hint, (p.timeout, p.idle_timeout, p.attempt_timeout))
        })
        .collect();
    assert_eq!(got, cases);

    // max_timeout = 0: no ceiling, and a hint of 0 means no cap at all.
    let open = Policy {
        max_timeout: Duration::ZERO,
        ..base
    };
    let p = apply_hints(&open, Some(0), None);
    assert_eq!(
        (p.timeout, p.idle_timeout, p.attempt_timeout),
        (Duration::ZERO, secs(30), secs(60))
    );
    let p = apply_hints(&open, Some(7_200_000), None);
    assert_eq!(p.timeout, secs(7200));
}

fn any_policy() -> impl Strategy<Value = Policy> {
    let d = || prop_oneof![Just(0u64), 1u64..10_000_000];
    (d(), d(), d(), d()).prop_map(|(timeout, idle, attempt, max)| Policy {
        timeout: ms(timeout),
        idle_timeout: ms(idle),
        attempt_timeout: ms(attempt),
        max_timeout: ms(max),
        ..Policy::default()
    })
}

proptest! {
    #[test]
    fn hints_never_break_the_invariants(
        policy in any_policy(),
        timeout_ms in proptest::option::of(prop_oneof![Just(0u64), 1u64..100_000_000]),
        idle_ms in proptest::option::of(prop_oneof![Just(0u64), 1u64..100_000_000]),
    ) {
        let p = apply_hints(&policy, timeout_ms, idle_ms);
        if !p.timeout.is_zero() {
            prop_assert!(p.idle_timeout <= p.timeout, "idle {:?} > total {:?}", p.idle_timeout, p.timeout);
            prop_assert!(p.attempt_timeout <= p.timeout, "attempt {:?} > total {:?}", p.attempt_timeout, p.timeout);
        }
        if timeout_ms.is_some() && !p.max_timeout.is_zero() {
            prop_assert!(!p.timeout.is_zero(), "a hinted call is uncapped despite max_timeout");
            prop_assert!(p.timeout <= p.max_timeout, "total {:?} > max {:?}", p.timeout, p.max_timeout);
        }
        if idle_ms.is_some() && !p.max_timeout.is_zero() {
            prop_assert!(p.idle_timeout <= p.max_timeout);
        }
    }
}
