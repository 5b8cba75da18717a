//! What a dead replica held, given back at once: when the trail's survivor declares a replica
//! dead (its lease ran out), it frees that replica's half-open probes, cache locks, places in
//! sessions' lines and quota places here, instead of leaving the others waiting for their TTLs.
//! Keys are found with `SCAN` (a few hundred at a time, so Redis never blocks on it) and each
//! is freed by a script that takes only what the dead replica's name holds.

use crate::conn::{RELEASE, RedisConn};

/// Removes a sorted set's members that start with one of `ARGV` (and the same fields of the
/// hash `KEYS[2]`, when given); answers how many.
const REMOVE_MEMBERS: &str = r"
local removed = 0
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  for i = 1, #ARGV do
    if string.sub(m, 1, #ARGV[i]) == ARGV[i] then
      redis.call('ZREM', KEYS[1], m)
      if KEYS[2] then redis.call('HDEL', KEYS[2], m) end
      removed = removed + 1
      break
    end
  end
end
return removed";

/// `s` with the glob characters of `SCAN MATCH` escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Removes the members of sorted set `key` that start with one of `prefixes` (and, with
/// `expiry`, the same fields of that hash); answers how many.
async fn remove_members(
    inner: &RedisConn,
    key: &str,
    expiry: Option<String>,
    prefixes: &[String],
) -> Option<u64> {
    let mut conn = inner.cmd.clone();
    let script = redis::Script::new(REMOVE_MEMBERS);
    let mut invocation = script.key(key);
    if let Some(expiry) = expiry {
        invocation.key(expiry);
    }
    for prefix in prefixes {
        invocation.arg(prefix);
    }
    inner
        .run("release_replica", invocation.invoke_async(&mut conn))
        .await
}

/// Every key of `prefix` followed by `kind`, as `SCAN` finds them.
async fn scan(inner: &RedisConn, kind: &str) -> Option<Vec<String>> {
    let pattern = format!("{}{kind}*", glob_escape(inner.keys.prefix()));
    let mut conn = inner.cmd.clone();
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = inner
            .run(
                "release_replica",
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(500)
                    .query_async(&mut conn),
            )
            .await?;
        keys.extend(batch);
        if next == 0 {
            return Some(keys);
        }
        cursor = next;
    }
}

/// Frees what the replica named `name` holds; answers how many keys or places were freed
/// (`None`: Redis did not answer).
pub(crate) async fn release_replica(inner: &RedisConn, name: &str) -> Option<u64> {
    let mut conn = inner.cmd.clone();
    let mut freed = 0u64;
    for kind in ["probe:", "cache-lock:"] {
        for key in scan(inner, kind).await? {
            let n: u64 = inner
                .run(
                    "release_replica",
                    redis::Script::new(RELEASE)
                        .key(&key)
                        .arg(name)
                        .invoke_async(&mut conn),
                )
                .await?;
            freed += n;
        }
    }
    let gate = format!("{}gate:", inner.keys.prefix());
    let places = [format!("x:{name}:"), format!("r:{name}:")];
    for key in scan(inner, "gate:").await? {
        let Some(session) = key.strip_prefix(&gate) else {
            continue;
        };
        let n = remove_members(inner, &key, Some(inner.keys.gate_expiry(session)), &places).await?;
        if n > 0 {
            freed += n;
            let _: Option<u64> = inner
                .run(
                    "release_replica",
                    redis::cmd("PUBLISH")
                        .arg(inner.keys.gate_channel())
                        .arg(session)
                        .query_async(&mut conn),
                )
                .await;
        }
    }
    let running = [format!("{name}:")];
    for key in scan(inner, "quota-run:").await? {
        freed += remove_members(inner, &key, None, &running).await?;
    }
    let _: Option<u64> = inner
        .run(
            "release_replica",
            redis::cmd("ZREM")
                .arg(inner.keys.replicas())
                .arg(name)
                .query_async(&mut conn),
        )
        .await;
    Some(freed)
}

#[cfg(test)]
mod tests {
    use super::glob_escape;

    #[test]
    fn a_prefix_matches_itself_only() {
        assert_eq!(glob_escape("tw:a*b?[c]\\"), "tw:a\\*b\\?\\[c\\]\\\\");
        assert_eq!(glob_escape("toolwarden:"), "toolwarden:");
    }
}
