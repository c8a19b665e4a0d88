//! The test table of librdkafka's suite (`tests[]` in `tests/test.c`): every test's name,
//! flags and scenario, read from the source so that the list of tests to run follows the
//! librdkafka version rather than a copy kept here.

use anyhow::{bail, Result};

/// One entry of `tests[]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuiteTest {
    /// The test's name, e.g. `0011_produce_batch`.
    pub name: String,
    /// `TEST_F_LOCAL`: needs no broker (mock cluster or pure client code).
    pub local: bool,
    /// `TEST_F_MANUAL`: only run when named explicitly.
    pub manual: bool,
    /// `TEST_F_KNOWN_ISSUE` (not the `_WIN32`/`_OSX` variants, which are 0 on Linux): the
    /// suite skips it unless run with `-k`.
    pub known_issue: bool,
    /// `TEST_F_SOCKEM`: uses the socket emulator (client-side, works against any broker).
    pub sockem: bool,
    /// `.scenario = "..."`, `default` when not given. A test runs in every scenario whose
    /// name is a substring of this (test.c uses `strstr(scenario, test_scenario)`).
    pub scenario: String,
}

impl SuiteTest {
    /// The four-digit number the runner's `TESTS` variable matches (`0045` for all the
    /// `0045_*` tests).
    pub fn number(&self) -> &str {
        self.name.split('_').next().unwrap_or(&self.name)
    }

    /// Whether the runner runs it in `scenario`.
    pub fn in_scenario(&self, scenario: &str) -> bool {
        self.scenario.contains(scenario)
    }
}

/// Parses the `struct test tests[] = { ... {NULL}};` table of `test.c`.
///
/// # Errors
/// When the table is not found or an entry cannot be read.
pub fn parse(test_c: &str) -> Result<Vec<SuiteTest>> {
    let Some(start) = test_c.find("struct test tests[] = {") else {
        bail!("no `struct test tests[] = {{` in test.c");
    };
    let body = &test_c[start..];
    let Some(end) = body.find("{NULL}") else {
        bail!("the tests[] table of test.c has no {{NULL}} terminator");
    };
    let body = strip_comments(&body[..end]);
    let mut tests = Vec::new();
    let mut rest = body.as_str();
    while let Some(i) = rest.find("_TEST(") {
        // `_TEST_DECL(` does not occur in the table; `_TEST(` is the entry macro.
        let after = &rest[i + "_TEST(".len()..];
        let Some(len) = closing_paren(after) else {
            bail!(
                "unbalanced parentheses in a tests[] entry: {}",
                first_line(after)
            );
        };
        let args = &after[..len];
        tests.push(parse_entry(args)?);
        rest = &after[len..];
    }
    if tests.is_empty() {
        bail!("the tests[] table of test.c has no _TEST entries");
    }
    Ok(tests)
}

fn parse_entry(args: &str) -> Result<SuiteTest> {
    let mut parts = split_top_level(args).into_iter();
    let name = parts.next().unwrap_or_default();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        bail!("unexpected test name {name:?} in tests[]");
    }
    let flags = parts.next().unwrap_or_default();
    let flag_tokens: Vec<&str> = flags
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|t| !t.is_empty())
        .collect();
    let has = |f: &str| flag_tokens.contains(&f);
    let mut scenario = "default".to_string();
    for part in parts {
        if let Some(v) = part.strip_prefix(".scenario") {
            let v = v.trim_start().trim_start_matches('=').trim();
            scenario = v.trim_matches('"').to_string();
        }
    }
    Ok(SuiteTest {
        name,
        local: has("TEST_F_LOCAL"),
        manual: has("TEST_F_MANUAL"),
        known_issue: has("TEST_F_KNOWN_ISSUE"),
        sockem: has("TEST_F_SOCKEM"),
        scenario,
    })
}

/// Removes `/* ... */` and `// ...` comments (the table has both), leaving string literals
/// (which may hold `//`, as in a URL) alone.
fn strip_comments(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if c == '\\' {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_string = true;
                out.push(c);
            }
            ('/', Some('*')) => {
                chars.next();
                let mut prev = '\0';
                for n in chars.by_ref() {
                    if prev == '*' && n == '/' {
                        break;
                    }
                    prev = n;
                }
                out.push(' ');
            }
            ('/', Some('/')) => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// The index of the `)` closing an already opened `(`, skipping string literals.
fn closing_paren(s: &str) -> Option<usize> {
    let mut depth = 1usize;
    let mut in_string = false;
    let mut prev = '\0';
    for (i, c) in s.char_indices() {
        if in_string {
            if c == '"' && prev != '\\' {
                in_string = false;
            }
        } else {
            match c {
                '"' => in_string = true,
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(i);
                    }
                }
                _ => {}
            }
        }
        prev = c;
    }
    None
}

/// Splits macro arguments at the commas outside parentheses and strings, trimmed.
fn split_top_level(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut in_string = false;
    let mut prev = '\0';
    let mut current = String::new();
    for c in s.chars() {
        if in_string {
            if c == '"' && prev != '\\' {
                in_string = false;
            }
        } else {
            match c {
                '"' => in_string = true,
                '(' | '{' => depth += 1,
                ')' | '}' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    parts.push(current.trim().to_string());
                    current.clear();
                    prev = c;
                    continue;
                }
                _ => {}
            }
        }
        current.push(c);
        prev = c;
    }
    if !current.trim().is_empty() {
        parts.push(current.trim().to_string());
    }
    parts
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
_TEST_DECL(0000_unittests);
struct test tests[] = {
    /* Special MAIN test to hold over-all timings, etc. */
    {.name = "<MAIN>", .flags = TEST_F_LOCAL},
    _TEST(0000_unittests,
          TEST_F_LOCAL,
          /* The msgq insert order tests are heavy on
           * user CPU (memory scan), RSS, and
           * system CPU (lots of allocations -> madvise(2)). */
          _THRES(.ucpu = 100.0, .scpu = 20.0, .rss = 900.0)),
    _TEST(0001_multiobj, 0),
    _TEST(0028_long_topicnames,
          TEST_F_KNOWN_ISSUE,
          TEST_BRKVER(0, 9, 0, 0),
          .extra = "https://github.com/confluentinc/librdkafka/issues/529"), // x
    _TEST(0045_subscribe_update_topic_remove,
          0,
          TEST_BRKVER(0, 9, 0, 0),
          .scenario = "noautocreate"),
#if WITH_SOCKEM
    _TEST(0049_consume_conn_close, TEST_F_SOCKEM, TEST_BRKVER(0, 9, 0, 0)),
#endif
    _TEST(0055_producer_latency, TEST_F_KNOWN_ISSUE_WIN32),
    _TEST(0066_plugins,
          TEST_F_LOCAL | TEST_F_KNOWN_ISSUE_WIN32 | TEST_F_KNOWN_ISSUE_OSX,
          .extra =
              "dynamic loading of tests might not be fixed (for this) platform"),
    _TEST(0103_transactions,
          0,
          TEST_BRKVER(0, 11, 0, 0),
          .scenario = "default,ak23"),
    // a line comment with _TEST(9999_commented_out, 0)
    _TEST(8000_idle, TEST_F_MANUAL),
    {NULL}};
_TEST(9998_after_table, 0)
"#;

    #[test]
    fn parses_names_flags_and_scenarios() {
        let tests = parse(SAMPLE).unwrap();
        let names: Vec<&str> = tests.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "0000_unittests",
                "0001_multiobj",
                "0028_long_topicnames",
                "0045_subscribe_update_topic_remove",
                "0049_consume_conn_close",
                "0055_producer_latency",
                "0066_plugins",
                "0103_transactions",
                "8000_idle"
            ]
        );
        let by = |n: &str| tests.iter().find(|t| t.name == n).unwrap();
        assert!(by("0000_unittests").local);
        assert!(!by("0001_multiobj").local);
        assert!(by("0028_long_topicnames").known_issue);
        // The _WIN32/_OSX variants are not the Linux known-issue flag.
        assert!(!by("0055_producer_latency").known_issue);
        assert!(!by("0066_plugins").known_issue);
        assert!(by("0066_plugins").local);
        assert!(by("0049_consume_conn_close").sockem);
        assert!(by("8000_idle").manual);
        assert_eq!(
            by("0045_subscribe_update_topic_remove").scenario,
            "noautocreate"
        );
        assert!(!by("0045_subscribe_update_topic_remove").in_scenario("default"));
        assert!(by("0103_transactions").in_scenario("default"));
        assert!(by("0001_multiobj").in_scenario("default"));
        assert_eq!(by("0045_subscribe_update_topic_remove").number(), "0045");
    }

    #[test]
    fn rejects_a_missing_table() {
        assert!(parse("int main(void) { return 0; }").is_err());
        assert!(parse("struct test tests[] = {\n{NULL}};").is_err());
    }
}
