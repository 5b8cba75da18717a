//! Every key and channel, under the configured prefix (docs/SCALE-OUT.md lists them).

/// The names of one deployment.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// The prefix every key and channel starts with.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Hash: tool → the epoch millisecond its open breaker half-opens.
    pub(crate) fn breakers(&self) -> String {
        format!("{}breakers", self.prefix)
    }

    /// String: the replica that holds a tool's half-open probe.
    pub(crate) fn probe(&self, tool: &str) -> String {
        format!("{}probe:{tool}", self.prefix)
    }

    /// String: a cached result.
    pub(crate) fn cache(&self, key: &[u8; 32]) -> String {
        format!(
            "{}cache:{}",
            self.prefix,
            toolwarden_protocol::hex::encode(key)
        )
    }

    /// String: the replica that runs a cacheable call now.
    pub(crate) fn cache_lock(&self, key: &[u8; 32]) -> String {
        format!(
            "{}cache-lock:{}",
            self.prefix,
            toolwarden_protocol::hex::encode(key)
        )
    }

    /// Hash: a named session's loop run (`c` the call, `r` its result, `n` how many in a row).
    pub(crate) fn loop_run(&self, session: &str) -> String {
        format!("{}loop:{session}", self.prefix)
    }

    /// Sorted set: the replicas seen alive lately (replica → its last quota check, epoch ms).
    pub(crate) fn replicas(&self) -> String {
        format!("{}replicas", self.prefix)
    }

    /// Hash: a quota's bucket (`t` tokens left, `a` when counted).
    pub(crate) fn quota(&self, bucket: &str) -> String {
        format!("{}quota:{bucket}", self.prefix)
    }

    /// Sorted set: a quota bucket's running calls (member → when its lease ends, epoch ms).
    pub(crate) fn quota_running(&self, bucket: &str) -> String {
        format!("{}quota-run:{bucket}", self.prefix)
    }

    /// Sorted set: a named session's line at its gate (place → order of arrival).
    pub(crate) fn gate(&self, session: &str) -> String {
        format!("{}gate:{session}", self.prefix)
    }

    /// Hash: when each place in a session's line expires (epoch ms), and `#` the last order given.
    pub(crate) fn gate_expiry(&self, session: &str) -> String {
        format!("{}gate-exp:{session}", self.prefix)
    }

    /// Channel: a place in a session's line was left (the message is the session's id).
    pub(crate) fn gate_channel(&self) -> String {
        format!("{}gate", self.prefix)
    }

    /// Channel: requests for every replica's running turns.
    pub(crate) fn turns_channel(&self) -> String {
        format!("{}turns", self.prefix)
    }

    /// Channel: breaker changes.
    pub(crate) fn breaker_channel(&self) -> String {
        format!("{}breaker", self.prefix)
    }

    /// Channel: aborts for the replica that runs the turn.
    pub(crate) fn abort_channel(&self) -> String {
        format!("{}abort", self.prefix)
    }

    /// Channel: a task's answers (`tasks/update`) for the replica that holds the task.
    pub(crate) fn task_update_channel(&self) -> String {
        format!("{}task-update", self.prefix)
    }

    /// Channel: answers to one replica's aborts.
    pub(crate) fn reply_channel(&self, replica: &str) -> String {
        format!("{}reply:{replica}", self.prefix)
    }

    /// Channel: every replica's events.
    pub(crate) fn events_channel(&self) -> String {
        format!("{}events", self.prefix)
    }
}
