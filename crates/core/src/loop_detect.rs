//! The loop detector. A loop is the same call (same tool, same canonical input) giving the same
//! result (same content digest) several times **in a row** within one session: its results are
//! annotated from the `warn_after`th such call on, and from the `block_after`th on the call is
//! denied before it runs. Another call of the session, or a different result, ends the run — a
//! polling tool whose answer changes is no loop. Calls that never reached their tool (invalid,
//! denied, not started, server unreachable) leave the run as it was.

use parking_lot::Mutex;
use toolwarden_protocol::LoopPolicy;

use crate::maps::CallDigest;

/// The current run of one session: a call and the result it kept giving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SessionRun {
    call: CallDigest,
    result: [u8; 32],
    /// How many calls in a row gave that result.
    count: u32,
}

/// What a call that reached its tool came back with, for the detector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LoopAnswer {
    /// A result from the tool (or its cache): the digest of its content.
    Result([u8; 32]),
    /// No result the model could compare (a timeout, a cancel mid-way): the run ends.
    Other,
}

/// One session's memory of its latest run.
#[derive(Default)]
pub(crate) struct LoopDetector {
    run: Mutex<Option<SessionRun>>,
}

impl LoopDetector {
    /// Before a call runs: `Some(n)` when the last `n` calls of the session were this very call
    /// giving one same result and this one would make `block_after` of them — deny it.
    pub(crate) fn blocks(&self, policy: &LoopPolicy, call: &CallDigest) -> Option<u32> {
        if policy.block_after == 0 {
            return None;
        }
        let run = (*self.run.lock())?;
        run_blocks(policy, &run.call.0, run.count, call)
    }

    /// After a call reached its tool: counts it into the run (or starts a new one). `Some(n)`
    /// when it is the `n`th call in a row giving the same result and `n` reached `warn_after`
    /// — say so in its result.
    pub(crate) fn record(
        &self,
        policy: &LoopPolicy,
        call: &CallDigest,
        answer: LoopAnswer,
    ) -> Option<u32> {
        if policy.warn_after == 0 && policy.block_after == 0 {
            return None;
        }
        let mut run = self.run.lock();
        let LoopAnswer::Result(result) = answer else {
            *run = None;
            return None;
        };
        let count = match *run {
            Some(r) if r.call == *call && r.result == result => r.count.saturating_add(1),
            _ => 1,
        };
        *run = Some(SessionRun {
            call: *call,
            result,
            count,
        });
        (policy.warn_after > 0 && count >= policy.warn_after).then_some(count)
    }
}

/// Whether a run — `count` calls in a row of the call `run_call` giving one result — denies
/// `call`: `Some(count)` when `call` is that call and would make `block_after` of them.
pub(crate) fn run_blocks(
    policy: &LoopPolicy,
    run_call: &[u8; 32],
    count: u32,
    call: &CallDigest,
) -> Option<u32> {
    (policy.block_after > 0
        && *run_call == call.0
        && count > 0
        && count.saturating_add(1) >= policy.block_after)
        .then_some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: CallDigest = CallDigest([1; 32]);
    const OTHER_CALL: CallDigest = CallDigest([2; 32]);
    const SAME: LoopAnswer = LoopAnswer::Result([7; 32]);

    /// Runs `steps` (call, answer) through a detector with the default policy; for each, whether
    /// it was blocked (`Err(n)`) or its warning count (`Ok(Some(n))`).
    fn check(steps: &[(CallDigest, LoopAnswer)]) -> Vec<Result<Option<u32>, u32>> {
        let d = LoopDetector::default();
        let p = LoopPolicy::default();
        steps
            .iter()
            .map(|(call, answer)| match d.blocks(&p, call) {
                Some(n) => Err(n),
                None => Ok(d.record(&p, call, *answer)),
            })
            .collect()
    }

    #[test]
    fn the_same_result_in_a_row_is_annotated_from_the_third_and_denied_from_the_fifth() {
        assert_eq!(
            check(&[(CALL, SAME); 6]),
            vec![Ok(None), Ok(None), Ok(Some(3)), Ok(Some(4)), Err(4), Err(4)]
        );
    }

    #[test]
    fn a_changing_result_is_no_loop() {
        let polls: Vec<(CallDigest, LoopAnswer)> = (0..10u8)
            .map(|i| (CALL, LoopAnswer::Result([i; 32])))
            .collect();
        assert_eq!(check(&polls), vec![Ok(None); 10]);
    }

    #[test]
    fn another_call_or_a_timeout_ends_the_run() {
        let steps = [
            (CALL, SAME),
            (CALL, SAME),
            (OTHER_CALL, SAME),
            (CALL, SAME),
            (CALL, SAME),
            (CALL, LoopAnswer::Other),
            (CALL, SAME),
            (CALL, SAME),
            (CALL, SAME),
        ];
        assert_eq!(
            check(&steps),
            vec![
                Ok(None),
                Ok(None),
                Ok(None),
                Ok(None),
                Ok(None),
                Ok(None),
                Ok(None),
                Ok(None),
                Ok(Some(3))
            ]
        );
    }

    #[test]
    fn a_shared_run_blocks_by_the_same_rule() {
        let p = LoopPolicy::default();
        assert_eq!(run_blocks(&p, &CALL.0, 4, &CALL), Some(4));
        assert_eq!(run_blocks(&p, &CALL.0, 3, &CALL), None);
        assert_eq!(run_blocks(&p, &CALL.0, 4, &OTHER_CALL), None);
        let off = LoopPolicy {
            warn_after: 3,
            block_after: 0,
        };
        assert_eq!(run_blocks(&off, &CALL.0, 9, &CALL), None);
    }

    #[test]
    fn zero_turns_it_off() {
        let d = LoopDetector::default();
        let p = LoopPolicy {
            warn_after: 0,
            block_after: 0,
        };
        for _ in 0..10 {
            assert_eq!(d.blocks(&p, &CALL), None);
            assert_eq!(d.record(&p, &CALL, SAME), None);
        }
    }
}
