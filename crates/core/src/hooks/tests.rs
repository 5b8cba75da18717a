use std::collections::BTreeMap;

use toolwarden_protocol::{HookConfig, RuleDecision};

use super::{HookSet, read_answer};

fn compile(url: &str, allow_remote: Option<bool>) -> Result<(), String> {
    let mut map = BTreeMap::new();
    map.insert(
        "h".to_owned(),
        HookConfig {
            url: Some(url.to_owned()),
            allow_remote,
            ..Default::default()
        },
    );
    HookSet::compile(&map).map(|_| ()).map_err(|e| e.message)
}

#[test]
fn hook_urls_must_be_on_loopback_unless_allowed() {
    for ok in [
        "http://127.0.0.1:9000/decide",
        "http://localhost/x",
        "https://[::1]:8443/",
        "http://127.0.0.2",
    ] {
        assert!(compile(ok, None).is_ok(), "{ok}");
    }
    for remote in [
        "http://10.0.0.1/x",
        "https://policy.example.com/decide",
        "http://127.0.0.1.example.com/",
        "http://user@example.com/",
        "http://evil.example\\@127.0.0.1/",
    ] {
        let e = compile(remote, None).unwrap_err();
        assert!(e.contains("allow_remote = true"), "{remote}: {e}");
        assert!(compile(remote, Some(true)).is_ok(), "{remote}");
    }
    assert!(
        compile("ftp://127.0.0.1/", None)
            .unwrap_err()
            .contains("http")
    );
    assert!(compile("http:///x", None).is_err());
}

#[test]
fn a_hook_needs_exactly_one_way_to_be_reached() {
    let mut map = BTreeMap::new();
    map.insert("h".to_owned(), HookConfig::default());
    assert_eq!(HookSet::compile(&map).unwrap_err().key, "url");
    map.insert(
        "h".to_owned(),
        HookConfig {
            url: Some("http://127.0.0.1/".into()),
            command: Some(vec!["x".into()]),
            ..Default::default()
        },
    );
    assert_eq!(HookSet::compile(&map).unwrap_err().key, "command");
    map.insert(
        "h".to_owned(),
        HookConfig {
            command: Some(vec![]),
            ..Default::default()
        },
    );
    assert_eq!(HookSet::compile(&map).unwrap_err().key, "command");
}

#[test]
fn answers_are_read_strictly() {
    let said = read_answer(br#"{"decision":"deny","reason":"no"}"#).unwrap();
    assert_eq!(said.decision, RuleDecision::Deny);
    assert_eq!(said.reason.as_deref(), Some("no"));
    let said = read_answer(br#"{"decision":"allow","args":{"a":1}}"#).unwrap();
    assert_eq!(said.args, Some(serde_json::json!({"a": 1})));
    for bad in [
        &b"not json"[..],
        br#"{"decision":"maybe"}"#,
        br#"{"decision":"confirm"}"#,
        br#"{"allow":true}"#,
        br#"{"decision":"allow","args":[1]}"#,
        b"",
    ] {
        assert!(
            read_answer(bad).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}
