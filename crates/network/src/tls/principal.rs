//! Kafka's `SslPrincipalMapper`: `ssl.principal.mapping.rules` turns the distinguished name
//! of a client certificate (RFC 2253, as [`super::dn::rfc2253`] renders it) into the name of
//! the connection's `User` principal.
//!
//! The rules are a comma-separated list tried in order; the first that applies gives the name,
//! and a name no rule applies to fails the connection (Kafka's `NoMatchingRule`, an
//! authentication failure). `DEFAULT` gives the whole distinguished name;
//! `RULE:pattern/replacement/[LU]` applies when `pattern` matches the whole name and gives
//! every match of it replaced by `replacement` (`$1` for a group), lower-cased with `/L` or
//! upper-cased with `/U`. Patterns are Java regular expressions in Kafka; here they are the
//! `regex` crate's, which agree on everything but look-around and back-references inside a
//! pattern (refused at start-up).

use std::fmt;

use regex::Regex;

/// An invalid `ssl.principal.mapping.rules` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRules(pub String);

#[derive(Debug, Clone)]
enum Rule {
    Default,
    Rule {
        source: String,
        /// `^(?:pattern)$`: Java's `Matcher.matches`.
        whole: Regex,
        /// The pattern as given, for `replaceAll`.
        pattern: Regex,
        /// The replacement in the `regex` crate's syntax.
        replacement: String,
        lower: bool,
        upper: bool,
    },
}

/// `ssl.principal.mapping.rules`, parsed.
#[derive(Debug, Clone)]
pub struct SslPrincipalMapper {
    rules: Vec<Rule>,
}

impl Default for SslPrincipalMapper {
    fn default() -> Self {
        Self {
            rules: vec![Rule::Default],
        }
    }
}

/// One rule's text at the start of `s`: `DEFAULT`, or `RULE:` up to the end of its
/// `/replacement/` and optional `L`/`U`, or anything up to the next comma. Returns the rule
/// and the rest after the separating comma.
fn split_rule(s: &str) -> (&str, &str) {
    let s = s.trim_start();
    if let Some(body) = s.strip_prefix("RULE:") {
        // Two `/`-terminated parts in which `\x` escapes any character.
        let bytes = body.as_bytes();
        let mut i = 0;
        let mut slashes = 0;
        while i < bytes.len() && slashes < 2 {
            match bytes[i] {
                b'\\' => i += 2,
                b'/' => {
                    slashes += 1;
                    i += 1;
                }
                _ => i += 1,
            }
        }
        if slashes == 2 {
            let mut end = "RULE:".len() + i.min(bytes.len());
            if matches!(s.as_bytes().get(end), Some(b'L' | b'U')) {
                end += 1;
            }
            // Kafka's `.*?` before the separator: anything up to the next comma is part of
            // the rule (and makes it invalid unless blank).
            let rest = &s[end..];
            return match rest.find(',') {
                Some(c) => (&s[..end + c], &rest[c + 1..]),
                None => (s, ""),
            };
        }
    }
    match s.find(',') {
        Some(c) => (&s[..c], &s[c + 1..]),
        None => (s, ""),
    }
}

/// Kafka's `RULE:pattern/replacement/` part splitting: `/` ends a part unless escaped.
fn split_unescaped_slash(s: &str) -> Option<(&str, &str)> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'/' => return Some((&s[..i], &s[i + 1..])),
            _ => i += 1,
        }
    }
    None
}

/// A Java `replaceAll` replacement (`$n` a group, `\x` a literal `x`) in the `regex` crate's
/// syntax, with Kafka's treatment of group numbers above the pattern's count: the digits are
/// cut from the right until a group exists, and a `$n` with no such group is literal.
fn java_replacement(replacement: &str, groups: usize) -> String {
    let mut out = String::new();
    let chars: Vec<char> = replacement.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' if i + 1 < chars.len() => {
                if chars[i + 1] == '$' {
                    out.push_str("$$");
                } else {
                    out.push(chars[i + 1]);
                }
                i += 2;
            }
            '$' => {
                let start = i + 1;
                let mut end = start;
                while end < chars.len() && chars[end].is_ascii_digit() {
                    end += 1;
                }
                if end == start {
                    // Java would fail on a `$` not followed by a group; keep it literal.
                    out.push_str("$$");
                    i += 1;
                    continue;
                }
                let digits: String = chars[start..end].iter().collect();
                // Kafka's escapeLiteralBackReferences, then Java's own parsing: take the
                // longest prefix of the digits that names an existing group.
                let mut n = digits.len();
                let mut group = None;
                while n > 0 {
                    if let Ok(g) = digits[..n].parse::<usize>() {
                        if g <= groups && (n == 1 || !digits.starts_with('0')) {
                            group = Some(g);
                            break;
                        }
                    }
                    n -= 1;
                }
                match group {
                    Some(g) if groups > 0 || g == 0 => {
                        out.push_str(&format!("${{{g}}}"));
                        out.push_str(&digits[n..]);
                    }
                    _ => {
                        out.push_str("$$");
                        out.push_str(&digits);
                    }
                }
                i = end;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

impl SslPrincipalMapper {
    /// Parses `ssl.principal.mapping.rules` (Kafka's default is `DEFAULT`).
    ///
    /// # Errors
    /// [`InvalidRules`] naming the rule that is not `DEFAULT` or `RULE:pattern/replacement/`
    /// with an optional `L` or `U`, or whose pattern does not compile.
    pub fn from_rules(rules: &str) -> Result<Self, InvalidRules> {
        let mut out = Vec::new();
        let mut rest = rules.trim();
        while !rest.is_empty() {
            let (rule, next) = split_rule(rest);
            rest = next.trim_start();
            let rule = rule.trim();
            if rule.is_empty() {
                continue;
            }
            if rule == "DEFAULT" {
                out.push(Rule::Default);
                continue;
            }
            let body = rule
                .strip_prefix("RULE:")
                .ok_or_else(|| InvalidRules(format!("Invalid rule: {rule}")))?;
            let (pattern, after) = split_unescaped_slash(body)
                .ok_or_else(|| InvalidRules(format!("Invalid rule: {rule}")))?;
            let (replacement, flags) = split_unescaped_slash(after)
                .ok_or_else(|| InvalidRules(format!("Invalid rule: {rule}")))?;
            let (lower, upper) = match flags {
                "" => (false, false),
                "L" => (true, false),
                "U" => (false, true),
                other => {
                    return Err(InvalidRules(format!(
                        "Invalid rule: `{rule}`, unmatched substring: `{other}`"
                    )))
                }
            };
            let compile = |p: &str| {
                Regex::new(p).map_err(|e| {
                    InvalidRules(format!(
                        "Invalid rule: {rule}: pattern does not compile: {e}"
                    ))
                })
            };
            let compiled = compile(pattern)?;
            let groups = compiled.captures_len() - 1;
            out.push(Rule::Rule {
                source: rule.to_string(),
                whole: compile(&format!("^(?:{pattern})$"))?,
                pattern: compiled,
                replacement: java_replacement(replacement, groups),
                lower,
                upper,
            });
        }
        Ok(Self { rules: out })
    }

    /// The principal name for `distinguished_name`, or `None` when no rule applies (Kafka
    /// then fails the authentication: "No rules apply to ...").
    pub fn name(&self, distinguished_name: &str) -> Option<String> {
        self.rules.iter().find_map(|r| match r {
            Rule::Default => Some(distinguished_name.to_string()),
            Rule::Rule {
                whole,
                pattern,
                replacement,
                lower,
                upper,
                ..
            } => {
                if !whole.is_match(distinguished_name) {
                    return None;
                }
                let s = pattern
                    .replace_all(distinguished_name, replacement.as_str())
                    .into_owned();
                Some(if *lower {
                    s.to_lowercase()
                } else if *upper {
                    s.to_uppercase()
                } else {
                    s
                })
            }
        })
    }
}

impl fmt::Display for SslPrincipalMapper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rules: Vec<&str> = self
            .rules
            .iter()
            .map(|r| match r {
                Rule::Default => "DEFAULT",
                Rule::Rule { source, .. } => source.as_str(),
            })
            .collect();
        write!(f, "{}", rules.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(rules: &str, dn: &str) -> Option<String> {
        SslPrincipalMapper::from_rules(rules).unwrap().name(dn)
    }

    // The cases of Kafka's SslPrincipalMapperTest (rules and expected names).
    #[test]
    fn kafka_rule_examples() {
        let rules = "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U,DEFAULT";
        assert_eq!(
            map(rules, "CN=duke,OU=ServiceUsers,O=Org,C=US").as_deref(),
            Some("duke")
        );
        assert_eq!(
            map(rules, "CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US").as_deref(),
            Some("duke@sme")
        );
        assert_eq!(
            map(rules, "cn=duke,OU=JavaSoft,O=Sun Microsystems").as_deref(),
            Some("DUKE")
        );
        assert_eq!(
            map(rules, "OU=JavaSoft,O=Sun Microsystems,C=US").as_deref(),
            Some("OU=JavaSoft,O=Sun Microsystems,C=US")
        );
        assert_eq!(map("DEFAULT", "CN=a,OU=b").as_deref(), Some("CN=a,OU=b"));
    }

    #[test]
    fn no_matching_rule_is_none() {
        assert_eq!(map("RULE:^CN=(.*?),OU=x$/$1/", "CN=a,OU=y"), None);
    }

    #[test]
    fn escaped_slash_comma_and_literal_group_references() {
        assert_eq!(
            map(r"RULE:^CN=([^,]*),OU=a\/b$/$1\/x/", "CN=u,OU=a/b").as_deref(),
            Some("u/x")
        );
        // $2 with one group stays literal, as Kafka's escapeLiteralBackReferences does.
        assert_eq!(
            map("RULE:^CN=(.*)$/$1-$2/", "CN=u").as_deref(),
            Some("u-$2")
        );
        // $12 with one group is $1 then '2'.
        assert_eq!(map("RULE:^CN=(.*)$/$12/", "CN=u").as_deref(), Some("u2"));
        // Rules with commas inside patterns (as `[^,]`) are split correctly.
        assert_eq!(
            map(r"RULE:^CN=([^,]+),.*$/$1/L, DEFAULT", "CN=ADMIN,OU=x").as_deref(),
            Some("admin")
        );
    }

    #[test]
    fn invalid_rules_are_refused() {
        for bad in [
            "RULE:^CN=(.*)$/$1/X",
            "RULE:^CN=(.*)$/$1",
            "BOGUS",
            "RULE:(/x/",
        ] {
            assert!(SslPrincipalMapper::from_rules(bad).is_err(), "{bad}");
        }
        assert!(SslPrincipalMapper::from_rules("").is_ok());
    }
}
