//! Names and ids: the `SERVER__TOOL` separator, and the ids the engine mints: `t_<ULID>` for turns, `s_<ULID>` for sessions that were not named.
//! A ULID's time part is the turn's start; its random part comes from a per-process random base
//! plus a counter, so ids of one process never collide and sort in order.

use std::sync::Arc;

/// The separator of exposed MCP tool names: `SERVER__TOOL`.
pub const PREFIX_SEPARATOR: &str = "__";

/// `PREFIX` followed by a fresh ULID, built in place (ids are made on every turn).
pub(crate) fn new_id(prefix: &str) -> Arc<str> {
    new_id_at(prefix, toolwarden_protocol::Timestamp::now())
}

/// `PREFIX` followed by a fresh ULID of time `at`.
pub(crate) fn new_id_at(prefix: &str, at: toolwarden_protocol::Timestamp) -> Arc<str> {
    let mut buf = [0u8; 32];
    let n = prefix.len().min(6);
    buf[..n].copy_from_slice(&prefix.as_bytes()[..n]);
    let mut ulid = [0u8; ulid::ULID_LEN];
    let ms = u64::try_from(at.unix_millis()).unwrap_or(0);
    let text = ulid::Ulid::from_parts(ms, id_random()).array_to_str(&mut ulid);
    buf[n..n + ulid::ULID_LEN].copy_from_slice(text.as_bytes());
    // Both parts are ASCII.
    Arc::from(std::str::from_utf8(&buf[..n + ulid::ULID_LEN]).unwrap_or("t_"))
}

/// The random part of a ULID: a random 79-bit number drawn once per process, plus one per id
/// (which keeps it within ULID's 80 bits). Ids of one process never collide and stay in order
/// within a millisecond (as ULID's monotonic generators make them), without drawing 16 random
/// bytes per turn.
fn id_random() -> u128 {
    static BASE: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let base = *BASE.get_or_init(|| rand::random::<u128>() & ((1u128 << 79) - 1));
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    base + u128::from(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_of_one_millisecond_are_distinct_ulids_in_order() {
        let at = toolwarden_protocol::Timestamp::from_unix_millis(1_795_000_000_000);
        let ids: Vec<Arc<str>> = (0..1000).map(|_| new_id_at("t_", at)).collect();
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
        }
        let ulid = ulid::Ulid::from_string(&ids[0][2..]).expect("a ULID after the prefix");
        assert_eq!(ulid.timestamp_ms(), 1_795_000_000_000);
    }
}
