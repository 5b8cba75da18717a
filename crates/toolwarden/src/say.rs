//! Lines for standard error, each written whole.
//!
//! `eprintln!` writes its pieces one `write` at a time (standard error is unbuffered), so a
//! script that polls a log file for `listening on` could read the address cut short. Every
//! line the command line prints for people or scripts goes through [`say!`] instead: it is
//! formatted first, then written in one `write_all` — one system call for any line a pipe or a
//! file takes at once. [`Lines`] gathers several lines (the start-up announcement) to write
//! them together.

use std::fmt::{self, Write as _};
use std::io::{self, Write};

/// Writes one line to standard error in one piece; the arguments are `format!`'s.
macro_rules! say {
    () => {
        $crate::say::line(::std::format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::say::line(::std::format_args!($($arg)*))
    };
}
pub(crate) use say;

/// Formats `args` and a newline, then writes them to standard error whole.
pub(crate) fn line(args: fmt::Arguments<'_>) {
    let mut lines = Lines::default();
    lines.push(args);
    lines.write();
}

/// Lines gathered to be written to standard error together.
#[derive(Default)]
pub(crate) struct Lines(String);

impl Lines {
    /// Adds a line (without its newline).
    pub(crate) fn push(&mut self, args: fmt::Arguments<'_>) {
        // Writing into a `String` cannot fail.
        let _ = self.0.write_fmt(args);
        self.0.push('\n');
    }

    /// Writes every line gathered, in one `write_all`.
    pub(crate) fn write(self) {
        self.write_to(&mut io::stderr().lock());
    }

    fn write_to(&self, out: &mut impl Write) {
        // Nothing useful can be done when standard error is gone.
        let _ = out.write_all(self.0.as_bytes());
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    /// A writer that counts the calls to `write`.
    #[derive(Default)]
    struct Counting {
        bytes: Vec<u8>,
        writes: usize,
    }

    impl Write for Counting {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.writes += 1;
            self.bytes.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn several_lines_go_out_in_one_write() {
        let base = "http://127.0.0.1:4100";
        let mut lines = Lines::default();
        lines.push(format_args!("toolwarden: listening on {base}"));
        lines.push(format_args!("toolwarden: tools: {} ({})", 2, "a, b"));
        lines.push(format_args!(""));
        let mut out = Counting::default();
        lines.write_to(&mut out);
        assert_eq!(out.writes, 1);
        assert_eq!(
            String::from_utf8(out.bytes).unwrap(),
            "toolwarden: listening on http://127.0.0.1:4100\ntoolwarden: tools: 2 (a, b)\n\n"
        );
    }

    #[test]
    fn eprintln_would_have_written_in_pieces() {
        // The reason for this module: the same line through `writeln!` on an unbuffered
        // writer takes several writes.
        let base = "http://127.0.0.1:4100";
        let mut out = Counting::default();
        writeln!(out, "toolwarden: listening on {base}").unwrap();
        assert!(out.writes > 1, "{} writes", out.writes);
    }
}
