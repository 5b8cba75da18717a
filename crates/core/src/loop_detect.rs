//! The loop detector: identical calls (same tool, same canonical input) in one session are
//! annotated from `warn_after` on and denied from `block_after` on.

use crate::maps::{CallDigest, DigestMap};

use parking_lot::Mutex;
use toolwarden_protocol::LoopPolicy;

/// The detector's verdict on one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LoopVerdict {
    /// Not (yet) a loop.
    Fine,
    /// The `count`th identical call: run it, but say so in its result.
    Warn { count: u32 },
    /// The `count`th identical call: deny it.
    Block { count: u32 },
}

/// How many distinct calls a session remembers before it forgets them all; a session this varied
/// is not looping.
const MAX_REMEMBERED: usize = 10_000;

/// One session's memory of its calls.
#[derive(Default)]
pub(crate) struct LoopDetector {
    seen: Mutex<DigestMap<u32>>,
}

impl LoopDetector {
    /// Counts one call and judges it.
    pub(crate) fn observe(&self, policy: &LoopPolicy, call_digest: &CallDigest) -> LoopVerdict {
        if policy.warn_after == 0 && policy.block_after == 0 {
            return LoopVerdict::Fine;
        }
        let mut seen = self.seen.lock();
        if seen.len() >= MAX_REMEMBERED {
            seen.clear();
        }
        let count = seen.entry(*call_digest).or_insert(0);
        *count = count.saturating_add(1);
        let count = *count;
        if policy.block_after > 0 && count >= policy.block_after {
            LoopVerdict::Block { count }
        } else if policy.warn_after > 0 && count >= policy.warn_after {
            LoopVerdict::Warn { count }
        } else {
            LoopVerdict::Fine
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotates_from_the_third_and_denies_from_the_fifth() {
        let d = LoopDetector::default();
        let p = LoopPolicy::default();
        let verdicts: Vec<LoopVerdict> = (0..6).map(|_| d.observe(&p, &CallDigest([1; 32]))).collect();
        assert_eq!(
            verdicts,
            vec![
                LoopVerdict::Fine,
                LoopVerdict::Fine,
                LoopVerdict::Warn { count: 3 },
                LoopVerdict::Warn { count: 4 },
                LoopVerdict::Block { count: 5 },
                LoopVerdict::Block { count: 6 },
            ]
        );
        assert_eq!(
            d.observe(&p, &CallDigest([2; 32])),
            LoopVerdict::Fine,
            "another input is another call"
        );
    }

    #[test]
    fn zero_turns_it_off() {
        let d = LoopDetector::default();
        let p = LoopPolicy {
            warn_after: 0,
            block_after: 0,
        };
        for _ in 0..10 {
            assert_eq!(d.observe(&p, &CallDigest([1; 32])), LoopVerdict::Fine);
        }
    }
}
