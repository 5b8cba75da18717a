//! Where each prompt, resource, URI template and subscription lives: the tables the passthrough
//! routes by. Only bookkeeping — what was listed by whom, who subscribed to what — so that the
//! modules that talk to servers (`prompts`, `resources`, `completion`) and the session registry
//! (which drops a session's subscriptions) share one truth without calling each other.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use toolwarden_protocol::SessionKey;

/// The gateway's routes to its servers' prompts and resources.
#[derive(Default)]
pub(crate) struct RouteTable {
    /// Resource URI → server.
    resources: Mutex<HashMap<String, Arc<str>>>,
    /// URI template → server.
    templates: Mutex<Vec<(String, Arc<str>)>>,
    /// Exposed prompt name → (server, the server's own name).
    prompts: Mutex<HashMap<String, (Arc<str>, String)>>,
    /// Resource URI → its server and the sessions subscribed to it.
    subscriptions: Mutex<HashMap<String, Subscribers>>,
}

/// A subscribed resource's server, and the sessions subscribed to it.
type Subscribers = (Arc<str>, BTreeSet<SessionKey>);

impl RouteTable {
    /// `server` listed its prompt `own` as `exposed`. Names listed by two servers (possible
    /// only unprefixed): the last listed wins, with a warning.
    pub(crate) fn remember_prompt(&self, exposed: &str, server: &Arc<str>, own: &str) {
        let mut prompts = self.prompts.lock();
        if let Some((other, _)) = prompts.get(exposed)
            && **other != **server
        {
            tracing::warn!(prompt = %exposed, first = %other, second = %server,
                "two servers list the same prompt name; the last listed wins");
        }
        prompts.insert(exposed.to_owned(), (server.clone(), own.to_owned()));
    }

    /// The server of an exposed prompt, and the prompt's own name there.
    pub(crate) fn prompt(&self, exposed: &str) -> Option<(Arc<str>, String)> {
        self.prompts.lock().get(exposed).cloned()
    }

    /// `server` listed the resource `uri`.
    pub(crate) fn remember_resource(&self, uri: &str, server: &Arc<str>) {
        self.resources.lock().insert(uri.to_owned(), server.clone());
    }

    /// `server` listed the URI template `template`.
    pub(crate) fn remember_template(&self, template: &str, server: &Arc<str>) {
        let mut templates = self.templates.lock();
        templates.retain(|(t, _)| t != template);
        templates.push((template.to_owned(), server.clone()));
    }

    /// The server that listed a template, by the template itself.
    pub(crate) fn template_server(&self, template: &str) -> Option<Arc<str>> {
        self.templates
            .lock()
            .iter()
            .find(|(t, _)| t == template)
            .map(|(_, s)| s.clone())
    }

    /// The server of a resource URI by what was listed: its own listing, then a template that
    /// matches it.
    pub(crate) fn uri_server(&self, uri: &str) -> Option<Arc<str>> {
        let by_listing = self.resources.lock().get(uri).cloned();
        by_listing.or_else(|| {
            self.templates
                .lock()
                .iter()
                .find(|(template, _)| template_matches(template, uri))
                .map(|(_, server)| server.clone())
        })
    }

    /// `session` subscribed to `uri`, served by `server`. Whether it is the first subscriber
    /// (then the server is to be subscribed): counted and judged in one step, so that a
    /// subscriber leaving meanwhile cannot leave the server unsubscribed under a live count.
    pub(crate) fn subscribe(&self, uri: &str, server: &Arc<str>, session: &SessionKey) -> bool {
        let mut subs = self.subscriptions.lock();
        let (_, sessions) = subs
            .entry(uri.to_owned())
            .or_insert_with(|| (server.clone(), BTreeSet::new()));
        let first = sessions.is_empty();
        sessions.insert(session.clone());
        first
    }

    /// `session` unsubscribed from `uri`; the server to unsubscribe when it was the last.
    pub(crate) fn unsubscribe(&self, uri: &str, session: &SessionKey) -> Option<Arc<str>> {
        let mut subs = self.subscriptions.lock();
        let (server, sessions) = subs.get_mut(uri)?;
        sessions.remove(session);
        if !sessions.is_empty() {
            return None;
        }
        let server = server.clone();
        subs.remove(uri);
        Some(server)
    }

    /// A session ended: its subscriptions go. The (URI, server) pairs it was the last
    /// subscriber of, for the server to be unsubscribed.
    pub(crate) fn forget_session(&self, session: &SessionKey) -> Vec<(String, Arc<str>)> {
        let mut emptied = Vec::new();
        self.subscriptions.lock().retain(|uri, (server, sessions)| {
            if sessions.remove(session) && sessions.is_empty() {
                emptied.push((uri.clone(), server.clone()));
                return false;
            }
            true
        });
        emptied
    }

    /// The URIs someone is subscribed to on `server` (renewed when it restarts).
    pub(crate) fn subscribed_on(&self, server: &str) -> Vec<String> {
        self.subscriptions
            .lock()
            .iter()
            .filter(|(_, (s, sessions))| **s == *server && !sessions.is_empty())
            .map(|(uri, _)| uri.clone())
            .collect()
    }
}

/// Whether `uri` matches an RFC 6570 URI template: literal parts must match in order; each
/// `{...}` expression matches one or more characters (`{+x}`, `{#x}` and `{/x}` may include
/// `/`; a plain `{x}` may not).
pub(crate) fn template_matches(template: &str, uri: &str) -> bool {
    enum Part<'a> {
        Lit(&'a str),
        Var { slashes: bool },
    }
    let mut parts = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            parts.push(Part::Lit(&rest[..open]));
        }
        let Some(close) = rest[open..].find('}') else {
            return false;
        };
        let expr = &rest[open + 1..open + close];
        parts.push(Part::Var {
            slashes: expr.starts_with(['+', '#', '/']),
        });
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        parts.push(Part::Lit(rest));
    }
    fn go(parts: &[Part<'_>], s: &str) -> bool {
        match parts.split_first() {
            None => s.is_empty(),
            Some((Part::Lit(lit), tail)) => s.strip_prefix(lit).is_some_and(|s| go(tail, s)),
            Some((Part::Var { slashes }, tail)) => {
                for (i, c) in s.char_indices() {
                    if c == '/' && !slashes {
                        break;
                    }
                    if go(tail, &s[i + c.len_utf8()..]) {
                        return true;
                    }
                }
                false
            }
        }
    }
    go(&parts, uri)
}

#[cfg(test)]
mod tests {
    use super::template_matches;

    #[test]
    fn templates_match_like_rfc_6570() {
        assert!(template_matches("test://items/{id}", "test://items/42"));
        assert!(!template_matches("test://items/{id}", "test://items/"));
        assert!(!template_matches("test://items/{id}", "test://items/4/2"));
        assert!(template_matches("file:///{+path}", "file:///a/b/c.txt"));
        assert!(template_matches("x://{a}/y/{b}", "x://1/y/2"));
        assert!(!template_matches("x://{a}/y/{b}", "x://1/z/2"));
        assert!(template_matches("plain://fixed", "plain://fixed"));
        assert!(!template_matches("plain://fixed", "plain://fixed/more"));
    }
}
