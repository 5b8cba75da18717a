//! Where the HTTP API may listen.

use std::net::SocketAddr;

/// Why a listen address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListenError {
    /// A non-loopback address without a token would expose tool execution to the network.
    #[error(
        "refusing to listen on {0} without authentication: it is not a loopback address, so anyone who can reach it could run tools; set a bearer token (http.token_env), give principals their tokens ([[auth.tokens]]) or accept OAuth access tokens ([auth.oauth]), or listen on 127.0.0.1"
    )]
    NonLoopbackWithoutToken(SocketAddr),
}

/// Refuses a non-loopback `addr` (including `0.0.0.0` and `::`) unless requests are
/// `authenticated` (a token, token principals or OAuth; see
/// [`HttpOptions::authenticates`](crate::HttpOptions::authenticates)). IPv4-mapped IPv6
/// loopback (`::ffff:127.0.0.1`) counts as loopback.
pub fn listen_allowed(addr: &SocketAddr, authenticated: bool) -> Result<(), ListenError> {
    let loopback = addr.ip().to_canonical().is_loopback();
    if loopback || authenticated {
        Ok(())
    } else {
        Err(ListenError::NonLoopbackWithoutToken(*addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(addr: &str, token: Option<&str>, allowed: bool) {
        let addr: SocketAddr = addr.parse().unwrap();
        let authenticated = token.is_some_and(|t| !t.is_empty());
        assert_eq!(
            listen_allowed(&addr, authenticated).is_ok(),
            allowed,
            "{addr} {token:?}"
        );
    }

    #[test]
    fn only_loopback_listens_without_a_token() {
        check("127.0.0.1:7420", None, true);
        check("127.3.2.1:7420", None, true);
        check("[::1]:7420", None, true);
        check("[::ffff:127.0.0.1]:7420", None, true);
        check("0.0.0.0:7420", None, false);
        check("[::]:7420", None, false);
        check("192.168.1.5:7420", None, false);
        check("192.168.1.5:7420", Some(""), false);
        check("0.0.0.0:7420", Some("t0ken"), true);
    }
}
