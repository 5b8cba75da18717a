//! Keeping a bounded part of a command's output: its head and its tail.
//!
//! The first half of the limit keeps the first bytes that arrive, the second half the last ones
//! (a ring of chunks); what falls between is counted and dropped. Both streams share the budget
//! in arrival order. Head and tail, rather than head alone, because the end of a long output
//! (the failing test, the compiler's last error) is usually what the model needs.

use std::collections::VecDeque;

/// Which pipe bytes came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout = 0,
    Stderr = 1,
}

/// Tail chunks of one stream are merged up to this size, so that many tiny writes do not cost a
/// chunk each and trimming the ring's front moves little memory.
const CHUNK: usize = 32 * 1024;

/// A bounded capture of stdout and stderr.
#[derive(Debug)]
pub(crate) struct Capture {
    head_budget: usize,
    head_used: usize,
    head: [Vec<u8>; 2],
    tail_budget: usize,
    tail_len: usize,
    tail: VecDeque<(Stream, Vec<u8>)>,
    seen: [u64; 2],
}

/// One stream as shown: kept text with the cut marked in place.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Shown {
    pub(crate) text: String,
    /// Bytes the command wrote to this stream.
    pub(crate) bytes: u64,
    /// Of which not shown.
    pub(crate) cut: u64,
}

impl Capture {
    /// A capture keeping at most `limit` bytes of both streams together.
    pub(crate) fn new(limit: u64) -> Self {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let head_budget = limit / 2;
        Self {
            head_budget,
            head_used: 0,
            head: [Vec::new(), Vec::new()],
            tail_budget: limit - head_budget,
            tail_len: 0,
            tail: VecDeque::new(),
            seen: [0, 0],
        }
    }

    /// Records bytes read from `stream`.
    pub(crate) fn push(&mut self, stream: Stream, data: &[u8]) {
        self.seen[stream as usize] += data.len() as u64;
        let take = (self.head_budget - self.head_used).min(data.len());
        self.head[stream as usize].extend_from_slice(&data[..take]);
        self.head_used += take;
        let mut rest = &data[take..];
        if rest.is_empty() || self.tail_budget == 0 {
            return;
        }
        if rest.len() >= self.tail_budget {
            self.tail.clear();
            self.tail_len = 0;
            rest = &rest[rest.len() - self.tail_budget..];
        }
        match self.tail.back_mut() {
            Some((last, buf)) if *last == stream && buf.len() + rest.len() <= CHUNK => {
                buf.extend_from_slice(rest);
            }
            _ => self.tail.push_back((stream, rest.to_vec())),
        }
        self.tail_len += rest.len();
        while self.tail_len > self.tail_budget {
            let excess = self.tail_len - self.tail_budget;
            let Some((_, front)) = self.tail.front_mut() else {
                break;
            };
            if front.len() <= excess {
                self.tail_len -= front.len();
                self.tail.pop_front();
            } else {
                front.drain(..excess);
                self.tail_len -= excess;
            }
        }
    }

    /// Bytes written to both streams and not kept.
    pub(crate) fn cut(&self) -> u64 {
        let kept = self.head_used + self.tail_len;
        (self.seen[0] + self.seen[1]).saturating_sub(kept as u64)
    }

    /// One stream, lossily decoded, with `[... N bytes cut ...]` where bytes were dropped.
    pub(crate) fn shown(&self, stream: Stream) -> Shown {
        let head = &self.head[stream as usize];
        let tail: Vec<u8> = self
            .tail
            .iter()
            .filter(|(s, _)| *s == stream)
            .flat_map(|(_, b)| b.iter().copied())
            .collect();
        let bytes = self.seen[stream as usize];
        let cut = bytes.saturating_sub((head.len() + tail.len()) as u64);
        let mut text = String::from_utf8_lossy(head).into_owned();
        if cut > 0 {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!("[... {cut} bytes cut ...]\n"));
        }
        text.push_str(&String::from_utf8_lossy(&tail));
        Shown { text, bytes, cut }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn shown(text: &str, bytes: u64, cut: u64) -> Shown {
        Shown {
            text: text.to_owned(),
            bytes,
            cut,
        }
    }

    #[test]
    fn keeps_everything_under_the_limit() {
        let mut c = Capture::new(10);
        c.push(Stream::Stdout, b"abc");
        c.push(Stream::Stderr, b"xy");
        c.push(Stream::Stdout, b"defgh");
        assert_eq!(c.cut(), 0);
        assert_eq!(c.shown(Stream::Stdout), shown("abcdefgh", 8, 0));
        assert_eq!(c.shown(Stream::Stderr), shown("xy", 2, 0));
    }

    #[test]
    fn keeps_head_and_tail_and_marks_the_cut() {
        let mut c = Capture::new(8);
        for chunk in [&b"0123"[..], b"456789", b"abcdef"] {
            c.push(Stream::Stdout, chunk);
        }
        assert_eq!(c.cut(), 8);
        assert_eq!(
            c.shown(Stream::Stdout),
            shown("0123\n[... 8 bytes cut ...]\ncdef", 16, 8)
        );
    }

    #[test]
    fn streams_share_the_budget_in_arrival_order() {
        let mut c = Capture::new(6);
        c.push(Stream::Stderr, b"E1");
        c.push(Stream::Stdout, b"o1o1o1");
        c.push(Stream::Stderr, b"E2");
        c.push(Stream::Stdout, b"o2");
        // head: "E1" + "o" ; tail (3 bytes): "E2" then "o2" trimmed to the last 3 bytes overall.
        assert_eq!(
            c.shown(Stream::Stderr),
            shown("E1\n[... 1 bytes cut ...]\n2", 4, 1)
        );
        assert_eq!(
            c.shown(Stream::Stdout),
            shown("o\n[... 5 bytes cut ...]\no2", 8, 5)
        );
        assert_eq!(c.cut(), 6);
    }

    #[test]
    fn a_zero_limit_keeps_nothing() {
        let mut c = Capture::new(0);
        c.push(Stream::Stdout, b"hello");
        assert_eq!(
            c.shown(Stream::Stdout),
            shown("[... 5 bytes cut ...]\n", 5, 5)
        );
    }

    #[test]
    fn a_flood_stays_bounded() {
        let mut c = Capture::new(1000);
        let chunk = vec![b'y'; 4096];
        for _ in 0..1000 {
            c.push(Stream::Stdout, &chunk);
        }
        assert_eq!(c.head_used + c.tail_len, 1000);
        assert_eq!(c.cut(), 4096 * 1000 - 1000);
        assert!(c.tail.iter().map(|(_, b)| b.capacity()).sum::<usize>() <= 2 * CHUNK);
    }

    #[test]
    fn invalid_utf8_is_shown_lossily() {
        let mut c = Capture::new(100);
        c.push(Stream::Stdout, b"ok \xff\xfe done");
        assert_eq!(c.shown(Stream::Stdout).text, "ok \u{fffd}\u{fffd} done");
    }
}
