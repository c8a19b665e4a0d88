//! `xtask/rdkafka-suite/expectations.json`: what each test of librdkafka's suite does on
//! gregor, and why when it is not a pass.
//!
//! Every non-local, non-manual test of the suite's table has one entry:
//!
//! - `pass`: runs and must pass.
//! - `fail`: runs and is known to fail (a gregor bug another change fixes); it must fail, so
//!   that a fix shows up as a difference and the entry is moved to `pass`.
//! - `skip`: not run on gregor (it is still run on Kafka): it waits for a feature.
//! - `suite-skips`: runs, and the suite itself skips it (on Kafka as well), e.g. for want of
//!   a second broker.
//!
//! Anything but `pass` needs a `reason` that starts with what it waits for (see
//! [`REASON_PREFIXES`]): an issue (`issue 12 transactions`), a KIP, `gregor bug: ...`, or
//! that Kafka does the same (`fails on Kafka 4.4.0 too: ...`). `subtests` narrows a test to
//! the sub-tests whose name contains that string (the runner's `SUBTESTS`), with a reason
//! naming what the others wait for; `timeout` (seconds) overrides the per-runner time-out.
//! `ci` lists the tests `cargo xtask test` runs.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

use super::table::SuiteTest;
use crate::kafka::KAFKA_VERSION;

/// What a test is expected to do on gregor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expect {
    /// Runs and passes.
    Pass,
    /// Runs and fails (a known gregor bug).
    Fail,
    /// Not run on gregor.
    Skip,
    /// Runs; the suite skips it itself.
    SuiteSkips,
}

impl Expect {
    pub fn as_str(self) -> &'static str {
        match self {
            Expect::Pass => "pass",
            Expect::Fail => "fail",
            Expect::Skip => "skip",
            Expect::SuiteSkips => "suite-skips",
        }
    }
}

/// One test's entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub expect: Expect,
    #[serde(default)]
    pub reason: Option<String>,
    /// `SUBTESTS` for the runner: only sub-tests whose name contains this run.
    #[serde(default)]
    pub subtests: Option<String>,
    /// Time-out of the runner process for this test, in seconds.
    #[serde(default)]
    pub timeout: Option<u64>,
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expectations {
    /// Free text for readers of the file.
    #[serde(default, rename = "_comment")]
    pub _comment: Vec<String>,
    /// The librdkafka version whose test table the entries cover.
    pub librdkafka: String,
    /// The bounded subset `cargo xtask test` runs.
    pub ci: Vec<String>,
    pub tests: BTreeMap<String, Entry>,
}

/// How a reason must start: what the test waits for, or why it is not gregor's doing.
pub fn reason_prefixes() -> Vec<String> {
    vec![
        "issue ".to_string(),
        "KIP-".to_string(),
        "gregor bug: ".to_string(),
        format!("fails on Kafka {KAFKA_VERSION} too: "),
        format!("skipped on Kafka {KAFKA_VERSION} too: "),
        "librdkafka known issue: ".to_string(),
    ]
}

/// The prefix that says Kafka fails the test as well (checked against a Kafka run).
pub fn kafka_fails_too_prefix() -> String {
    format!("fails on Kafka {KAFKA_VERSION} too: ")
}

impl Expectations {
    /// Reads and checks the file against the suite's table.
    ///
    /// # Errors
    /// When it cannot be read or parsed, or [`Expectations::check`] fails.
    pub fn load(path: &Path, table: &[SuiteTest], librdkafka_version: &str) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let e: Expectations =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        e.check(table, librdkafka_version)
            .with_context(|| format!("checking {}", path.display()))?;
        Ok(e)
    }

    /// Checks that the entries are exactly the suite's broker tests, that every entry but a
    /// plain `pass` has a reason of the accepted forms, and that the CI tests are `pass`.
    ///
    /// # Errors
    /// Listing every problem found.
    pub fn check(&self, table: &[SuiteTest], librdkafka_version: &str) -> Result<()> {
        let mut problems = Vec::new();
        if self.librdkafka != librdkafka_version {
            problems.push(format!(
                "written for librdkafka {}, the suite is {librdkafka_version}: review every entry",
                self.librdkafka
            ));
        }
        let broker_tests: Vec<&SuiteTest> = table.iter().filter(|t| is_broker_test(t)).collect();
        for t in &broker_tests {
            if !self.tests.contains_key(&t.name) {
                problems.push(format!(
                    "{}: no entry (a test of the suite's table)",
                    t.name
                ));
            }
        }
        let prefixes = reason_prefixes();
        for (name, entry) in &self.tests {
            if !broker_tests.iter().any(|t| &t.name == name) {
                problems.push(format!(
                    "{name}: not a non-local, non-manual test of the suite's table"
                ));
            }
            let reason = entry.reason.as_deref().unwrap_or("").trim();
            let needs_reason = entry.expect != Expect::Pass || entry.subtests.is_some();
            if needs_reason && reason.is_empty() {
                problems.push(format!(
                    "{name}: `{}`{} needs a reason",
                    entry.expect.as_str(),
                    if entry.subtests.is_some() {
                        " with `subtests`"
                    } else {
                        ""
                    }
                ));
            } else if needs_reason && !prefixes.iter().any(|p| reason.starts_with(p.as_str())) {
                problems.push(format!(
                    "{name}: reason {reason:?} does not start with one of {prefixes:?}"
                ));
            }
            if entry.expect == Expect::Fail
                && !(reason.starts_with("gregor bug: ")
                    || reason.starts_with(kafka_fails_too_prefix().as_str()))
            {
                problems.push(format!(
                    "{name}: a known failure's reason starts with `gregor bug: ` or `{}`",
                    kafka_fails_too_prefix()
                ));
            }
            if entry.subtests.as_deref().is_some_and(str::is_empty) {
                problems.push(format!("{name}: empty `subtests`"));
            }
            if entry.timeout == Some(0) {
                problems.push(format!("{name}: `timeout` must be at least 1 s"));
            }
        }
        for name in &self.ci {
            match self.tests.get(name) {
                None => problems.push(format!("ci: {name} has no entry")),
                Some(e) if e.expect != Expect::Pass => {
                    problems.push(format!("ci: {name} is `{}`, not `pass`", e.expect.as_str()));
                }
                Some(_) => {}
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            bail!("{}", problems.join("\n"))
        }
    }

    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.tests.get(name)
    }
}

/// A test the suite runs against a broker: not local (`-L`), not manual.
pub fn is_broker_test(t: &SuiteTest) -> bool {
    !t.local && !t.manual
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<SuiteTest> {
        let t = |name: &str, local: bool| SuiteTest {
            name: name.into(),
            local,
            manual: false,
            known_issue: false,
            sockem: false,
            scenario: "default".into(),
        };
        vec![
            t("0001_multiobj", false),
            t("0004_conf", true),
            t("0011_produce_batch", false),
            t("0103_transactions", false),
        ]
    }

    fn parse(json: &str) -> Expectations {
        serde_json::from_str(json).unwrap()
    }

    const GOOD: &str = r#"{
        "_comment": ["x"],
        "librdkafka": "2.12.1",
        "ci": ["0001_multiobj"],
        "tests": {
            "0001_multiobj": {"expect": "pass"},
            "0011_produce_batch": {"expect": "fail", "reason": "gregor bug: record_errors (KIP-467)"},
            "0103_transactions": {"expect": "skip", "reason": "issue 12 transactions"}
        }
    }"#;

    #[test]
    fn a_complete_file_checks() {
        parse(GOOD).check(&table(), "2.12.1").unwrap();
    }

    #[test]
    fn names_every_problem() {
        let e = parse(
            r#"{
            "librdkafka": "2.11.0",
            "ci": ["0011_produce_batch", "0999_nope"],
            "tests": {
                "0001_multiobj": {"expect": "pass", "subtests": "without"},
                "0004_conf": {"expect": "pass"},
                "0011_produce_batch": {"expect": "fail", "reason": "issue 12 transactions"},
                "0999_nope": {"expect": "skip", "reason": "because"}
            }
        }"#,
        );
        let err = format!("{:#}", e.check(&table(), "2.12.1").unwrap_err());
        for needle in [
            "written for librdkafka 2.11.0",
            "0103_transactions: no entry",
            "0004_conf: not a non-local",
            "0999_nope: not a non-local",
            "0001_multiobj: `pass` with `subtests` needs a reason",
            "0999_nope: reason \"because\" does not start with",
            "0011_produce_batch: a known failure's reason",
            "ci: 0011_produce_batch is `fail`",
        ] {
            assert!(err.contains(needle), "{needle:?} missing from:\n{err}");
        }
    }

    /// The committed file: its reasons and CI list (the entries are checked against the
    /// suite's real table on every run of the command).
    #[test]
    fn the_committed_file_checks() {
        let e: Expectations =
            serde_json::from_str(include_str!("../../rdkafka-suite/expectations.json")).unwrap();
        let table: Vec<SuiteTest> = e
            .tests
            .keys()
            .map(|name| SuiteTest {
                name: name.clone(),
                local: false,
                manual: false,
                known_issue: false,
                sockem: false,
                scenario: "default".into(),
            })
            .collect();
        let version = e.librdkafka.clone();
        e.check(&table, &version).unwrap();
        assert!(!e.ci.is_empty());
    }

    #[test]
    fn unknown_fields_and_values_are_errors() {
        assert!(serde_json::from_str::<Expectations>(
            r#"{"librdkafka": "1", "ci": [], "tests": {"a": {"expect": "pass", "why": "x"}}}"#
        )
        .is_err());
        assert!(serde_json::from_str::<Expectations>(
            r#"{"librdkafka": "1", "ci": [], "tests": {"a": {"expect": "maybe"}}}"#
        )
        .is_err());
    }
}
