//! The library's messages, as this program shows them: its hints name builder methods
//! (`.ttl()`), which become the flags that set them (`--ttl`), or are dropped where no flag
//! does; and error chains that repeat themselves ("tcp connect error: transport error: tcp
//! connect error: …") are said once.

/// Builder methods that a flag of `incumbent run` sets.
const FLAGS: &[(&str, &str)] = &[
    ("ttl", "--ttl"),
    ("lock_delay", "--lock-delay"),
    ("grace", "--grace"),
    ("candidate", "--id"),
    ("metadata", "--meta"),
    ("client_identity", "--cert-file and --key-file"),
    ("ca_certificate", "--ca-file"),
];

/// The library's names for TLS settings, as this program's flags and variables say them.
const PHRASES: &[(&str, &str)] = &[
    (
        "the CA certificate signed the servers'",
        "the CA certificate (--ca-file or ETCDCTL_CACERT) signed the servers'",
    ),
    (
        " (or set .tls_domain_name())",
        " (write the URL with a host name the certificates carry)",
    ),
    ("check ca_pem (", "check --ca-file or CONSUL_CACERT ("),
    // What a library user is told about `connect`: this program says itself whether it
    // retries (--fail-after).
    (
        " (connect tried once and does not retry: call it again, or retry it with back-off; \
         once connected, a campaign retries by itself)",
        "",
    ),
    (
        "and client_identity_pem (",
        "and --cert-file and --key-file or CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY (",
    ),
];

/// `message` with flags for builder methods, and without repeated parts of its chain.
pub fn tidy(message: &str) -> String {
    let mut text = message.to_owned();
    for (library, cli) in PHRASES {
        text = text.replace(library, cli);
    }
    let text = with_flags(&text);
    // The chain ends where the hints begin: "a: b: c; do this".
    match text.split_once("; ") {
        Some((chain, hints)) => format!("{}; {hints}", dedupe_chain(chain)),
        None => dedupe_chain(&text),
    }
}

/// The method names of the builder calls (`.name()`) in `text`.
fn calls(text: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("()") {
        let before = &rest[..open];
        let name_start = before
            .rfind(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .map_or(0, |i| i + 1);
        if name_start > 0 && before.as_bytes()[name_start - 1] == b'.' && name_start < open {
            found.push(&before[name_start..]);
        }
        rest = &rest[open + 2..];
    }
    found
}

fn flag(method: &str) -> Option<&'static str> {
    FLAGS
        .iter()
        .find(|(name, _)| *name == method)
        .map(|(_, flag)| *flag)
}

/// Each `; `-separated hint that names builder methods: methods with a flag are replaced by
/// it; an alternative (`… or …`) naming a method without one is dropped, and so is a hint
/// left with nothing.
fn with_flags(message: &str) -> String {
    let mut clauses = Vec::new();
    for clause in message.split("; ") {
        if calls(clause).is_empty() {
            clauses.push(clause.to_owned());
            continue;
        }
        let kept: Vec<String> = clause
            .split(" or ")
            .filter(|alternative| calls(alternative).iter().all(|m| flag(m).is_some()))
            .map(|alternative| {
                let mut text = alternative.to_owned();
                for method in calls(alternative) {
                    if let Some(flag) = flag(method) {
                        text = text.replace(&format!(".{method}()"), flag);
                    }
                }
                text
            })
            .collect();
        if !kept.is_empty() {
            clauses.push(kept.join(" or "));
        }
    }
    clauses.join("; ")
}

/// A `: `-separated chain with each part kept only at its last occurrence: "a: b: a: b: c"
/// becomes "a: b: c". The text after the last separator always stays.
fn dedupe_chain(message: &str) -> String {
    let parts: Vec<&str> = message.split(": ").collect();
    let kept: Vec<&str> = parts
        .iter()
        .enumerate()
        .filter(|(i, part)| !parts[i + 1..].contains(part))
        .map(|(_, part)| *part)
        .collect();
    kept.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_methods_become_flags_or_are_dropped() {
        assert_eq!(
            tidy(
                "invalid timing: ttl 5s is outside what etcd accepts (1s to 1h); set .ttl() in that range"
            ),
            "invalid timing: ttl 5s is outside what etcd accepts (1s to 1h); set --ttl in that range"
        );
        assert_eq!(
            tidy(
                "invalid timing: renew deadline 9s leaves no margin; lower .renew_deadline() or raise .ttl()"
            ),
            "invalid timing: renew deadline 9s leaves no margin; raise --ttl"
        );
        assert_eq!(
            tidy("invalid timing: the interval is too long; lower .renew_interval()"),
            "invalid timing: the interval is too long"
        );
        assert_eq!(
            tidy("the candidate id is empty; pass a name such as \"host-a:8080\" to .candidate()"),
            "the candidate id is empty; pass a name such as \"host-a:8080\" to --id"
        );
        assert_eq!(
            tidy("use file:///dir or memory:"),
            "use file:///dir or memory:"
        );
    }

    #[test]
    fn tls_settings_are_named_by_their_flags() {
        let etcd = tidy(
            "invalid etcd configuration: TLS handshake failed: invalid peer certificate: \
             UnknownIssuer; check that the CA certificate signed the servers' certificates, \
             that their names match the endpoints (or set .tls_domain_name()), and, if etcd \
             requires client certificates, that .client_identity() gives one its CA signed",
        );
        assert!(etcd.contains("--ca-file or ETCDCTL_CACERT"), "{etcd}");
        assert!(etcd.contains("--cert-file and --key-file gives"), "{etcd}");
        assert!(!etcd.contains(".tls_domain_name()"), "{etcd}");
        let consul = tidy(
            "TLS with the Consul agent at https://127.0.0.1:1 failed during kv get: x; check \
             ca_pem (the CA that signed the agent's certificate), the address's host name and \
             client_identity_pem (required when the agent sets verify_incoming)",
        );
        assert!(
            consul.contains("check --ca-file or CONSUL_CACERT ("),
            "{consul}"
        );
        assert!(consul.contains("CONSUL_CLIENT_KEY (required"), "{consul}");
    }

    #[test]
    fn repeated_chains_are_said_once() {
        assert_eq!(
            tidy(
                "etcd is unavailable: tcp connect error: transport error: tcp connect error: Connection refused (os error 111)"
            ),
            "etcd is unavailable: transport error: tcp connect error: Connection refused (os error 111)"
        );
        assert_eq!(tidy("a: b: a: b"), "a: b");
        assert_eq!(
            tidy(
                "TLS handshake failed: UnknownIssuer: invalid peer certificate: UnknownIssuer; check it"
            ),
            "TLS handshake failed: invalid peer certificate: UnknownIssuer; check it"
        );
        assert_eq!(tidy("plain"), "plain");
    }
}
