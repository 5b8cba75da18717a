//! The cancellation tree: process → session → turn → call (→ attempt, in the backend's signals).
//!
//! Every node is a [`CancelScope`]: a flag, the reason it was cancelled with, and — made only when
//! something first waits on the scope — a `CancellationToken` under its parent's. Most calls end
//! without anything ever waiting on their turn's scope (an in-process tool answers at once), so a
//! one-call turn costs one allocation here instead of three and never locks its parent. Aborting
//! a turn, a call, a client disconnect and shutdown all go through the same tree; a call reads the
//! reason from the nearest cancelled scope above it. A reason found on an *ancestor* turn (a
//! sub-agent's turn whose parent was aborted) reads as `parent`.

use std::sync::{Arc, OnceLock};

// Under `--cfg loom` the flag and the fences are loom's, so that the model checker explores every
// interleaving (and memory ordering) of a cancel racing the first wait (see `loom_tests`).
#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, Ordering, fence};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, Ordering, fence};

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use toolwarden_protocol::CancelReason;

/// What a scope stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScopeKind {
    Process,
    Session,
    Turn,
    Call,
}

#[derive(Debug)]
struct CancelScopeInner {
    /// Made on the first wait (see [`CancelScope::token`]).
    token: OnceLock<CancellationToken>,
    /// Set when this scope itself is cancelled: `is_cancelled` reads these flags up the tree
    /// (a few atomic loads) instead of the token's mutex.
    cancelled: AtomicBool,
    reason: OnceLock<CancelReason>,
    kind: ScopeKind,
    parent: Option<CancelScope>,
}

/// One node of the cancellation tree. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct CancelScope(Arc<CancelScopeInner>);

impl CancelScope {
    /// The root of a process.
    pub(crate) fn root() -> Self {
        Self(Arc::new(CancelScopeInner {
            token: OnceLock::new(),
            cancelled: AtomicBool::new(false),
            reason: OnceLock::new(),
            kind: ScopeKind::Process,
            parent: None,
        }))
    }

    /// A child that is cancelled whenever this scope is.
    pub(crate) fn child(&self, kind: ScopeKind) -> Self {
        Self(Arc::new(CancelScopeInner {
            token: OnceLock::new(),
            cancelled: AtomicBool::new(false),
            reason: OnceLock::new(),
            kind,
            parent: Some(self.clone()),
        }))
    }

    /// Cancels this scope and everything below it. The first reason given wins; cancelling again
    /// is harmless. Returns whether this call did the cancelling.
    pub(crate) fn cancel(&self, reason: CancelReason) -> bool {
        let first = self.0.reason.set(reason).is_ok();
        self.0.cancelled.store(true, Ordering::SeqCst);
        // Pairs with the fence in `token`: either the token made there is seen here, or the
        // flag set above is seen there; a token is never left uncancelled below a cancel.
        fence(Ordering::SeqCst);
        if let Some(token) = self.0.token.get() {
            token.cancel();
        }
        first
    }

    /// Whether this scope or one above it was cancelled. Every cancel goes through
    /// [`CancelScope::cancel`], so the flags say what the tokens say.
    pub(crate) fn is_cancelled(&self) -> bool {
        let mut node = Some(self);
        while let Some(scope) = node {
            if scope.0.cancelled.load(Ordering::Acquire) {
                return true;
            }
            node = scope.0.parent.as_ref();
        }
        false
    }

    /// Resolves when this scope or one above it is cancelled.
    pub(crate) fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token().cancelled()
    }

    /// This scope's token, made now if nothing waited on the scope before: a child of the
    /// parent's token (made too if need be), cancelled at once if the scope already is.
    fn token(&self) -> &CancellationToken {
        let token = self.0.token.get_or_init(|| match &self.0.parent {
            Some(parent) => parent.token().child_token(),
            None => CancellationToken::new(),
        });
        // Pairs with the fence in `cancel` (see there).
        fence(Ordering::SeqCst);
        if self.0.cancelled.load(Ordering::SeqCst) {
            token.cancel();
        }
        token
    }

    /// Why this scope is cancelled, as seen from it: the reason of the nearest cancelled scope at
    /// or above it; a reason set on a turn above this scope's own turn reads as `parent`.
    pub(crate) fn reason(&self) -> Option<CancelReason> {
        if !self.is_cancelled() {
            return None;
        }
        let mut turns_crossed = 0;
        let mut node = Some(self);
        while let Some(scope) = node {
            if scope.0.kind == ScopeKind::Turn {
                turns_crossed += 1;
            }
            if let Some(reason) = scope.0.reason.get() {
                return Some(if scope.0.kind == ScopeKind::Turn && turns_crossed > 1 {
                    CancelReason::Parent
                } else {
                    *reason
                });
            }
            node = scope.0.parent.as_ref();
        }
        // Cancelled without a recorded reason cannot happen through this API; be explicit.
        Some(CancelReason::User)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_come_from_the_nearest_cancelled_scope() {
        let root = CancelScope::root();
        let session = root.child(ScopeKind::Session);
        let turn = session.child(ScopeKind::Turn);
        let call = turn.child(ScopeKind::Call);
        assert_eq!(call.reason(), None);
        assert!(turn.cancel(CancelReason::User));
        assert!(
            !turn.cancel(CancelReason::ClientDisconnect),
            "the first reason wins"
        );
        assert_eq!(call.reason(), Some(CancelReason::User));
        assert_eq!(turn.reason(), Some(CancelReason::User));
        assert_eq!(session.reason(), None);
    }

    #[test]
    fn a_parent_turns_abort_reads_as_parent_below_it() {
        let root = CancelScope::root();
        let parent_turn = root.child(ScopeKind::Session).child(ScopeKind::Turn);
        let child_turn = parent_turn.child(ScopeKind::Turn);
        let child_call = child_turn.child(ScopeKind::Call);
        let parent_call = parent_turn.child(ScopeKind::Call);
        parent_turn.cancel(CancelReason::User);
        assert_eq!(parent_call.reason(), Some(CancelReason::User));
        assert_eq!(child_call.reason(), Some(CancelReason::Parent));
        assert_eq!(child_turn.reason(), Some(CancelReason::Parent));
    }

    #[tokio::test]
    async fn a_wait_begun_after_the_cancel_ends_at_once() {
        let root = CancelScope::root();
        let turn = root.child(ScopeKind::Session).child(ScopeKind::Turn);
        let call = turn.child(ScopeKind::Call);
        turn.cancel(CancelReason::User);
        // Neither scope had a token when the turn was cancelled.
        call.cancelled().await;
        turn.cancelled().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancel_reaches_waits_begun_before_it_and_racing_it() {
        for _ in 0..200 {
            let root = CancelScope::root();
            let session = root.child(ScopeKind::Session);
            let turn = session.child(ScopeKind::Turn);
            let waiter = turn.child(ScopeKind::Call);
            let racer = turn.child(ScopeKind::Call);
            let waiting = tokio::spawn(async move { waiter.cancelled().await });
            let racing = tokio::spawn(async move { racer.cancelled().await });
            tokio::task::yield_now().await;
            session.cancel(CancelReason::Shutdown);
            tokio::time::timeout(std::time::Duration::from_secs(10), async {
                waiting.await.expect("waiter");
                racing.await.expect("racer");
            })
            .await
            .expect("every wait ends once an ancestor is cancelled");
        }
    }

    #[test]
    fn shutdown_reaches_every_call() {
        let root = CancelScope::root();
        let call = root
            .child(ScopeKind::Session)
            .child(ScopeKind::Turn)
            .child(ScopeKind::Call);
        root.cancel(CancelReason::Shutdown);
        assert_eq!(call.reason(), Some(CancelReason::Shutdown));
    }
}

/// The fence pairing of `cancel` and `token`, checked by the loom model checker over every
/// interleaving: `scripts/loom.sh` builds this crate's unit tests with `--cfg loom` and runs
/// these.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    /// Cancels `canceller` (for the user) and makes `waiter`'s token on two threads, in every
    /// order loom can make of them, and returns the token.
    fn race(canceller: CancelScope, waiter: CancelScope) -> CancellationToken {
        let cancel = loom::thread::spawn(move || canceller.cancel(CancelReason::User));
        let wait = loom::thread::spawn(move || waiter.token().clone());
        cancel.join().unwrap();
        wait.join().unwrap()
    }

    #[test]
    fn a_token_made_while_its_scope_is_cancelled_ends_up_cancelled() {
        loom::model(|| {
            let scope = CancelScope::root();
            let token = race(scope.clone(), scope);
            assert!(
                token.is_cancelled(),
                "a token was left uncancelled below a cancel"
            );
        });
    }

    #[test]
    fn a_child_token_made_while_an_ancestor_is_cancelled_ends_up_cancelled() {
        loom::model(|| {
            let turn = CancelScope::root().child(ScopeKind::Turn);
            let call = turn.child(ScopeKind::Call);
            let token = race(turn, call.clone());
            assert!(
                token.is_cancelled(),
                "a child token missed its ancestor's cancel"
            );
            assert_eq!(call.reason(), Some(CancelReason::User));
        });
    }
}
