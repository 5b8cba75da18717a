//! Exit codes (docs/CLI.md, "Exit codes") and the error that means "usage or config error".

use std::fmt;
use std::process::ExitCode;

use toolwarden_protocol::{Decider, Status};

/// How the process ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// Done; for `call`, the call ended `ok`.
    Ok,
    /// An error; for `call`, the call ended `error` or `invalid`.
    Error,
    /// A usage or config error.
    Usage,
    /// `call`: the call timed out.
    Timeout,
    /// `call`: the call needed an interaction but nothing could answer it (headless).
    Headless,
    /// `call`: the call was denied.
    Denied,
    /// `call`: the tool's circuit breaker is open.
    CircuitOpen,
    /// `call`: the call was cancelled (Ctrl-C, an abort, a shutdown).
    Interrupted,
    /// `call`: stopped by SIGTERM.
    Terminated,
}

impl Exit {
    /// The exit code of a call that ended with `status`.
    pub(crate) fn of_status(status: &Status) -> Exit {
        match status {
            Status::Ok => Exit::Ok,
            Status::Error { .. } | Status::Invalid { .. } | Status::Interrupted => Exit::Error,
            Status::Timeout { .. } => Exit::Timeout,
            Status::Denied {
                decider: Decider::Headless,
                ..
            } => Exit::Headless,
            Status::Denied { .. } => Exit::Denied,
            Status::CircuitOpen { .. } => Exit::CircuitOpen,
            Status::Cancelled { .. } => Exit::Interrupted,
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Error => 1,
            Exit::Usage => 2,
            Exit::Timeout => 3,
            Exit::Headless => 4,
            Exit::Denied => 5,
            Exit::CircuitOpen => 6,
            Exit::Interrupted => 130,
            Exit::Terminated => 143,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit.code())
    }
}

/// A usage or config error: the command exits 2 with this message.
#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Returns early with a [`UsageError`].
macro_rules! usage {
    ($($arg:tt)*) => {
        return Err(anyhow::Error::new($crate::exit::UsageError(format!($($arg)*))))
    };
}
pub(crate) use usage;

#[cfg(test)]
mod tests {
    use super::*;
    use toolwarden_protocol::{CancelReason, DenyReason, ErrorReason, InvalidReason, TimeoutKind};

    #[test]
    fn every_status_has_the_spec_code() {
        let cases = [
            (Status::Ok, 0),
            (
                Status::Error {
                    reason: ErrorReason::ToolError,
                },
                1,
            ),
            (
                Status::Invalid {
                    reason: InvalidReason::UnknownTool,
                },
                1,
            ),
            (
                Status::Timeout {
                    kind: TimeoutKind::Idle,
                    after_ms: 5,
                },
                3,
            ),
            (
                Status::Denied {
                    decider: Decider::Headless,
                    reason: DenyReason::NoInteractor,
                    retry_after_ms: None,
                },
                4,
            ),
            (
                Status::Denied {
                    decider: Decider::Policy,
                    reason: DenyReason::Timeout,
                    retry_after_ms: None,
                },
                5,
            ),
            (Status::CircuitOpen { retry_after_ms: 9 }, 6),
            (
                Status::Cancelled {
                    reason: CancelReason::User,
                },
                130,
            ),
        ];
        for (status, code) in cases {
            assert_eq!(Exit::of_status(&status).code(), code, "{status:?}");
        }
    }
}
