//! "Did you mean …?": the nearest of some names to one that is not among them, for every
//! message that names something unknown — a config key, a server, a tool, a key of a request
//! body. Only close names are offered: a typo (an edit distance of at most a third of the
//! name's length, at least one), or a name cut short; sharing a prefix is not closeness.

/// The candidate nearest to `name` (case as written), if one is close: within an edit distance
/// of a third of `name`'s length (at least 1), or one that `name` begins (at least 3
/// characters: `open` for `open_for`).
pub fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let limit = limit(name);
    candidates
        .map(|c| {
            // A name cut short is as near as a typo.
            let d = if name.len() >= 3 && c.starts_with(name) {
                1
            } else {
                edit_distance(name, c)
            };
            (d, c)
        })
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// How many edits a typo of `name` may have: a third of its length, at least one.
pub(crate) fn limit(name: &str) -> usize {
    (name.chars().count() / 3).max(1)
}

/// Edit distance, a swap of two neighbouring characters counting as one edit (the optimal
/// string alignment distance): `tset` is one typo of `test`.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows: two back (for swaps), one back, this one.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 0..a.len() {
        cur[0] = i + 1;
        for j in 0..b.len() {
            let mut d = (prev[j] + usize::from(a[i] != b[j]))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
            if i > 0 && j > 0 && a[i] == b[j - 1] && a[i - 1] == b[j] {
                d = d.min(before[j - 1] + 1);
            }
            cur[j + 1] = d;
        }
        std::mem::swap(&mut before, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("echo", "echo"), 0);
        assert_eq!(edit_distance("tset", "test"), 1, "a swap is one edit");
        assert_eq!(edit_distance("nope", "wipe"), 2);
    }

    #[test]
    fn only_close_names_are_offered() {
        let keys = ["session_id", "parent_turn_id", "calls", "detach"];
        assert_eq!(closest("session", keys.into_iter()), Some("session_id"));
        assert_eq!(closest("call", keys.into_iter()), Some("calls"));
        assert_eq!(closest("sesion_id", keys.into_iter()), Some("session_id"));
        assert_eq!(closest("priority", keys.into_iter()), None);
        assert_eq!(closest("x", ["y", "xy"].into_iter()), Some("y"));
    }
}
