//! The operator commands of the `gregor` binary against a running gregor, run as a user would
//! run them (a child process per command), checked through `--output json`: `group list |
//! describe | reset-offsets | delete`, `config describe | set | delete`, `topic
//! delete-records` and `status`.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use gregor_tests::Gregor;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_gregor");

/// Runs `gregor ARGS -b <broker>` with `stdin`; returns (success, stdout, stderr).
fn run(g: &Gregor, args: &[&str], stdin: Option<&str>) -> Result<(bool, String, String)> {
    let mut child = Command::new(BIN)
        .args(args)
        .arg("-b")
        .arg(g.bootstrap())
        .env("RUST_BACKTRACE", "0")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running gregor {args:?}"))?;
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .context("no stdin")?
            .write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// `gregor ARGS`, which must succeed; its stdout.
fn ok(g: &Gregor, args: &[&str]) -> Result<String> {
    let (success, stdout, stderr) = run(g, args, None)?;
    ensure!(
        success,
        "gregor {args:?} failed:\n{stderr}\nserver log:\n{}",
        g.server_log()
    );
    Ok(stdout)
}

/// `gregor ARGS --output json`, parsed.
fn json(g: &Gregor, args: &[&str]) -> Result<Value> {
    let mut args = args.to_vec();
    args.extend(["--output", "json"]);
    let out = ok(g, &args)?;
    serde_json::from_str(out.trim()).with_context(|| format!("gregor {args:?} printed {out:?}"))
}

/// `gregor ARGS`, which must fail; its stderr.
fn fails(g: &Gregor, args: &[&str]) -> Result<String> {
    let (success, stdout, stderr) = run(g, args, None)?;
    ensure!(!success, "gregor {args:?} succeeded: {stdout}");
    Ok(stderr)
}

/// Produces `values` to `partition` of `topic` (so that tests know where records are).
fn produce(
    g: &Gregor,
    topic: &str,
    partition: i32,
    values: impl Iterator<Item = String>,
) -> Result<()> {
    let input: String = values.map(|v| v + "\n").collect();
    let p = partition.to_string();
    let args = ["produce", topic, "--acks", "all", "--partition", &p];
    let (success, _, stderr) = run(g, &args, Some(&input))?;
    ensure!(success, "produce failed: {stderr}");
    Ok(())
}

/// Values printed by `gregor consume`, one per line.
fn consume(g: &Gregor, args: &[&str]) -> Result<Vec<String>> {
    Ok(ok(g, args)?.lines().map(str::to_string).collect())
}

fn sum(offsets: &Value, field: &str) -> Result<i64> {
    offsets
        .as_array()
        .context("not an array")?
        .iter()
        .map(|o| o[field].as_i64().with_context(|| format!("{field} in {o}")))
        .sum()
}

fn group_state(g: &Gregor, group: &str) -> Result<Value> {
    json(g, &["group", "describe", group])
}

#[test]
fn consumer_group_lifecycle() -> Result<()> {
    let g = Gregor::start(BIN, &["group.initial.rebalance.delay.ms=0"])?;
    ok(&g, &["topic", "create", "orders", "--partitions", "2"])?;
    produce(&g, "orders", 0, (0..4).map(|i| format!("v{i}")))?;
    produce(&g, "orders", 1, (4..10).map(|i| format!("v{i}")))?;

    // Consume everything in group `g` (auto-commit), then produce 5 more: lag 5.
    let read = consume(
        &g,
        &[
            "consume",
            "orders",
            "--group",
            "g",
            "--from-beginning",
            "--max-messages",
            "10",
            "--timeout-ms",
            "20000",
        ],
    )?;
    assert_eq!(read.len(), 10, "{read:?}");
    produce(&g, "orders", 0, (10..12).map(|i| format!("v{i}")))?;
    produce(&g, "orders", 1, (12..15).map(|i| format!("v{i}")))?;

    let groups = json(&g, &["group", "list"])?;
    let listed = groups
        .as_array()
        .context("group list")?
        .iter()
        .find(|x| x["group"] == "g")
        .with_context(|| format!("g not in {groups}"))?;
    assert_eq!(listed["state"], "Empty");
    assert_eq!(listed["protocol_type"], "consumer");
    let stable = json(&g, &["group", "list", "--state", "stable"])?;
    assert!(
        !stable
            .as_array()
            .context("list")?
            .iter()
            .any(|x| x["group"] == "g"),
        "{stable}"
    );

    let described = group_state(&g, "g")?;
    assert_eq!(described["state"], "Empty");
    assert_eq!(described["members"].as_array().map(Vec::len), Some(0));
    let offsets = &described["offsets"];
    assert_eq!(offsets.as_array().map(Vec::len), Some(2), "{described}");
    assert_eq!(sum(offsets, "current_offset")?, 10);
    assert_eq!(sum(offsets, "log_end_offset")?, 15);
    assert_eq!(sum(offsets, "lag")?, 5);

    // `status` sees the topic and the group's lag (from the broker's metrics).
    let admin_url = format!("http://127.0.0.1:{}", g.admin_port);
    let status = json(&g, &["status", "--admin-url", &admin_url])?;
    assert!(
        status["topics"]
            .as_array()
            .context("topics")?
            .iter()
            .any(|t| t["name"] == "orders" && t["partitions"] == 2),
        "{status}"
    );
    assert_eq!(status["partition_count"], 2);
    assert!(status["uptime_seconds"].as_f64().unwrap_or(0.0) > 0.0);
    assert_eq!(status["ready"], true);
    let lags = status["largest_lags"].as_array().context("lags")?;
    let lag: f64 = lags
        .iter()
        .filter(|l| l["group"] == "g" && l["topic"] == "orders")
        .filter_map(|l| l["lag"].as_f64())
        .sum();
    assert!((lag - 5.0).abs() < f64::EPSILON, "{status}");
    let table = ok(&g, &["status", "--admin-url", &admin_url])?;
    assert!(table.contains("Largest consumer lags"), "{table}");

    // Dry runs plan without committing.
    let plan = json(
        &g,
        &[
            "group",
            "reset-offsets",
            "g",
            "--topic",
            "orders",
            "--to-earliest",
        ],
    )?;
    assert_eq!(plan["executed"], false);
    assert_eq!(sum(&plan["offsets"], "new_offset")?, 0);
    assert_eq!(sum(&plan["offsets"], "current_offset")?, 10);
    let plan = json(
        &g,
        &[
            "group",
            "reset-offsets",
            "g",
            "--topic",
            "orders:0",
            "--shift-by",
            "-1",
        ],
    )?;
    let rows = plan["offsets"].as_array().context("offsets")?;
    assert_eq!(rows.len(), 1, "{plan}");
    assert_eq!(rows[0]["partition"], 0);
    assert_eq!(
        rows[0]["new_offset"].as_i64(),
        rows[0]["current_offset"].as_i64().map(|c| (c - 1).max(0))
    );
    let plan = json(
        &g,
        &[
            "group",
            "reset-offsets",
            "g",
            "--all-topics",
            "--to-datetime",
            "2000-01-01T00:00:00Z",
        ],
    )?;
    assert_eq!(plan["offsets"].as_array().map(Vec::len), Some(2));
    assert_eq!(sum(&plan["offsets"], "new_offset")?, 0);
    let plan = json(
        &g,
        &[
            "group",
            "reset-offsets",
            "g",
            "--topic",
            "orders",
            "--to-offset",
            "1000",
        ],
    )?;
    assert_eq!(
        sum(&plan["offsets"], "new_offset")?,
        15,
        "clamped to the log end"
    );
    assert_eq!(sum(&group_state(&g, "g")?["offsets"], "lag")?, 5);

    // Execute: back to the start, and the group reads everything again.
    let done = json(
        &g,
        &[
            "group",
            "reset-offsets",
            "g",
            "--topic",
            "orders",
            "--to-earliest",
            "--execute",
        ],
    )?;
    assert_eq!(done["executed"], true);
    assert_eq!(sum(&group_state(&g, "g")?["offsets"], "lag")?, 15);
    let again = consume(
        &g,
        &[
            "consume",
            "orders",
            "--group",
            "g",
            "--max-messages",
            "15",
            "--timeout-ms",
            "20000",
        ],
    )?;
    let mut again_sorted = again.clone();
    again_sorted.sort();
    let mut expected: Vec<String> = (0..15).map(|i| format!("v{i}")).collect();
    expected.sort();
    assert_eq!(again_sorted, expected);
    assert_eq!(sum(&group_state(&g, "g")?["offsets"], "lag")?, 0);

    // With an active member: describe shows it and its assignment; resets and deletes refuse.
    let mut member = Command::new(BIN)
        .args(["consume", "orders", "--group", "g", "--timeout-ms", "8000"])
        .arg("-b")
        .arg(g.bootstrap())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let active = loop {
        let d = group_state(&g, "g")?;
        if d["state"] == "Stable" && d["members"].as_array().map(Vec::len) == Some(1) {
            break d;
        }
        if Instant::now() > deadline {
            let _ = member.kill();
            bail!("the member never became stable: {d}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let m = &active["members"][0];
    assert_eq!(m["client_id"], "rdkafka");
    assert_eq!(m["assignment"][0]["topic"], "orders");
    assert_eq!(
        m["assignment"][0]["partitions"],
        serde_json::json!([0, 1]),
        "{active}"
    );
    assert!(active["offsets"]
        .as_array()
        .context("offsets")?
        .iter()
        .all(|o| o["member_id"] == m["member_id"]));
    let err = fails(
        &g,
        &[
            "group",
            "reset-offsets",
            "g",
            "--all-topics",
            "--to-earliest",
        ],
    )?;
    assert!(
        err.contains(
            "Assignments can only be reset if the group 'g' is inactive, but the current state is Stable."
        ),
        "{err}"
    );
    let err = fails(&g, &["group", "delete", "g"])?;
    assert!(err.contains("could not be deleted"), "{err}");
    let status = member.wait()?;
    ensure!(status.success(), "the member exited with {status}");

    // Empty again: delete.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (success, _, stderr) = run(&g, &["group", "delete", "g"], None)?;
        if success {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "group delete kept failing: {stderr}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let groups = json(&g, &["group", "list"])?;
    assert!(
        !groups
            .as_array()
            .context("list")?
            .iter()
            .any(|x| x["group"] == "g"),
        "{groups}"
    );
    let err = fails(&g, &["group", "describe", "g"])?;
    assert!(err.contains("Consumer group 'g' does not exist."), "{err}");
    Ok(())
}

/// The configs set on `--topic`/`--broker` itself, name -> value.
fn dynamic_configs(g: &Gregor, entity: &[&str]) -> Result<Vec<(String, String)>> {
    let mut args = vec!["config", "describe"];
    args.extend(entity);
    let described = json(g, &args)?;
    let mut out: Vec<(String, String)> = described
        .as_array()
        .context("describe")?
        .iter()
        .filter(|e| e["source"] == "DYNAMIC_TOPIC_CONFIG" || e["source"] == "DYNAMIC_BROKER_CONFIG")
        .map(|e| {
            (
                e["name"].as_str().unwrap_or_default().to_string(),
                e["value"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    out.sort();
    Ok(out)
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

#[test]
fn config_round_trip() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    ok(&g, &["topic", "create", "conf"])?;
    let topic = ["--topic", "conf"];
    assert_eq!(dynamic_configs(&g, &topic)?, vec![]);

    ok(
        &g,
        &[
            "config",
            "set",
            "--topic",
            "conf",
            "retention.ms=100000",
            "cleanup.policy=compact",
        ],
    )?;
    assert_eq!(
        dynamic_configs(&g, &topic)?,
        pairs(&[("cleanup.policy", "compact"), ("retention.ms", "100000")])
    );
    // A second `set` keeps the values it does not name (AlterConfigs replaces the set).
    ok(
        &g,
        &["config", "set", "--topic", "conf", "retention.ms=200000"],
    )?;
    assert_eq!(
        dynamic_configs(&g, &topic)?,
        pairs(&[("cleanup.policy", "compact"), ("retention.ms", "200000")])
    );
    ok(
        &g,
        &["config", "delete", "--topic", "conf", "cleanup.policy"],
    )?;
    assert_eq!(
        dynamic_configs(&g, &topic)?,
        pairs(&[("retention.ms", "200000")])
    );
    let all = json(&g, &["config", "describe", "--topic", "conf", "--all"])?;
    let policy = all
        .as_array()
        .context("describe --all")?
        .iter()
        .find(|e| e["name"] == "cleanup.policy")
        .with_context(|| format!("no cleanup.policy in {all}"))?;
    assert_eq!(policy["value"], "delete");
    assert_ne!(policy["source"], "DYNAMIC_TOPIC_CONFIG");

    let err = fails(
        &g,
        &["config", "delete", "--topic", "conf", "no.such.config"],
    )?;
    assert!(err.contains("Invalid config(s): no.such.config"), "{err}");
    let err = fails(
        &g,
        &["config", "set", "--topic", "conf", "retention.ms=soon"],
    )?;
    assert!(err.contains("altering the configs of topic conf"), "{err}");
    assert!(err.contains("rejected"), "{err}");
    let err = fails(&g, &["config", "describe", "--topic", "missing"])?;
    assert!(err.contains("does the topic missing exist?"), "{err}");
    assert_eq!(
        dynamic_configs(&g, &topic)?,
        pairs(&[("retention.ms", "200000")])
    );

    let broker = ["--broker", "1"];
    ok(
        &g,
        &["config", "set", "--broker", "1", "log.retention.ms=123456"],
    )?;
    assert_eq!(
        dynamic_configs(&g, &broker)?,
        pairs(&[("log.retention.ms", "123456")])
    );
    let table = ok(&g, &["config", "describe", "--broker", "1"])?;
    assert!(
        table.contains("Dynamic configs for broker 1 are:"),
        "{table}"
    );
    assert!(table.contains("log.retention.ms"), "{table}");
    ok(
        &g,
        &["config", "delete", "--broker", "1", "log.retention.ms"],
    )?;
    assert_eq!(dynamic_configs(&g, &broker)?, vec![]);
    Ok(())
}

#[test]
fn delete_records_moves_the_log_start() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    ok(&g, &["topic", "create", "old", "--partitions", "1"])?;
    produce(&g, "old", 0, (0..10).map(|i| i.to_string()))?;
    let result = json(
        &g,
        &[
            "topic",
            "delete-records",
            "old",
            "--partition",
            "0",
            "--before",
            "4",
        ],
    )?;
    assert_eq!(
        result,
        serde_json::json!([{"topic": "old", "partition": 0, "low_watermark": 4}])
    );
    let first = consume(
        &g,
        &[
            "consume",
            "old",
            "--partition",
            "0",
            "--offset",
            "earliest",
            "--max-messages",
            "1",
            "--format",
            "%o:%v",
        ],
    )?;
    assert_eq!(first, vec!["4:4".to_string()]);
    let err = fails(
        &g,
        &[
            "topic",
            "delete-records",
            "old",
            "--partition",
            "0",
            "--before",
            "99",
        ],
    )?;
    assert!(err.contains("old-0"), "{err}");
    let table = ok(
        &g,
        &[
            "topic",
            "delete-records",
            "old",
            "--partition",
            "0",
            "--before",
            "end",
        ],
    )?;
    assert!(
        table.contains("partition: old-0\tlow_watermark: 10"),
        "{table}"
    );
    Ok(())
}

#[test]
fn status_explains_an_unreachable_admin_listener() -> Result<()> {
    let port = gregor_tests::free_port()?;
    let out = Command::new(BIN)
        .args(["status", "--admin-url", &format!("http://127.0.0.1:{port}")])
        .args(["-b", &format!("127.0.0.1:{port}")])
        .env("RUST_BACKTRACE", "0")
        .output()?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("admin listener"), "{err}");
    Ok(())
}

#[test]
fn consume_with_max_messages_commits_only_what_it_printed() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    let mut produce = Command::new(BIN)
        .args(["produce", "partial", "-b", &bs])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()?;
    {
        let mut stdin = produce.stdin.take().context("stdin")?;
        for i in 0..10 {
            writeln!(stdin, "r{i}")?;
        }
    }
    ensure!(produce.wait()?.success(), "produce failed");
    let read = |n: &str| -> Result<Vec<String>> {
        let out = Command::new(BIN)
            .args([
                "consume",
                "partial",
                "-b",
                &bs,
                "--group",
                "pg",
                "--from-beginning",
                "--max-messages",
                n,
                "--timeout-ms",
                "10000",
            ])
            .output()?;
        ensure!(
            out.status.success(),
            "consume failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?
            .lines()
            .map(str::to_string)
            .collect())
    };
    ensure!(read("4")? == ["r0", "r1", "r2", "r3"]);
    // The group resumes right after the fourth record.
    ensure!(read("6")? == ["r4", "r5", "r6", "r7", "r8", "r9"]);
    Ok(())
}

#[test]
fn client_commands_name_an_unreachable_broker_at_once() -> Result<()> {
    let port = gregor_tests::free_port()?;
    let address = format!("127.0.0.1:{port}");
    for args in [
        &["topic", "list"][..],
        &["produce", "t"],
        &["consume", "t", "--partition", "0"],
        &["group", "list"],
        &["config", "describe", "--topic", "t"],
        &["perf", "consume", "--topic", "t", "--num-records", "1"],
    ] {
        let started = Instant::now();
        // RUST_BACKTRACE=1 as many shells have it: a user's error still prints no backtrace.
        let out = Command::new(BIN)
            .args(args)
            .args(["-b", &address])
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success(), "gregor {args:?} succeeded");
        ensure!(
            started.elapsed() < Duration::from_secs(10),
            "gregor {args:?} took {:?} to fail",
            started.elapsed()
        );
        ensure!(
            err.contains(&address) && err.contains("Is the broker running"),
            "gregor {args:?}: {err}"
        );
        ensure!(
            err.starts_with("error: ") && !err.contains("backtrace"),
            "gregor {args:?}: {err}"
        );
    }
    Ok(())
}

#[test]
fn group_list_rejects_an_unknown_state() -> Result<()> {
    let out = Command::new(BIN)
        .args(["group", "list", "--state", "bogus"])
        .env("RUST_BACKTRACE", "0")
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "succeeded: {err}");
    ensure!(
        err.contains("valid states are") && err.contains("PreparingRebalance"),
        "{err}"
    );
    // Kafka's spellings in any case, comma-separated or repeated, are accepted.
    let g = Gregor::start(BIN, &[])?;
    let listed = json(
        &g,
        &[
            "group",
            "list",
            "--state",
            "stable,EMPTY",
            "--state",
            "dead",
        ],
    )?;
    ensure!(listed.is_array(), "{listed}");
    Ok(())
}

#[test]
fn interrupting_a_group_consumer_after_its_offsets_were_committed_exits_zero() -> Result<()> {
    let g = Gregor::start(BIN, &["group.initial.rebalance.delay.ms=0"])?;
    ok(&g, &["topic", "create", "sigint", "--partitions", "1"])?;
    produce(&g, "sigint", 0, (0..3).map(|i| format!("v{i}")))?;
    let child = Command::new(BIN)
        .args(["consume", "sigint", "--group", "gi", "--from-beginning"])
        .args(["-b", &g.bootstrap(), "-X", "auto.commit.interval.ms=100"])
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    // The auto-commit commits all three records while the consumer waits for more; Ctrl-C then
    // finds nothing left to commit, which is success (not "NoOffset").
    let committed = gregor_tests::process::poll(Duration::from_secs(30), || {
        let state = group_state(&g, "gi").ok()?;
        (sum(&state["offsets"], "current_offset").ok()? == 3).then_some(())
    });
    let signalled = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()?;
    let out = child.wait_with_output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(committed.is_some(), "offsets never committed: {err}");
    ensure!(signalled.success(), "kill -INT failed");
    ensure!(
        out.status.success(),
        "consume exited {:?}: {err}",
        out.status
    );
    ensure!(
        String::from_utf8_lossy(&out.stdout).lines().count() == 3,
        "{err}"
    );
    Ok(())
}

#[test]
fn version_names_the_git_revision() -> Result<()> {
    let out = Command::new(BIN).arg("--version").output()?;
    ensure!(out.status.success());
    let version = String::from_utf8(out.stdout)?;
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()?;
    let head = String::from_utf8(head.stdout)?;
    ensure!(
        version.starts_with(&format!("gregor {} (git ", env!("CARGO_PKG_VERSION")))
            && version.contains(head.trim()),
        "{version:?} does not name HEAD {head:?}"
    );
    Ok(())
}

#[test]
fn completions_and_manual_pages_are_generated() -> Result<()> {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(BIN).args(["completions", shell]).output()?;
        let script = String::from_utf8(out.stdout)?;
        ensure!(
            out.status.success() && script.contains("serve") && script.contains("consume"),
            "{shell}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if shell == "bash" {
            // The script parses, and defines the completion function bash looks for.
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("gregor.bash");
            std::fs::write(&path, &script)?;
            let check = Command::new("bash")
                .arg("-c")
                .arg(format!("source {} && complete -p gregor", path.display()))
                .output()?;
            ensure!(
                check.status.success(),
                "bash: {}",
                String::from_utf8_lossy(&check.stderr)
            );
        }
    }
    let out = Command::new(BIN).arg("man").output()?;
    let page = String::from_utf8(out.stdout)?;
    ensure!(
        out.status.success() && page.contains(".TH gregor 1"),
        "{page}"
    );
    ensure!(page.contains("serve"), "{page}");
    let dir = tempfile::tempdir()?;
    let out = Command::new(BIN)
        .args(["man", "--dir"])
        .arg(dir.path())
        .output()?;
    ensure!(out.status.success());
    for page in [
        "gregor.1",
        "gregor-serve.1",
        "gregor-storage-format.1",
        "gregor-group-list.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page))
            .with_context(|| format!("{page} not written"))?;
        ensure!(text.contains(".TH"), "{page}: {text}");
    }
    // A reader that goes away early ends the command quietly (success, or SIGPIPE's default
    // action as for other Unix tools: 141 in the shell), never with a panic.
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{BIN} completions bash | head -1; exit ${{PIPESTATUS[0]}}"
        ))
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        matches!(out.status.code(), Some(0 | 141)) && err.is_empty(),
        "{:?}: {err}",
        out.status
    );
    Ok(())
}

#[test]
fn a_reader_that_goes_away_ends_a_client_command_quietly() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    for i in 0..30 {
        ok(&g, &["topic", "create", &format!("pipe-{i}")])?;
    }
    for command in [
        "topic list",
        "topic describe",
        "config describe --broker 1 --all",
    ] {
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "{BIN} {command} -b {} | head -0; exit ${{PIPESTATUS[0]}}",
                g.bootstrap()
            ))
            .env("RUST_BACKTRACE", "1")
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        // Was: "failed printing to stdout: Broken pipe", a panic (101) and a backtrace.
        ensure!(
            matches!(out.status.code(), Some(0 | 141)) && !err.contains("panicked"),
            "{command}: {:?}: {err}",
            out.status
        );
    }
    Ok(())
}
