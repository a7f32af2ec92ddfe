//! Hiding secrets in addresses before they reach a log, an error message, `last_error` or the
//! screen: the one redaction function for every URL and connection string Postbox shows.
//!
//! Written by hand: the `url` crate refuses many strings this must still clean (templates with
//! `{placeholders}`, lists of servers, libpq `key=value` strings, text that merely contains a
//! URL), and a parser that gives up is a parser that leaks.

/// Query parameters and `key=value` settings whose value is a secret (compared
/// case-insensitively; `-` and `_` are ignored, so `api-key` matches `apikey`).
const SECRET_KEYS: &[&str] = &[
    "password",
    "passwd",
    "pass",
    "pwd",
    "secret",
    "clientsecret",
    "token",
    "accesstoken",
    "refreshtoken",
    "authtoken",
    "apikey",
    "key",
    "sig",
    "signature",
    "auth",
    "authorization",
    "credential",
    "credentials",
    "sslpassword",
];

/// What replaces a secret.
pub const MASK: &str = "***";

/// `text` with every secret in it replaced by `***`: the password of each `scheme://user:pw@host`
/// (also when it holds `/`, `?`, `#` or `@`), the value of secret query parameters
/// (`?token=…`, `&password=…`, `api_key=…`) and of `password=` settings in a libpq connection
/// string (quoted values too). A URL list (`nats://a:pw@h1,nats://a:pw@h2`) and URLs inside a
/// longer message are cleaned as well. When in doubt it hides too much rather than too little.
///
/// ```
/// use postbox::redact::redact;
/// assert_eq!(redact("postgres://app:s3/cr?t#@db:5432/app"), "postgres://app:***@db:5432/app");
/// assert_eq!(
///     redact("https://hooks.example/in?token=abc&x=1"),
///     "https://hooks.example/in?token=***&x=1"
/// );
/// assert_eq!(
///     redact("host=db user=app password='it''s secret' dbname=app"),
///     "host=db user=app password=*** dbname=app"
/// );
/// assert_eq!(redact("sqlite://postbox.db"), "sqlite://postbox.db");
/// ```
pub fn redact(text: &str) -> String {
    let text = redact_userinfo(text);
    redact_settings(&text)
}

/// Hides the password of every `scheme://user:password@host` in `text`.
fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The userinfo ends at the last `@` before the next URL (a list) or whitespace: a
        // password may hold `/`, `?`, `#`, even `@`, so no earlier delimiter can be trusted.
        let end = tail
            .find(|c: char| c.is_whitespace() || c == ',' || c == '"' || c == '\'')
            .map_or(tail.len(), |i| {
                // A comma inside the password would end the search early; only a comma that
                // starts another URL (`,scheme://`) separates a list.
                if tail[i..].starts_with(',') && !starts_url(&tail[i + 1..]) {
                    tail[i + 1..]
                        .find(|c: char| c.is_whitespace() || c == '"' || c == '\'')
                        .map_or(tail.len(), |j| i + 1 + j)
                } else {
                    i
                }
            });
        let url = &tail[..end];
        match url.rfind('@') {
            Some(at) => {
                let userinfo = &url[..at];
                match userinfo.find(':') {
                    Some(colon) => {
                        out.push_str(&userinfo[..colon + 1]);
                        out.push_str(MASK);
                    }
                    // `scheme://token@host` (NATS, Redis): a user name alone is often a token.
                    None if looks_like_token(userinfo) => out.push_str(MASK),
                    None => out.push_str(userinfo),
                }
                out.push_str(&url[at..]);
            }
            None => out.push_str(url),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Whether a scheme (`letters://`) starts `s`.
fn starts_url(s: &str) -> bool {
    let s = s.trim_start();
    let scheme = s.find("://").map(|i| &s[..i]).filter(|p| !p.is_empty());
    scheme.is_some_and(|p| {
        p.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

/// A user name alone that is long and random-looking enough to be a token rather than a name.
fn looks_like_token(userinfo: &str) -> bool {
    userinfo.len() >= 16 && !userinfo.contains('/')
}

/// Hides the values of secret `key=value` pairs: query parameters (`?token=…&…`) and libpq
/// settings (`password=… `, `password='…'`).
fn redact_settings(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut copied = 0;
    while let Some(eq) = text[i..].find('=').map(|e| i + e) {
        // The key: the word before `=`.
        let key_start = text[..eq]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'))
            .map_or(0, |k| k + 1);
        let key = &text[key_start..eq];
        let value_start = eq + 1;
        if !is_secret_key(key) {
            i = value_start;
            continue;
        }
        // The value: quoted ('…' with '' inside, as libpq writes it), or up to `&`, `;`,
        // whitespace, or the end.
        let value_end = if bytes.get(value_start) == Some(&b'\'') {
            let mut j = value_start + 1;
            loop {
                match bytes.get(j) {
                    None => break text.len(),
                    Some(b'\'') if bytes.get(j + 1) == Some(&b'\'') => j += 2,
                    Some(b'\\') => j += 2,
                    Some(b'\'') => break j + 1,
                    Some(_) => j += 1,
                }
            }
            .min(text.len())
        } else {
            text[value_start..]
                .find(|c: char| c == '&' || c == ';' || c.is_whitespace() || c == '"')
                .map_or(text.len(), |j| value_start + j)
        };
        if value_end > value_start {
            out.push_str(&text[copied..value_start]);
            out.push_str(MASK);
            copied = value_end;
        }
        i = value_end.max(value_start);
    }
    out.push_str(&text[copied..]);
    out
}

/// Whether a setting, parameter or header called `key` holds a secret (`password`, `token`,
/// `api_key`, `sasl.password`, `Authorization`, …).
///
/// ```
/// assert!(postbox::redact::is_secret_key("sasl.password"));
/// assert!(postbox::redact::is_secret_key("Api-Key"));
/// assert!(!postbox::redact::is_secret_key("tenant"));
/// ```
pub fn is_secret_key(key: &str) -> bool {
    let norm: String = key
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect();
    // `x.password`, `sasl.password` (Kafka properties) count as well.
    let last = norm.rsplit('.').next().unwrap_or(&norm);
    SECRET_KEYS.contains(&last)
}

#[cfg(test)]
mod tests {
    use super::redact;

    /// Every shape a secret takes in the addresses Postbox is given; none of them may survive.
    const SECRETS: &[(&str, &str)] = &[
        ("postgres://app:s3cret@db:5432/app", "s3cret"),
        ("postgres://app:pa/ss@db:5432/app", "pa/ss"),
        ("postgres://app:pa?ss@db/app", "pa?ss"),
        ("postgres://app:pa#ss@db/app", "pa#ss"),
        ("postgres://app:p@ss@db/app", "p@ss"),
        ("postgres://app:pa%2Fss@db/app", "pa%2Fss"),
        ("postgres://app:a,b@db/app", "a,b"),
        (
            "postgresql://app@db/app?password=s3cret&sslmode=require",
            "s3cret",
        ),
        ("host=db user=app password=s3cret dbname=app", "s3cret"),
        (
            "host=db password='it''s a secret' dbname=app",
            "it''s a secret",
        ),
        ("amqp://guest:g/u?e#st@rabbit:5672/%2f", "g/u?e#st"),
        ("nats://relay:pw1@n1:4222,nats://relay:pw1@n2:4222", "pw1"),
        (
            "nats://s3cr3t-t0ken-abcdefgh@n1:4222",
            "s3cr3t-t0ken-abcdefgh",
        ),
        ("redis://:r3dis/pw@cache:6379/0", "r3dis/pw"),
        ("mqtt://relay:mq#tt@broker:1883", "mq#tt"),
        (
            "https://hooks.example/in/{event_type}?token=t0k3n&x=1",
            "t0k3n",
        ),
        ("https://hooks.example/in?api_key=k3y", "k3y"),
        ("https://hooks.example/in?sig=abc123def", "abc123def"),
        ("https://user:hunter2@hooks.example/in", "hunter2"),
        (
            "error sending request for url (https://h.example/x?access_token=zz9)",
            "zz9",
        ),
        ("sasl.password=kafka-pw", "kafka-pw"),
    ];

    #[test]
    fn no_secret_survives() {
        for (text, secret) in SECRETS {
            let shown = redact(text);
            assert!(!shown.contains(secret), "{text} -> {shown}");
            assert!(shown.contains("***"), "{text} -> {shown}");
        }
    }

    #[test]
    fn what_is_not_secret_stays() {
        for text in [
            "sqlite://postbox.db",
            "postgres://app@db:5432/app",
            "nats://127.0.0.1:4222,nats://10.0.0.2:4222",
            "https://hooks.example/billing/{event_type}?tenant=acme",
            "host=db user=app dbname=app",
            "kafka-1:9092,kafka-2:9092",
            "no url here",
        ] {
            assert_eq!(redact(text), text);
        }
        assert_eq!(
            redact("postgres://app:pw@db/app and amqp://g:pw2@r/%2f"),
            "postgres://app:***@db/app and amqp://g:***@r/%2f"
        );
    }
}
