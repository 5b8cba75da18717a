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

    /// Whether this is what `allowed` names: `host` (any port), `host:port` (that port), or a
    /// bare IPv6 address (`::1`, any port). An `allowed` that does not parse allows nothing.
    pub fn is(&self, allowed: &str) -> bool {
        let allowed = allowed.trim();
        match Self::parse(allowed) {
            Some(a) => a.host == self.host && (a.port.is_none() || a.port == self.port),
            None => allowed
                .parse::<std::net::Ipv6Addr>()
                .is_ok_and(|ip| self.host.parse::<std::net::Ipv6Addr>() == Ok(ip)),
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
        let h = HostPort::parse("Box.Lan:7420").unwrap();
        assert!(h.is("box.lan"));
        assert!(h.is("box.lan:7420"));
        assert!(!h.is("box.lan:7421"));
        assert!(!h.is("box.lan:1:2"));
        assert!(HostPort::parse("[::1]:80").unwrap().is("::1"));
        assert!(HostPort::parse("[0:0::1]").unwrap().is("::1"));
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
