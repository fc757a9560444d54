//! Secrets out of command lines that leave the node.
//!
//! A victim's command line is often the most useful line of a kill record,
//! and often carries a secret (`--db-password=...`, `GITHUB_TOKEN=...`,
//! `postgres://app:pw@db/...`). The store keeps it whole (the store is
//! root's); what leaves the node (OTLP, JSON lines, the HTML report) gets
//! it with the values of secret-looking options, variables and URL
//! passwords replaced by `***`. It errs on the side of hiding: `--key-id
//! abc` loses `abc` too.
//!
//! A command line is the process's arguments joined with spaces, so an
//! argument is a word between spaces.

use std::borrow::Cow;

/// What a hidden value becomes.
pub const HIDDEN: &str = "***";

/// Words that make a name secret wherever they appear in it
/// (`PGPASSWORD`, `--db-password`, `AWS_SECRET_ACCESS_KEY`).
const ANYWHERE: &[&str] = &[
    "password",
    "passwd",
    "secret",
    "token",
    "apikey",
    "api_key",
    "api-key",
    "credential",
    "private_key",
    "private-key",
    "access_key",
    "access-key",
];

/// Words that make a name secret when they are one of its parts
/// (`--key`, `--auth`, `DB_PASS`), not inside another word (`--keyboard`).
const PARTS: &[&str] = &[
    "key",
    "pass",
    "pwd",
    "auth",
    "authorization",
    "cookie",
    "session",
];

/// Last parts that name where a secret is, not the secret (`--token-file
/// /etc/t`): such values are kept.
const LOCATIONS: &[&str] = &["file", "path", "dir"];

/// How command lines are redacted.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    /// More words that make a name secret wherever they appear
    /// (`--redact`), lower case.
    extra: Vec<String>,
}

impl Redactor {
    /// The built-in rules and `extra` words (`--redact WORD`).
    pub fn new(extra: &[String]) -> Self {
        Self {
            extra: extra
                .iter()
                .map(|w| w.to_ascii_lowercase())
                .filter(|w| !w.is_empty())
                .collect(),
        }
    }

    /// Whether an option's or a variable's name holds a secret.
    fn secret_name(&self, name: &str) -> bool {
        let name = name.trim_start_matches('-').to_ascii_lowercase();
        if name.is_empty() {
            return false;
        }
        let parts: Vec<&str> = name.split(['-', '_', '.']).collect();
        if parts
            .last()
            .is_some_and(|last| LOCATIONS.contains(last) && parts.len() > 1)
        {
            return false;
        }
        ANYWHERE.iter().any(|w| name.contains(w))
            || self.extra.iter().any(|w| name.contains(w.as_str()))
            || parts.iter().any(|p| PARTS.contains(p))
    }

    /// `line` with secret values replaced by [`HIDDEN`]; borrowed when
    /// nothing was hidden.
    pub fn cmdline<'a>(&self, line: &'a str) -> Cow<'a, str> {
        let mut out: Vec<Cow<'a, str>> = Vec::new();
        let mut changed = false;
        // The value of the previous argument's option follows it.
        let mut hide_next = false;
        for arg in line.split(' ') {
            let scheme = arg.eq_ignore_ascii_case("bearer") || arg.eq_ignore_ascii_case("basic");
            if hide_next && scheme {
                // `Authorization: Bearer VALUE`: the value is the next.
                out.push(Cow::Borrowed(arg));
                continue;
            }
            if hide_next && !arg.is_empty() && !arg.starts_with('-') {
                out.push(Cow::Borrowed(HIDDEN));
                changed = true;
                hide_next = false;
                continue;
            }
            hide_next = false;
            let (word, hid) = self.arg(arg);
            changed |= hid;
            if !hid {
                // `--password VALUE`, `Authorization: Bearer VALUE`.
                let header = arg.strip_suffix(':');
                hide_next = (arg.starts_with("--") && !arg.contains('=') && self.secret_name(arg))
                    || scheme
                    || header.is_some_and(|h| self.secret_name(h));
            }
            out.push(word);
        }
        if !changed {
            return Cow::Borrowed(line);
        }
        Cow::Owned(out.join(" "))
    }

    /// One argument, and whether something in it was hidden.
    fn arg<'a>(&self, arg: &'a str) -> (Cow<'a, str>, bool) {
        // NAME=VALUE and --name=VALUE.
        if let Some((name, value)) = arg.split_once('=') {
            let is_name = name
                .trim_start_matches('-')
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if is_name && !value.is_empty() && self.secret_name(name) {
                return (Cow::Owned(format!("{name}={HIDDEN}")), true);
            }
        }
        // scheme://user:password@host...
        if let Some(at) = url_password(arg) {
            let mut s = String::with_capacity(arg.len());
            s.push_str(&arg[..at.0]);
            s.push_str(HIDDEN);
            s.push_str(&arg[at.1..]);
            return (Cow::Owned(s), true);
        }
        (Cow::Borrowed(arg), false)
    }
}

/// Where the password of a URL's user information is in `arg`: the byte
/// range between `user:` and `@`.
fn url_password(arg: &str) -> Option<(usize, usize)> {
    let start = arg.find("://")? + 3;
    let rest = &arg[start..];
    let end_of_authority = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end_of_authority];
    let at = authority.rfind('@')?;
    let colon = authority[..at].find(':')?;
    (colon + 1 < at).then_some((start + colon + 1, start + at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(line: &str) -> String {
        Redactor::default().cmdline(line).into_owned()
    }

    #[test]
    fn secret_options_variables_and_url_passwords_are_hidden() {
        for (line, want) in [
            (
                "python train.py --db-password=hunter2 --epochs 3",
                "python train.py --db-password=*** --epochs 3",
            ),
            ("app --password hunter2 -v", "app --password *** -v"),
            (
                "app --api-key=abc --apikey abc",
                "app --api-key=*** --apikey ***",
            ),
            ("app --token=abc", "app --token=***"),
            ("app --key=abc --auth abc", "app --key=*** --auth ***"),
            (
                "env AWS_SECRET_ACCESS_KEY=abc GITHUB_TOKEN=ghp_x PGPASSWORD=pw DB_PASS=pw prog",
                "env AWS_SECRET_ACCESS_KEY=*** GITHUB_TOKEN=*** PGPASSWORD=*** DB_PASS=*** prog",
            ),
            (
                "psql postgres://app:s3cr3t@db:5432/prod?sslmode=require",
                "psql postgres://app:***@db:5432/prod?sslmode=require",
            ),
            (
                "curl -H Authorization: Bearer eyJhbGciOi https://x/y",
                "curl -H Authorization: Bearer *** https://x/y",
            ),
            (
                "curl -H X-Api-Token: abc https://x/y",
                "curl -H X-Api-Token: *** https://x/y",
            ),
            (
                "app --redis=redis://:pw@cache:6379",
                "app --redis=redis://:***@cache:6379",
            ),
        ] {
            assert_eq!(r(line), want, "{line}");
        }
    }

    #[test]
    fn ordinary_arguments_are_kept_as_they_are() {
        for line in [
            "python train.py --epochs 3 --lr=0.1",
            "memhog --step-mib 8 --interval-ms 20",
            "app --keyboard us --monkey=1 --passes 3",
            "app --token-file /etc/tracer/token --password-file=/run/pw",
            "git clone https://github.com/x/y",
            "ssh user@host",
            "app --password",
            "app --password --verbose",
            "a  b",
            "",
        ] {
            assert!(
                matches!(Redactor::default().cmdline(line), Cow::Borrowed(_)),
                "{line} -> {}",
                r(line)
            );
        }
    }

    #[test]
    fn more_words_can_be_named() {
        let red = Redactor::new(&["License".into()]);
        assert_eq!(
            red.cmdline("app --license-code=X1 --cores 4"),
            "app --license-code=*** --cores 4"
        );
        assert_eq!(r("app --license-code=X1"), "app --license-code=X1");
    }
}
