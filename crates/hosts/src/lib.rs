//! Who a request says it is for: one parser of `Host` and `Origin` values, for every door of
//! toolwarden that guards against DNS rebinding (the HTTP API's guard and the MCP gateway's own
//! HTTP path).
//!
//! The key design choice: **one parser, on `http::uri::Authority`, strict.** A value that does
//! not parse as an authority (`localhost:1:2`, a port out of range, user info) names no host and
//! is refused everywhere; two hand-written parsers that disagree would let one door accept what
//! another refuses. Hosts compare case-insensitively, without a trailing dot; IPv6 hosts are
//! written bare (`::1`), without brackets.
#![deny(missing_docs)]

use std::net::IpAddr;
use std::str::FromStr;

use http::uri::{Authority, Scheme, Uri};

/// A host and, if it names one, a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    host: String,
    port: Option<u16>,
}

impl HostPort {
    /// Parses a `Host` value (`name`, `name:port`, `[v6]:port`); `None` if it is not a valid
    /// authority or carries user info.
    pub fn parse(value: &str) -> Option<Self> {
        let authority = Authority::from_str(value.trim()).ok()?;
        if authority.as_str().contains('@') {
            return None;
        }
        Self::of(&authority)
    }

    fn of(authority: &Authority) -> Option<Self> {
        let host = authority.host();
        // What follows the host is nothing or `:PORT`, PORT fitting in 16 bits (the parser lets
        // an out-of-range port through as none).
        let after = &authority.as_str()[host.len()..];
        let port = match after.strip_prefix(':') {
            None if after.is_empty() => None,
            Some(digits) => Some(digits.parse::<u16>().ok()?),
            None => return None,
        };
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if host.is_empty() {
            return None;
        }
        Some(Self { host, port })
    }

    /// The host, lower-cased, without brackets or a trailing dot.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port, if the value named one.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// Whether the host is `localhost` or a loopback address (`127.0.0.0/8`, `::1`, and `::1`'s
    /// IPv4-mapped forms).
    pub fn is_loopback(&self) -> bool {
        self.host == "localhost"
            || self
                .host
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.to_canonical().is_loopback())
    }
}

/// The `Host`s a door accepts: loopback ones if it says so, and a list of allowed entries
/// (`host`, `host:port`, a bare IPv6 address), parsed once when the door is built.
///
/// A door checks the `Host` of every request, and most requests of a deployment carry one of
/// a few values; so the values found allowed are remembered as they came (at most
/// [`AllowedHosts::REMEMBERED`] of them) and a value seen before is one comparison of bytes,
/// not a parse. What is remembered is only ever a value this list allows, so the answer is
/// the same either way.
#[derive(Debug)]
pub struct AllowedHosts {
    loopback: bool,
    entries: Vec<AllowedHost>,
    seen: std::sync::RwLock<Vec<Box<[u8]>>>,
}

#[derive(Debug)]
enum AllowedHost {
    /// `host` (any port) or `host:port`.
    Host(HostPort),
    /// A bare IPv6 address (`::1`): that address, any port.
    V6(std::net::Ipv6Addr),
    /// An entry that does not parse: it allows nothing.
    Nothing,
}

impl AllowedHosts {
    /// How many allowed values are remembered.
    pub const REMEMBERED: usize = 16;

    /// `loopback`: whether every loopback host is allowed too (see [`HostPort::is_loopback`]).
    pub fn new<I>(loopback: bool, allowed: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let entries = allowed
            .into_iter()
            .map(|a| AllowedHost::parse(a.as_ref()))
            .collect();
        Self {
            loopback,
            entries,
            seen: std::sync::RwLock::new(Vec::new()),
        }
    }

    /// Whether a parsed host is allowed: loopback (if the door allows it) or named by an entry
    /// — `host` (any port), `host:port` (that port), or a bare IPv6 address (`::1`, any port).
    /// An entry that does not parse allows nothing.
    pub fn allows(&self, host: &HostPort) -> bool {
        (self.loopback && host.is_loopback()) || self.entries.iter().any(|a| a.allows(host))
    }

    /// Whether a `Host` value is allowed; one that does not parse is not.
    pub fn allows_value(&self, value: &[u8]) -> bool {
        if let Ok(seen) = self.seen.read()
            && seen.iter().any(|v| **v == *value)
        {
            return true;
        }
        let allowed = std::str::from_utf8(value)
            .ok()
            .and_then(HostPort::parse)
            .is_some_and(|h| self.allows(&h));
        if allowed
            && let Ok(mut seen) = self.seen.write()
            && seen.len() < Self::REMEMBERED
            && !seen.iter().any(|v| **v == *value)
        {
            seen.push(value.into());
        }
        allowed
    }
}

impl AllowedHost {
    fn parse(allowed: &str) -> Self {
        let allowed = allowed.trim();
        match HostPort::parse(allowed) {
            Some(host) => AllowedHost::Host(host),
            None => allowed
                .parse::<std::net::Ipv6Addr>()
                .map_or(AllowedHost::Nothing, AllowedHost::V6),
        }
    }

    fn allows(&self, host: &HostPort) -> bool {
        match self {
            AllowedHost::Host(a) => {
                a.host == host.host && (a.port.is_none() || a.port == host.port)
            }
            AllowedHost::V6(ip) => host.host.parse::<std::net::Ipv6Addr>() == Ok(*ip),
            AllowedHost::Nothing => false,
        }
    }
}

/// An `Origin`: a scheme and a host, as a browser sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    scheme: String,
    host: HostPort,
}

impl Origin {
    /// Parses an `Origin` value (`scheme://host[:port]`, a trailing `/` tolerated); `None` for
    /// `null`, a value with a path, or one whose host does not parse.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        let value = value.strip_suffix('/').unwrap_or(value);
        let uri = Uri::from_str(value).ok()?;
        let scheme = uri.scheme()?;
        if uri
            .path_and_query()
            .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty())
        {
            return None;
        }
        let authority = uri.authority()?;
        if authority.as_str().contains('@') {
            return None;
        }
        Some(Self {
            scheme: scheme.as_str().to_ascii_lowercase(),
            host: HostPort::of(authority)?,
        })
    }

    /// The host part.
    pub fn host(&self) -> &HostPort {
        &self.host
    }

    /// Whether it is an `http` or `https` origin on a loopback host.
    pub fn is_loopback_web(&self) -> bool {
        (self.scheme == Scheme::HTTP.as_str() || self.scheme == Scheme::HTTPS.as_str())
            && self.host.is_loopback()
    }

    /// Whether this is the origin `allowed` names exactly (scheme, host and port; case and a
    /// trailing `/` aside). An `allowed` that does not parse allows nothing.
    pub fn is(&self, allowed: &str) -> bool {
        Self::parse(allowed).is_some_and(|a| a == *self)
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    fn host(value: &str) -> Option<(String, Option<u16>)> {
        HostPort::parse(value).map(|h| (h.host().to_owned(), h.port()))
    }

    #[test]
    fn hosts_parse_strictly() {
        let some = |h: &str, p: Option<u16>| Some((h.to_owned(), p));
        assert_eq!(host("localhost"), some("localhost", None));
        assert_eq!(host("LocalHost:7420"), some("localhost", Some(7420)));
        assert_eq!(host("[::1]:7420"), some("::1", Some(7420)));
        assert_eq!(host("example.com."), some("example.com", None));
        for bad in [
            "localhost:1:2",
            "localhost:99999",
            "user@localhost",
            "",
            "local host",
            "[::1",
            "::1",
        ] {
            assert_eq!(host(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn loopback_is_localhost_127_and_v6_one() {
        for ok in [
            "localhost",
            "127.0.0.1",
            "127.9.9.9:1",
            "[::1]",
            "[::ffff:127.0.0.1]:80",
        ] {
            assert!(HostPort::parse(ok).is_some_and(|h| h.is_loopback()), "{ok}");
        }
        for bad in [
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "10.0.0.1",
        ] {
            assert!(
                !HostPort::parse(bad).is_some_and(|h| h.is_loopback()),
                "{bad}"
            );
        }
    }

    #[test]
    fn allowed_hosts_match_by_host_or_host_and_port() {
        let is = |host: &str, allowed: &str| {
            AllowedHost::parse(allowed).allows(&HostPort::parse(host).unwrap())
        };
        assert!(is("Box.Lan:7420", "box.lan"));
        assert!(is("Box.Lan:7420", "box.lan:7420"));
        assert!(!is("Box.Lan:7420", "box.lan:7421"));
        assert!(!is("Box.Lan:7420", "box.lan:1:2"));
        assert!(is("[::1]:80", "::1"));
        assert!(is("[0:0::1]", "::1"));
    }

    #[test]
    fn allowed_hosts_answer_alike_whether_remembered_or_not() {
        let allowed = AllowedHosts::new(false, ["localhost", "box.lan:7420", "::1", "bad:1:2"]);
        let loopback = AllowedHosts::new(true, ["box.lan"]);
        let cases: [(&str, bool, bool); 11] = [
            ("localhost:1234", true, true),
            ("LOCALHOST", true, true),
            ("box.lan:7420", true, true),
            ("box.lan:7421", false, true),
            ("[::1]:80", true, true),
            ("127.0.0.2:80", false, true),
            ("evil.example", false, false),
            ("localhost.evil", false, false),
            ("[::1", false, false),
            ("localhost:1:2", false, false),
            ("bad:1", false, false),
        ];
        // Twice: the second round answers from what the first remembered.
        for _ in 0..2 {
            for (value, plain, with_loopback) in cases {
                assert_eq!(allowed.allows_value(value.as_bytes()), plain, "{value}");
                assert_eq!(
                    loopback.allows_value(value.as_bytes()),
                    with_loopback,
                    "{value}"
                );
            }
        }
        assert!(!allowed.allows_value(b"\xff"));
        // Only allowed values are remembered, and no more than REMEMBERED of them.
        let many = AllowedHosts::new(true, Vec::<String>::new());
        for port in 0..100u16 {
            assert!(many.allows_value(format!("127.0.0.1:{port}").as_bytes()));
            assert!(!many.allows_value(format!("evil{port}.example").as_bytes()));
        }
        let seen = many.seen.read().unwrap();
        assert_eq!(seen.len(), AllowedHosts::REMEMBERED);
        assert!(seen.iter().all(|v| v.starts_with(b"127.0.0.1:")));
    }

    #[test]
    fn origins_parse_and_compare_exactly() {
        let o = Origin::parse("https://APP.example/").unwrap();
        assert!(o.is("https://app.example"));
        assert!(!o.is("https://app.example:444"));
        assert!(!o.is("http://app.example"));
        assert!(
            Origin::parse("http://localhost:3000")
                .unwrap()
                .is_loopback_web()
        );
        assert!(!Origin::parse("file://localhost").unwrap().is_loopback_web());
        for bad in [
            "null",
            "http://evil.example/path",
            "http://a:1:2",
            "localhost",
        ] {
            assert_eq!(Origin::parse(bad), None, "{bad}");
        }
    }
}
