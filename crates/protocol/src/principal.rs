//! Who is calling: a principal — a stable name for a person, an agent or a service — and what it
//! may do, its scopes (docs/AUTH.md). Every turn, call and event is attributed to one.

use std::fmt;
use std::sync::Arc;

use serde::de::{self, Deserializer};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

use crate::SessionId;

/// The principal of a request over loopback HTTP when no authentication is configured, and of
/// records made before principals existed.
pub const LOCAL_PRINCIPAL: &str = "local";

/// The principal of `[http] token_env`'s single token.
pub const DEFAULT_PRINCIPAL: &str = "default";

/// `local`, shared: the principal of records made before principals existed.
pub(crate) fn local_name() -> Arc<str> {
    Arc::from(LOCAL_PRINCIPAL)
}

/// One thing a principal may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Run tools (and list them).
    Call,
    /// See other principals' turns, events and audit records, and list tools.
    Read,
    /// Abort and cancel other principals' turns.
    Abort,
    /// Answer interactions (approvals, confirms) — one's own calls' included.
    Approve,
    /// All of these, and accept changed tool definitions.
    Admin,
}

impl Scope {
    /// Every scope, in order.
    pub const ALL: [Scope; 5] = [
        Scope::Call,
        Scope::Read,
        Scope::Abort,
        Scope::Approve,
        Scope::Admin,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Call => "call",
            Scope::Read => "read",
            Scope::Abort => "abort",
            Scope::Approve => "approve",
            Scope::Admin => "admin",
        }
    }

    /// A scope by its wire name.
    pub fn parse(name: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|s| s.as_str() == name)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of scopes. `admin` holds every other.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Scopes(u8);

impl Scopes {
    /// No scope.
    pub const NONE: Scopes = Scopes(0);

    /// Every scope.
    pub fn all() -> Scopes {
        Scope::ALL.into_iter().collect()
    }

    /// Whether `scope` is held (directly, or through `admin`).
    pub fn has(self, scope: Scope) -> bool {
        self.0 & (scope.bit() | Scope::Admin.bit()) != 0
    }

    /// The scopes held as written (not expanded by `admin`).
    pub fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL
            .into_iter()
            .filter(move |s| self.0 & s.bit() != 0)
    }

    /// `self` and `scope`.
    pub fn with(self, scope: Scope) -> Scopes {
        Scopes(self.0 | scope.bit())
    }
}

impl FromIterator<Scope> for Scopes {
    fn from_iter<I: IntoIterator<Item = Scope>>(iter: I) -> Self {
        iter.into_iter().fold(Scopes::NONE, Scopes::with)
    }
}

impl fmt::Debug for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for Scopes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(None)?;
        for scope in self.iter() {
            seq.serialize_element(scope.as_str())?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for Scopes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        names
            .iter()
            .map(|n| {
                Scope::parse(n).ok_or_else(|| de::Error::custom(format!("unknown scope {n:?}")))
            })
            .collect()
    }
}

/// A principal and its scopes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Principal {
    /// Its stable name.
    pub name: Arc<str>,
    /// What it may do.
    pub scopes: Scopes,
}

impl Principal {
    /// `name` with `scopes`.
    pub fn new(name: impl Into<Arc<str>>, scopes: Scopes) -> Principal {
        Principal {
            name: name.into(),
            scopes,
        }
    }

    /// `local`: loopback without authentication, the CLI's default, and every record made
    /// before principals existed. It holds every scope.
    pub fn local() -> Principal {
        Principal::new(LOCAL_PRINCIPAL, Scopes::all())
    }

    /// Whether it holds `scope`.
    pub fn may(&self, scope: Scope) -> bool {
        self.scopes.has(scope)
    }
}

impl Default for Principal {
    fn default() -> Self {
        Principal::local()
    }
}

/// A session as the engine keeps it: a session id belongs to a principal, so two principals'
/// `s1` are two sessions.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey {
    /// Whose session it is.
    pub principal: Arc<str>,
    /// The session's id, as its principal names it.
    pub id: SessionId,
}

impl SessionKey {
    /// `principal`'s session `id`.
    pub fn new(principal: impl Into<Arc<str>>, id: impl Into<SessionId>) -> SessionKey {
        SessionKey {
            principal: principal.into(),
            id: id.into(),
        }
    }

    /// `local`'s session `id`.
    pub fn local(id: impl Into<SessionId>) -> SessionKey {
        SessionKey::new(LOCAL_PRINCIPAL, id)
    }

    /// One string for it that no other key shares (`<bytes of the principal>:<principal><id>`),
    /// for names outside the process (the shared state's keys and messages).
    pub fn encode(&self) -> String {
        format!("{}:{}{}", self.principal.len(), self.principal, self.id)
    }

    /// The key [`SessionKey::encode`] made.
    pub fn decode(s: &str) -> Option<SessionKey> {
        let (len, rest) = s.split_once(':')?;
        let len: usize = len.parse().ok()?;
        if !rest.is_char_boundary(len) {
            return None;
        }
        let (principal, id) = rest.split_at(len);
        Some(SessionKey::new(principal, id))
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of {}", self.id, self.principal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_holds_every_scope_and_names_round_trip() {
        let admin: Scopes = [Scope::Admin].into_iter().collect();
        assert!(Scope::ALL.into_iter().all(|s| admin.has(s)));
        let reader: Scopes = [Scope::Read].into_iter().collect();
        assert!(reader.has(Scope::Read) && !reader.has(Scope::Call) && !reader.has(Scope::Approve));
        for scope in Scope::ALL {
            assert_eq!(Scope::parse(scope.as_str()), Some(scope));
            assert_eq!(serde_json::to_value(scope).unwrap(), scope.as_str());
        }
        let json = serde_json::to_value(Scopes::all()).unwrap();
        assert_eq!(
            json,
            serde_json::json!(["call", "read", "abort", "approve", "admin"])
        );
        assert_eq!(
            serde_json::from_value::<Scopes>(json).unwrap(),
            Scopes::all()
        );
        assert!(serde_json::from_value::<Scopes>(serde_json::json!(["root"])).is_err());
    }

    #[test]
    fn session_keys_encode_without_ambiguity() {
        let a = SessionKey::new("bob:", "s1");
        let b = SessionKey::new("bob", ":s1");
        assert_ne!(a.encode(), b.encode());
        for key in [a, b, SessionKey::local("s_01"), SessionKey::new("é", "x")] {
            assert_eq!(SessionKey::decode(&key.encode()), Some(key));
        }
        assert_eq!(SessionKey::decode("9:ab"), None);
        assert_eq!(SessionKey::decode("s1"), None);
    }
}
