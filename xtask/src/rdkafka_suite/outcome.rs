//! What one `test-runner` process said about its tests: its closing summary table, its
//! `Test X PASSED/FAILED/SKIPPED` lines and `### Test "X" failed at ...` reports, read from
//! the process's combined output.

use super::expectations::Expect;
use std::collections::BTreeMap;

/// The result of one named test on one broker.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Passed,
    /// The runner's reason (its `failstr`: sub-test, function, line, message).
    Failed(String),
    /// Skipped by the runner itself, with its reason.
    Skipped(String),
    /// Still running when the runner process was killed at its time-out.
    TimedOut,
    /// Not run: deferred by the expectations file, or its runner never got to it.
    NotRun(String),
}

impl Outcome {
    /// `PASS`, `FAIL`, `SKIP`, `TIMEOUT` or `NOT RUN`, for the tables.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Passed => "PASS",
            Outcome::Failed(_) => "FAIL",
            Outcome::Skipped(_) => "SKIP",
            Outcome::TimedOut => "TIMEOUT",
            Outcome::NotRun(_) => "NOT RUN",
        }
    }

    /// The reason or failure text, empty for a pass.
    pub fn detail(&self) -> &str {
        match self {
            Outcome::Passed | Outcome::TimedOut => "",
            Outcome::Failed(s) | Outcome::Skipped(s) | Outcome::NotRun(s) => s,
        }
    }

    /// Whether this is what `expect` says.
    pub fn matches(&self, expect: Expect) -> bool {
        match expect {
            Expect::Pass => *self == Outcome::Passed,
            Expect::Fail => matches!(self, Outcome::Failed(_) | Outcome::TimedOut),
            Expect::Skip => matches!(self, Outcome::NotRun(_)),
            Expect::SuiteSkips => matches!(self, Outcome::Skipped(_)),
        }
    }
}

/// One row of the runner's summary table.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRow {
    pub state: String,
    pub seconds: f64,
    pub text: String,
}

/// Removes ANSI colour sequences (`ESC [ ... m`) and carriage returns.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else if chars.peek() == Some(&'(') {
                // `ESC ( B`: select the ASCII character set.
                chars.next();
                chars.next();
            }
        } else if c != '\r' {
            out.push(c);
        }
    }
    out
}

/// The summary table the runner prints at exit:
/// `| 0001_multiobj                            |     PASSED |   2.345s | reason`.
pub fn parse_summary(output: &str) -> BTreeMap<String, SummaryRow> {
    let mut rows = BTreeMap::new();
    for line in output.lines() {
        let Some(rest) = line.strip_prefix('|') else {
            continue;
        };
        let cells: Vec<&str> = rest.splitn(4, '|').collect();
        if cells.len() < 3 {
            continue;
        }
        let name = cells[0].trim();
        let state = cells[1].trim();
        let Some(seconds) = cells[2]
            .trim()
            .strip_suffix('s')
            .and_then(|s| s.trim().parse().ok())
        else {
            continue;
        };
        if name.is_empty() || !matches!(state, "PASSED" | "FAILED" | "SKIPPED" | "RUNNING" | "DNS")
        {
            continue;
        }
        rows.insert(
            name.to_string(),
            SummaryRow {
                state: state.to_string(),
                seconds,
                text: cells.get(3).map_or("", |s| s.trim()).to_string(),
            },
        );
    }
    rows
}

/// The first `### Test "NAME ..." failed at ...` report for `name` and the line after it.
pub fn first_failure(output: &str, name: &str) -> Option<String> {
    let head = format!("### Test \"{name}");
    let mut lines = output.lines();
    while let Some(line) = lines.next() {
        if let Some(i) = line.find(&head) {
            let at = line[i..].trim_end_matches('#').trim();
            let msg = lines.next().unwrap_or("").trim();
            return Some(format!("{at} {msg}").trim().to_string());
        }
    }
    None
}

/// How the runner process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited by itself with status 0 (all its tests passed or were skipped).
    Exited,
    /// It exited by itself with another status (the failed tests' count) or a signal.
    Failed,
    /// It was killed at its time-out.
    Killed,
}

/// The outcome of `name` from the output of a runner that was asked to run it.
pub fn outcome_of(output: &str, name: &str, exit: Exit) -> (Outcome, Option<f64>) {
    let summary = parse_summary(output);
    if let Some(row) = summary.get(name) {
        let outcome = match row.state.as_str() {
            "PASSED" => Outcome::Passed,
            "FAILED" => Outcome::Failed(if row.text.is_empty() {
                first_failure(output, name).unwrap_or_else(|| "failed".into())
            } else {
                row.text.clone()
            }),
            "SKIPPED" => Outcome::Skipped(row.text.clone()),
            "RUNNING" => Outcome::Failed(
                first_failure(output, name)
                    .unwrap_or_else(|| "still running when the runner exited".into()),
            ),
            _ => Outcome::NotRun("the runner did not start it".into()),
        };
        return (outcome, Some(row.seconds));
    }
    let done = |state: &str| output.contains(&format!("Test {name} {state} ="));
    let outcome = if done("PASSED") {
        Outcome::Passed
    } else if done("FAILED") {
        Outcome::Failed(first_failure(output, name).unwrap_or_else(|| "failed".into()))
    } else if done("SKIPPED") {
        Outcome::Skipped("skipped (no summary)".into())
    } else if output.contains(&format!("Running test {name} =")) {
        match exit {
            Exit::Killed => Outcome::TimedOut,
            Exit::Exited | Exit::Failed => {
                Outcome::Failed(first_failure(output, name).unwrap_or_else(|| {
                    "the runner exited during the test without a summary (crash?)".into()
                }))
            }
        }
    } else {
        match exit {
            Exit::Killed => Outcome::NotRun("the runner was killed before it started".into()),
            Exit::Exited => Outcome::Skipped("the runner did not run it (filtered)".into()),
            Exit::Failed => Outcome::Failed(format!(
                "the runner failed before it started: {}",
                output
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("no output")
            )),
        }
    };
    (outcome, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "\
[0001_multiobj / 0.001s] ================= Running test 0001_multiobj =================\n\
\u{1b}[32m[0001_multiobj / 2.1s] ================= Test 0001_multiobj PASSED =================\u{1b}[0m\n\
[0011_produce_batch / 0.0s] ================= Running test 0011_produce_batch =================\n\
\u{1b}[31m### Test \"0011_produce_batch (do_test_x:12: batch)\" failed at 0011-produce_batch.c:300:dr_cb() at Tue Dec  2 17:00:00 2025: ###\n\
Message delivery failed: Broker: Invalid record\n\
TEST 20251202 (bare, scenario default) SUMMARY\n\
#==================================================================#\n\
|\u{1b}[32m <MAIN>                                   |     PASSED |  10.000s \u{1b}[0m|\n\
|\u{1b}[32m 0001_multiobj                            |     PASSED |   2.100s \u{1b}[0m|\n\
|\u{1b}[31m 0011_produce_batch                       |     FAILED |   5.500s \u{1b}[0m|\u{1b}[31m do_test_x:12: batch: dr_cb():300: Message delivery failed | with a bar\u{1b}[0m\n\
|\u{1b}[36m 0016_client_swname                       |    SKIPPED |   0.000s \u{1b}[0m|\u{1b}[36m Env var BROKER_ADDRESS_2 missing (not running in trivup?)\u{1b}[0m\n\
#==================================================================#\n";

    #[test]
    fn reads_the_summary() {
        let out = strip_ansi(OUTPUT);
        let rows = parse_summary(&out);
        assert_eq!(rows.len(), 4);
        assert_eq!(rows["0001_multiobj"].state, "PASSED");
        assert!((rows["0011_produce_batch"].seconds - 5.5).abs() < 1e-9);
        assert_eq!(
            rows["0011_produce_batch"].text,
            "do_test_x:12: batch: dr_cb():300: Message delivery failed | with a bar"
        );
        assert_eq!(
            outcome_of(&out, "0001_multiobj", Exit::Exited).0,
            Outcome::Passed
        );
        assert_eq!(
            outcome_of(&out, "0016_client_swname", Exit::Exited).0,
            Outcome::Skipped("Env var BROKER_ADDRESS_2 missing (not running in trivup?)".into())
        );
        assert!(matches!(
            outcome_of(&out, "0011_produce_batch", Exit::Exited).0,
            Outcome::Failed(s) if s.starts_with("do_test_x:12")
        ));
    }

    #[test]
    fn without_a_summary_reads_the_progress_lines() {
        let out = strip_ansi(OUTPUT);
        let cut = &out[..out.find("TEST 2025").unwrap()];
        assert_eq!(
            outcome_of(cut, "0001_multiobj", Exit::Killed).0,
            Outcome::Passed
        );
        assert_eq!(
            outcome_of(cut, "0011_produce_batch", Exit::Killed).0,
            Outcome::TimedOut
        );
        match outcome_of(cut, "0011_produce_batch", Exit::Exited).0 {
            Outcome::Failed(s) => {
                assert!(s.contains("failed at 0011-produce_batch.c:300"), "{s}");
                assert!(
                    s.ends_with("Message delivery failed: Broker: Invalid record"),
                    "{s}"
                );
            }
            o => panic!("{o:?}"),
        }
        assert!(matches!(
            outcome_of(cut, "0012_produce_consume", Exit::Killed).0,
            Outcome::NotRun(_)
        ));
        assert!(matches!(
            outcome_of(cut, "0012_produce_consume", Exit::Exited).0,
            Outcome::Skipped(_)
        ));
        let broken = "test-runner: error while loading shared libraries: librdkafka++.so.1\n";
        assert_eq!(
            outcome_of(broken, "0012_produce_consume", Exit::Failed).0,
            Outcome::Failed(
                "the runner failed before it started: test-runner: error while loading \
                 shared libraries: librdkafka++.so.1"
                    .into()
            )
        );
    }

    #[test]
    fn outcomes_match_expectations() {
        let failed = Outcome::Failed("x".into());
        assert!(Outcome::Passed.matches(Expect::Pass));
        assert!(!failed.matches(Expect::Pass));
        assert!(!Outcome::Skipped("x".into()).matches(Expect::Pass));
        assert!(failed.matches(Expect::Fail));
        assert!(Outcome::TimedOut.matches(Expect::Fail));
        assert!(!Outcome::Passed.matches(Expect::Fail));
        assert!(Outcome::NotRun("x".into()).matches(Expect::Skip));
        assert!(!Outcome::Passed.matches(Expect::Skip));
        assert!(Outcome::Skipped("x".into()).matches(Expect::SuiteSkips));
        assert!(!Outcome::Passed.matches(Expect::SuiteSkips));
    }
}
