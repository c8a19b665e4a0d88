//! Kafka's `sasl.jaas.config` syntax (`JaasConfig`): one login module,
//! `<class> <flag> [<key>=<value>]* ;`, values quoted (`"..."`, with `\` escapes) or bare.

use std::collections::BTreeMap;

/// A parsed `sasl.jaas.config` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JaasConfig {
    /// The login module class (`org.apache.kafka.common.security.plain.PlainLoginModule`).
    pub login_module: String,
    /// `required`, `requisite`, `sufficient` or `optional`.
    pub control_flag: String,
    /// The options, in order of their keys.
    pub options: BTreeMap<String, String>,
}

/// The PLAIN login module's class.
pub const PLAIN_LOGIN_MODULE: &str = "org.apache.kafka.common.security.plain.PlainLoginModule";
/// The SCRAM login module's class.
pub const SCRAM_LOGIN_MODULE: &str = "org.apache.kafka.common.security.scram.ScramLoginModule";
/// The OAUTHBEARER login module's class.
pub const OAUTHBEARER_LOGIN_MODULE: &str =
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule";

impl JaasConfig {
    /// Parses one login module entry, as Kafka's `JaasConfig` (which refuses none or several).
    ///
    /// # Errors
    /// A message naming what is wrong (never the values: they hold passwords).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut tokens = Tokenizer { rest: text.trim() };
        let login_module = tokens.word().ok_or("expected a login module class name")?;
        let control_flag = tokens
            .word()
            .ok_or("expected a control flag after the login module")?
            .to_ascii_lowercase();
        if !matches!(
            control_flag.as_str(),
            "required" | "requisite" | "sufficient" | "optional"
        ) {
            return Err(format!("invalid control flag {control_flag}"));
        }
        let mut options = BTreeMap::new();
        loop {
            tokens.skip_ws();
            if let Some(r) = tokens.rest.strip_prefix(';') {
                if !r.trim().is_empty() {
                    return Err("JAAS config entry for a single login module expected, found several or trailing text".into());
                }
                break;
            }
            let key = tokens.word().ok_or("expected an option key=value or ';'")?;
            tokens.skip_ws();
            tokens.rest = tokens
                .rest
                .strip_prefix('=')
                .ok_or_else(|| format!("expected '=' after option {key}"))?;
            tokens.skip_ws();
            let value = tokens
                .value()
                .ok_or_else(|| format!("invalid value for option {key}"))?;
            options.insert(key, value);
        }
        Ok(Self {
            login_module,
            control_flag,
            options,
        })
    }

    /// PlainLoginModule's users: `user_<name>="<password>"` options.
    pub fn plain_users(&self) -> BTreeMap<String, String> {
        self.options
            .iter()
            .filter_map(|(k, v)| k.strip_prefix("user_").map(|u| (u.to_string(), v.clone())))
            .collect()
    }
}

struct Tokenizer<'a> {
    rest: &'a str,
}

impl Tokenizer<'_> {
    fn skip_ws(&mut self) {
        self.rest = self.rest.trim_start();
    }

    fn word(&mut self) -> Option<String> {
        self.skip_ws();
        let end = self
            .rest
            .find(|c: char| c.is_whitespace() || c == ';' || c == '=')
            .unwrap_or(self.rest.len());
        if end == 0 {
            return None;
        }
        let (w, r) = self.rest.split_at(end);
        self.rest = r;
        Some(w.to_string())
    }

    fn value(&mut self) -> Option<String> {
        if let Some(r) = self.rest.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = r.char_indices();
            while let Some((i, c)) = chars.next() {
                match c {
                    '"' => {
                        self.rest = &r[i + 1..];
                        return Some(out);
                    }
                    '\\' => out.push(chars.next()?.1),
                    c => out.push(c),
                }
            }
            None
        } else {
            self.word()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_login_module() {
        let c = JaasConfig::parse(
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required
               username="admin" password="admin-secret"
               user_admin="admin-secret" user_alice="al\"ice; x" user_bob=bare;"#,
        )
        .unwrap();
        assert_eq!(c.login_module, PLAIN_LOGIN_MODULE);
        assert_eq!(c.control_flag, "required");
        let users = c.plain_users();
        assert_eq!(users.len(), 3);
        assert_eq!(users["alice"], "al\"ice; x");
        assert_eq!(users["bob"], "bare");
        assert_eq!(c.options["username"], "admin");
    }

    #[test]
    fn refuses_malformed_entries() {
        for bad in [
            "",
            "Module",
            "Module bogus;",
            "Module required user_a=\"x;",
            "Module required user_a;",
            "Module required; Other required;",
            "Module required user_a=\"x\"",
        ] {
            assert!(JaasConfig::parse(bad).is_err(), "{bad}");
        }
        let c = JaasConfig::parse("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule Required unsecuredValidatorRequiredScope=\"a b\" ;").unwrap();
        assert_eq!(c.control_flag, "required");
        assert_eq!(c.options["unsecuredValidatorRequiredScope"], "a b");
    }
}
