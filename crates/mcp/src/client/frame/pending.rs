//! The ids of our `tools/call` requests still waiting for their answers: the transport adds
//! each as it goes out, the guard takes it back when the answer comes, and only an answer
//! whose id it holds is parsed by the guard itself.

use std::collections::HashSet;

use parking_lot::Mutex;
use rmcp::model::RequestId;

/// The ids of our `tools/call` requests whose answers have not come yet. Only an optimization
/// rides on it: an answer whose id is missing takes rmcp's general path, which is just as right.
#[derive(Default)]
pub(crate) struct PendingCalls(Mutex<HashSet<RequestId>>);

impl PendingCalls {
    /// More than this many unanswered calls (abandoned ones never answer) and the set starts over.
    const MAX: usize = 65_536;

    pub(super) fn insert(&self, id: RequestId) {
        let mut ids = self.0.lock();
        if ids.len() >= Self::MAX {
            ids.clear();
        }
        ids.insert(id);
    }

    pub(super) fn take(&self, id: &RequestId) -> bool {
        self.0.lock().remove(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::NumberOrString;

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
}
