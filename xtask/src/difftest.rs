//! `cargo xtask difftest`: the same request sequences against gregor and the reference Apache
//! Kafka broker, responses compared field by field.
//!
//! Scenarios are data: `xtask/difftest/*.json`, one file per API family. Each scenario is a list
//! of steps; a step is a request (`api`, `version`, `body`, built with the `kafka-protocol`
//! crate by `difftest_requests`) or a setup action (`setup: topic|produce|coordinator`) whose
//! answer is not compared. Both brokers run side by side on free ports; each scenario runs on
//! one connection to each, gregor first. Responses are decoded, turned into JSON trees and
//! normalised (throttle times, cluster ids, ports, uuids and error message texts differ
//! legitimately), then compared. A difference is *documented* when `docs/compatibility.md`
//! lists its scenario and field path; any other difference fails the run.

use crate::difftest_requests::{api_key, build_request, debug_to_json};
use crate::kafka;
use crate::proc::{self, repo_root, ChildGuard};
use anyhow::{anyhow, bail, Context, Result};
use bytes::{Buf, BytesMut};
use clap::Args;
use gregor_tests::process::GregorServer;
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct DifftestArgs {
    /// The gregor binary; default: target/release/gregor, else target/debug/gregor (the newer).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Run only scenarios whose name contains this.
    #[arg(long)]
    pub filter: Option<String>,
    /// Print both normalised responses of every step.
    #[arg(long)]
    pub verbose: bool,
}

/// Fields that legitimately differ between two brokers, removed everywhere before comparing.
const IGNORED_FIELDS: &[&str] = &[
    "throttle_time_ms",
    "cluster_id",
    "port",
    "unknown_tagged_fields",
];

/// How long a step with `retry_until_ok` or `retry_until_error` (or a setup action) keeps
/// retrying. `retry_until_ok` repeats a step while its response has an error code (a topic
/// being created); `retry_until_error` while it has none (a deleted topic still listed by a
/// broker whose metadata has not caught up: Kafka answers DeleteTopics once the controller has
/// committed, before its brokers apply it). `retry_until_configs` (`{"name": "value" | null}`)
/// repeats a DescribeConfigs until every resource shows each named config with that value (or
/// without it, for null): Kafka answers (Incremental)AlterConfigs once the controller has
/// committed, and its broker's DescribeConfigs shows the change only after the broker applied
/// it. Each compares the settled state, not the race.
const RETRY_DEADLINE_MS: u64 = 30_000;

struct Scenario {
    file: String,
    name: String,
    spec: Value,
}

/// The normalised response of one compared step.
struct Step {
    label: String,
    response: Value,
    /// Keyed objects (top-level fields) of which only the keys both brokers have are compared,
    /// e.g. ApiVersions' `api_keys`: the APIs one broker lacks are listed, not counted.
    common_only: Vec<String>,
}

struct Difference {
    scenario: String,
    step: String,
    path: String,
    gregor: String,
    kafka: String,
    documented: Option<String>,
}

pub fn run(args: &DifftestArgs) -> Result<i32> {
    let root = repo_root();
    let scenarios = load_scenarios(&root.join("xtask").join("difftest"), args.filter.as_deref())?;
    if scenarios.is_empty() {
        bail!("no scenarios matched");
    }
    let documented = load_documented(&root.join("docs").join("compatibility.md"))?;
    let binary = match &args.binary {
        Some(b) => b.clone(),
        None => default_binary(&root)?,
    };

    let work = root.join("target").join("difftest");
    std::fs::create_dir_all(&work)?;
    let ports = proc::free_ports(4)?;
    kafka::fetch()?;
    let instance = kafka::Instance::new(
        ports[2],
        Some(ports[3]),
        Some(work.join(format!("kafka-data-{}", ports[2]))),
    )?;
    let mut kafka_guard = ChildGuard::new("kafka", instance.spawn()?);
    let mut gregor = Gregor::start(&binary, &work, ports[0], ports[1])?;
    instance.wait_ready(|| kafka_guard.check_alive())?;
    gregor.wait_ready()?;
    let kafka_addr = instance.bootstrap();

    let mut diffs: Vec<Difference> = Vec::new();
    let mut failed_runs = 0usize;
    let mut notes: Vec<String> = Vec::new();
    for sc in &scenarios {
        let g = run_scenario(sc, &gregor.bootstrap);
        let k = run_scenario(sc, &kafka_addr);
        let (g, k) = match (g, k) {
            (Ok(g), Ok(k)) => (g, k),
            (g, k) => {
                failed_runs += 1;
                if let Err(e) = g {
                    println!("ERROR {}: against gregor: {e:#}", sc.name);
                }
                if let Err(e) = k {
                    println!("ERROR {}: against kafka: {e:#}", sc.name);
                }
                continue;
            }
        };
        for (gs, ks) in g.into_iter().zip(k) {
            let label = gs.label;
            let (mut gv, mut kv) = (gs.response, ks.response);
            for field in &gs.common_only {
                if let (Some(Value::Object(gm)), Some(Value::Object(km))) =
                    (gv.get_mut(field.as_str()), kv.get_mut(field.as_str()))
                {
                    let only_g: Vec<String> = gm
                        .keys()
                        .filter(|k| !km.contains_key(*k))
                        .cloned()
                        .collect();
                    let only_k: Vec<String> = km
                        .keys()
                        .filter(|k| !gm.contains_key(*k))
                        .cloned()
                        .collect();
                    gm.retain(|k, _| !only_g.contains(k));
                    km.retain(|k, _| !only_k.contains(k));
                    if !only_g.is_empty() || !only_k.is_empty() {
                        notes.push(format!(
                            "note: {} / {label} / {field}: only gregor [{}], only kafka [{}]",
                            sc.name,
                            only_g.join(","),
                            only_k.join(",")
                        ));
                    }
                }
            }
            let (gv, kv) = (&gv, &kv);
            if args.verbose {
                println!("---- {} / {label}\n gregor: {gv}\n kafka:  {kv}", sc.name);
            }
            let mut found = Vec::new();
            compare("", gv, kv, &mut found);
            for (path, gs, ks) in found {
                let doc = documented
                    .iter()
                    .find(|(s, p, _)| (s == "*" || *s == sc.name) && path_matches(&path, p))
                    .map(|(_, _, reason)| reason.clone());
                diffs.push(Difference {
                    scenario: sc.name.clone(),
                    step: label.clone(),
                    path,
                    gregor: gs,
                    kafka: ks,
                    documented: doc,
                });
            }
        }
        gregor.check_alive()?;
        kafka_guard.check_alive()?;
    }
    gregor.guard.stop()?;
    kafka_guard.stop()?;

    for n in &notes {
        println!("{n}");
    }
    for d in &diffs {
        let tag = if d.documented.is_some() {
            "documented"
        } else {
            "UNDOCUMENTED"
        };
        println!(
            "{tag}: {} / {} / {}: gregor={} kafka={}",
            d.scenario,
            d.step,
            d.path,
            clip(&d.gregor),
            clip(&d.kafka)
        );
    }
    let documented_count = diffs.iter().filter(|d| d.documented.is_some()).count();
    println!(
        "difftest: {} scenarios, {} differences, {} documented",
        scenarios.len(),
        diffs.len(),
        documented_count
    );
    let undocumented = diffs.len() - documented_count;
    if failed_runs > 0 {
        println!("difftest: {failed_runs} scenarios could not run");
    }
    Ok(i32::from(undocumented > 0 || failed_runs > 0))
}

fn clip(s: &str) -> String {
    if s.len() > 160 {
        let mut end = 160;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...({} chars)", &s[..end], s.len())
    } else {
        s.to_string()
    }
}

/// The newer of the release and debug binaries.
fn default_binary(root: &Path) -> Result<PathBuf> {
    let candidates: Vec<PathBuf> = ["release", "debug"]
        .iter()
        .map(|p| root.join("target").join(p).join("gregor"))
        .filter(|p| p.exists())
        .collect();
    candidates
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .ok_or_else(|| anyhow!("no gregor binary: run `cargo build -p gregor` (or --release)"))
}

/// A gregor server configured like the reference broker
/// (`gregor_tests::reference::Instance::server_properties`), so that both answer from the same
/// configuration.
pub struct Gregor;

impl Gregor {
    /// The settings the reference broker has that gregor's defaults do not.
    pub fn reference_settings() -> Vec<String> {
        [
            "num.partitions=1",
            "group.initial.rebalance.delay.ms=0",
            "offsets.topic.num.partitions=1",
            "offsets.topic.replication.factor=1",
        ]
        .iter()
        .map(ToString::to_string)
        .collect()
    }

    pub fn start(binary: &Path, work: &Path, port: u16, admin_port: u16) -> Result<GregorServer> {
        Self::start_with(binary, work, port, admin_port, &[])
    }

    pub fn start_with(
        binary: &Path,
        work: &Path,
        port: u16,
        admin_port: u16,
        extra: &[String],
    ) -> Result<GregorServer> {
        let mut sets = Self::reference_settings();
        sets.extend(extra.iter().cloned());
        GregorServer::start(binary, work, port, admin_port, &sets)
    }
}

fn load_scenarios(dir: &Path, filter: Option<&str>) -> Result<Vec<Scenario>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(&f)?;
        let doc: Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", f.display()))?;
        let file = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        for sc in doc
            .get("scenarios")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("{}: no \"scenarios\" array", f.display()))?
        {
            let name = sc
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| anyhow!("{}: a scenario without a name", f.display()))?
                .to_string();
            if !names.insert(name.clone()) {
                bail!("scenario name {name} is used twice");
            }
            if filter.is_some_and(|f| !name.contains(f)) {
                continue;
            }
            out.push(Scenario {
                file: file.clone(),
                name,
                spec: sc.clone(),
            });
        }
    }
    Ok(out)
}

/// `(scenario, field path pattern, reason)` rows of the table in docs/compatibility.md: lines
/// `| scenario | path | reason |` whose first two cells are in backticks.
fn load_documented(path: &Path) -> Result<Vec<(String, String, String)>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        if cells.len() < 3 {
            continue;
        }
        let unquote = |c: &str| {
            let c = c.trim();
            (c.len() >= 2 && c.starts_with('`') && c.ends_with('`'))
                .then(|| c[1..c.len() - 1].to_string())
        };
        if let (Some(s), Some(p)) = (unquote(cells[0]), unquote(cells[1])) {
            out.push((s, p, cells[2..].join("|").trim().to_string()));
        }
    }
    Ok(out)
}

/// Whether a difference at `path` is covered by `pattern`: equal after turning indices into
/// `[*]`, or the pattern is an ancestor of the path, or a bare field name that ends the path.
fn path_matches(path: &str, pattern: &str) -> bool {
    let generic = generic_path(path);
    let pattern = pattern.trim_start_matches('.');
    let generic = generic.trim_start_matches('.');
    let path = path.trim_start_matches('.');
    for p in [path, generic] {
        if p == pattern
            || p.starts_with(&format!("{pattern}."))
            || p.starts_with(&format!("{pattern}["))
        {
            return true;
        }
    }
    !pattern.contains(['.', '['])
        && generic
            .rsplit('.')
            .next()
            .is_some_and(|last| last.split('[').next() == Some(pattern))
}

fn generic_path(path: &str) -> String {
    let mut out = String::new();
    let mut in_index = false;
    for c in path.chars() {
        match c {
            '[' => {
                in_index = true;
                out.push_str("[*]");
            }
            ']' => in_index = false,
            _ if in_index => {}
            _ => out.push(c),
        }
    }
    out
}

/// One connection to one broker.
struct Conn {
    addr: String,
    stream: Option<TcpStream>,
    correlation_id: i32,
}

impl Conn {
    fn new(addr: &str) -> Self {
        Self {
            addr: addr.to_string(),
            stream: None,
            correlation_id: 0,
        }
    }

    fn stream(&mut self) -> Result<&mut TcpStream> {
        if self.stream.is_none() {
            let s = TcpStream::connect(&self.addr)
                .with_context(|| format!("connecting to {}", self.addr))?;
            s.set_read_timeout(Some(Duration::from_secs(30)))?;
            s.set_nodelay(true)?;
            self.stream = Some(s);
        }
        self.stream.as_mut().ok_or_else(|| anyhow!("no connection"))
    }

    /// Sends one request; `None` when no response is expected (acks=0) and the JSON tree of
    /// the decoded response otherwise (`{"connection_closed": true}` if the broker hung up).
    fn call(
        &mut self,
        api: ApiKey,
        version: i16,
        wire_version: i16,
        response_version: i16,
        body: &kafka_protocol::messages::RequestKind,
        expect_response: bool,
    ) -> Result<Option<Value>> {
        self.correlation_id += 1;
        let correlation_id = self.correlation_id;
        let header = RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(wire_version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("difftest")));
        let mut buf = BytesMut::new();
        header.encode(&mut buf, api.request_header_version(version))?;
        body.encode(&mut buf, version)
            .with_context(|| format!("encoding {api:?} v{version}"))?;
        let mut frame = i32::try_from(buf.len())?.to_be_bytes().to_vec();
        frame.extend_from_slice(&buf);
        if self.stream()?.write_all(&frame).is_err() {
            self.stream = None;
            return Ok(Some(serde_json::json!({"connection_closed": true})));
        }
        if !expect_response {
            return Ok(None);
        }
        let stream = self.stream()?;
        let mut len = [0u8; 4];
        if stream.read_exact(&mut len).is_err() {
            self.stream = None;
            return Ok(Some(serde_json::json!({"connection_closed": true})));
        }
        let len = usize::try_from(i32::from_be_bytes(len))?;
        let mut resp = vec![0u8; len];
        stream.read_exact(&mut resp)?;
        let mut bytes = bytes::Bytes::from(resp);
        let header =
            ResponseHeader::decode(&mut bytes, api.response_header_version(response_version))?;
        if header.correlation_id != correlation_id {
            bail!(
                "correlation id {} in response, sent {correlation_id}",
                header.correlation_id
            );
        }
        let decoded = ResponseKind::decode(api, &mut bytes, response_version)
            .with_context(|| format!("decoding {api:?} v{response_version} response"))?;
        let mut v = debug_to_json(&format!("{decoded:?}"))?;
        if bytes.has_remaining() {
            if let Value::Object(m) = &mut v {
                m.insert("trailing_bytes".into(), Value::from(bytes.remaining()));
            }
        }
        Ok(Some(v))
    }
}

/// Runs one scenario against one broker: the normalised response of each compared step.
fn run_scenario(sc: &Scenario, addr: &str) -> Result<Vec<Step>> {
    let mut conn = Conn::new(addr);
    let mut vars: BTreeMap<String, Value> = BTreeMap::new();
    let mut out = Vec::new();
    let prefix = format!("dt-{}", sc.name);
    let steps = sc
        .spec
        .get("steps")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("{}/{}: no steps", sc.file, sc.name))?;
    let scenario_ignores = strings(sc.spec.get("ignore"));
    for (i, raw_step) in steps.iter().enumerate() {
        let step = substitute(raw_step, &prefix, &vars);
        if let Some(kind) = step.get("setup").and_then(Value::as_str) {
            setup(&mut conn, kind, &step).with_context(|| format!("step {i}: setup {kind}"))?;
            continue;
        }
        let api_name = step
            .get("api")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("step {i}: no api"))?;
        let api = api_key(api_name)?;
        let version = i16::try_from(
            step.get("version")
                .and_then(Value::as_i64)
                .ok_or_else(|| anyhow!("step {i}: no version"))?,
        )?;
        let wire_version = step
            .get("wire_version")
            .and_then(Value::as_i64)
            .map_or(Ok(version), i16::try_from)?;
        let response_version = step
            .get("response_version")
            .and_then(Value::as_i64)
            .map_or(Ok(version), i16::try_from)?;
        let body = step.get("body").cloned().unwrap_or(Value::Null);
        let request = build_request(api, version, &body)?;
        let expect_response =
            !(api == ApiKey::Produce && body.get("acks").and_then(Value::as_i64) == Some(0));
        let flag = |key: &str| step.get(key).and_then(Value::as_bool).unwrap_or(false);
        let (retry_until_ok, retry_until_error) =
            (flag("retry_until_ok"), flag("retry_until_error"));
        let wanted_configs = step.get("retry_until_configs").and_then(Value::as_object);
        let start = Instant::now();
        let resp = loop {
            let resp = conn.call(
                api,
                version,
                wire_version,
                response_version,
                &request,
                expect_response,
            )?;
            let settled = match resp.as_ref() {
                None => true,
                Some(r) if retry_until_ok => !has_error(r),
                Some(r) if retry_until_error => has_error(r),
                Some(r) => wanted_configs.is_none_or(|w| configs_show(r, w)),
            };
            if settled || start.elapsed() > Duration::from_millis(RETRY_DEADLINE_MS) {
                break resp;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let resp = resp.unwrap_or_else(|| serde_json::json!({"no_response": true}));
        if let Some(save) = step.get("save").and_then(Value::as_object) {
            for (var, path) in save {
                let path = path.as_str().unwrap_or_default();
                let v = lookup(&resp, path)
                    .ok_or_else(|| anyhow!("step {i}: no {path} in response {resp} to save"))?;
                vars.insert(var.clone(), v.clone());
            }
        }
        if step.get("compare").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let mut ignores = scenario_ignores.clone();
        ignores.extend(strings(step.get("ignore")));
        let mut norm = resp;
        for (path, key) in step
            .get("key_by")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            key_by(&mut norm, path, key.as_str().unwrap_or_default());
        }
        // `keep: {"topics": [names]}`: of a keyed object, only these entries are compared
        // (e.g. a list of all topics holds other scenarios' topics too).
        for (path, names) in step
            .get("keep")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let names = strings(Some(names));
            if let Some(Value::Object(m)) = norm.get_mut(path.as_str()) {
                m.retain(|k, _| names.contains(k));
            }
        }
        normalise(&mut norm, "", &ignores);
        out.push(Step {
            label: format!("step {i} {api_name} v{version}"),
            response: norm,
            common_only: strings(step.get("common_only")),
        });
    }
    Ok(out)
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether every `results[*].configs` list of a DescribeConfigs response shows each wanted
/// config with the wanted value (a JSON null: the config is not listed).
fn configs_show(resp: &Value, wanted: &Map<String, Value>) -> bool {
    let results = resp.get("results").and_then(Value::as_array);
    results.into_iter().flatten().all(|result| {
        let configs = result.get("configs").and_then(Value::as_array);
        wanted.iter().all(|(name, want)| {
            let found = configs
                .into_iter()
                .flatten()
                .find(|c| c.get("name").and_then(Value::as_str) == Some(name.as_str()));
            match (found, want) {
                (None, Value::Null) => true,
                (Some(c), Value::String(_)) => c.get("value") == Some(want),
                _ => false,
            }
        })
    })
}

fn has_error(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, v)| {
            (k == "error_code" && v.as_i64().is_some_and(|c| c != 0)) || has_error(v)
        }),
        Value::Array(a) => a.iter().any(has_error),
        _ => false,
    }
}

/// Replaces `{s}` in strings by the scenario's topic/group prefix, and a string `$var` by the
/// saved value.
fn substitute(v: &Value, prefix: &str, vars: &BTreeMap<String, Value>) -> Value {
    match v {
        Value::String(s) => {
            if let Some(var) = s.strip_prefix('$') {
                if let Some(val) = vars.get(var) {
                    return val.clone();
                }
            }
            Value::String(s.replace("{s}", prefix))
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| substitute(x, prefix, vars)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.replace("{s}", prefix), substitute(x, prefix, vars)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `a.b[0].c` in a JSON tree.
fn lookup<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = v;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (name, rest) = part.split_once('[').unwrap_or((part, ""));
        if !name.is_empty() {
            cur = cur.get(name)?;
        }
        for idx in rest.split('[') {
            let idx = idx.trim_end_matches(']');
            if !idx.is_empty() {
                cur = cur.get(idx.parse::<usize>().ok()?)?;
            }
        }
    }
    Some(cur)
}

/// Turns the array at `path` (`[*]` walks every element) into an object keyed by each
/// element's `key` field, so that order does not matter and elements pair up by key.
fn key_by(v: &mut Value, path: &str, key: &str) {
    fn walk(v: &mut Value, parts: &[&str], key: &str) {
        let Some((first, rest)) = parts.split_first() else {
            if let Value::Array(a) = v {
                let mut m = Map::new();
                for item in a.drain(..) {
                    let k = match item.get(key) {
                        Some(Value::String(s)) => s.clone(),
                        Some(other) => other.to_string(),
                        None => continue,
                    };
                    m.insert(k, item);
                }
                *v = Value::Object(m);
            }
            return;
        };
        let (name, all) = match first.strip_suffix("[*]") {
            Some(n) => (n, true),
            None => (*first, false),
        };
        let Some(child) = v.get_mut(name) else {
            return;
        };
        if all {
            if let Value::Array(a) = child {
                for item in a {
                    walk(item, rest, key);
                }
            }
        } else {
            walk(child, rest, key);
        }
    }
    let parts: Vec<&str> = path.split('.').filter(|p| !p.is_empty()).collect();
    walk(v, &parts, key);
}

/// Removes what legitimately differs: [`IGNORED_FIELDS`], the step's ignore patterns; masks
/// uuids (except the nil uuid) and error message texts (not their presence).
fn normalise(v: &mut Value, path: &str, ignores: &[String]) {
    match v {
        Value::Object(m) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let child_path = format!("{path}.{k}");
                if IGNORED_FIELDS.contains(&k.as_str())
                    || ignores.iter().any(|p| path_matches(&child_path, p))
                {
                    m.remove(&k);
                    continue;
                }
                if let Some(child) = m.get_mut(&k) {
                    if k == "error_message" && child.is_string() {
                        *child = Value::String("<message>".into());
                    } else {
                        normalise(child, &child_path, ignores);
                    }
                }
            }
        }
        Value::Array(a) => {
            for (i, item) in a.iter_mut().enumerate() {
                normalise(item, &format!("{path}[{i}]"), ignores);
            }
        }
        Value::String(s) => *s = mask_uuids(s),
        _ => {}
    }
}

/// Replaces 36-character hyphenated uuids (other than the nil uuid) by `<uuid>`.
fn mask_uuids(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        if i + 36 <= b.len() && is_uuid(&b[i..i + 36]) {
            if b[i..i + 36].iter().all(|c| *c == b'0' || *c == b'-') {
                out.push_str(&s[i..i + 36]);
            } else {
                out.push_str("<uuid>");
            }
            i += 36;
        } else {
            let ch = s[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn is_uuid(b: &[u8]) -> bool {
    b.iter().enumerate().all(|(i, c)| match i {
        8 | 13 | 18 | 23 => *c == b'-',
        _ => c.is_ascii_hexdigit(),
    })
}

/// Field-by-field differences: `(path, gregor, kafka)`.
fn compare(path: &str, g: &Value, k: &Value, out: &mut Vec<(String, String, String)>) {
    match (g, k) {
        (Value::Object(gm), Value::Object(km)) => {
            let mut keys: Vec<&String> = gm.keys().chain(km.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let p = format!("{path}.{key}");
                match (gm.get(key), km.get(key)) {
                    (Some(a), Some(b)) => compare(&p, a, b, out),
                    (a, b) => out.push((p, show(a), show(b))),
                }
            }
        }
        (Value::Array(ga), Value::Array(ka)) => {
            if ga.len() != ka.len() {
                out.push((
                    format!("{path}.length"),
                    ga.len().to_string(),
                    ka.len().to_string(),
                ));
            }
            for (i, (a, b)) in ga.iter().zip(ka.iter()).enumerate() {
                compare(&format!("{path}[{i}]"), a, b, out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push((path.to_string(), a.to_string(), b.to_string())),
    }
}

fn show(v: Option<&Value>) -> String {
    v.map_or_else(|| "<absent>".to_string(), Value::to_string)
}

/// Setup actions, not compared: `topic` (create and wait until every partition has a leader),
/// `produce` (acks=all, must succeed), `coordinator` (wait until the group coordinator answers).
fn setup(conn: &mut Conn, kind: &str, step: &Value) -> Result<()> {
    let call = |conn: &mut Conn, api: ApiKey, version: i16, body: Value| -> Result<Value> {
        let req = build_request(api, version, &body)?;
        conn.call(api, version, version, version, &req, true)?
            .ok_or_else(|| anyhow!("no response"))
    };
    let retry = |conn: &mut Conn, api: ApiKey, version: i16, body: Value| -> Result<()> {
        let start = Instant::now();
        loop {
            let r = call(conn, api, version, body.clone())?;
            if !has_error(&r) {
                return Ok(());
            }
            if start.elapsed() > Duration::from_millis(RETRY_DEADLINE_MS) {
                bail!("{api:?} still fails after {RETRY_DEADLINE_MS} ms: {r}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    match kind {
        "topic" => {
            let name = step
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| anyhow!("setup topic needs a name"))?;
            let partitions = step.get("partitions").and_then(Value::as_i64).unwrap_or(1);
            let configs = step.get("configs").cloned().unwrap_or(Value::Null);
            let r = call(
                conn,
                ApiKey::CreateTopics,
                7,
                serde_json::json!({"topics": [{"name": name, "num_partitions": partitions,
                    "replication_factor": 1, "configs": configs}]}),
            )?;
            if has_error(&r) {
                bail!("creating {name}: {r}");
            }
            let parts: Vec<Value> = (0..partitions)
                .map(|p| serde_json::json!({"partition_index": p, "timestamp": -1}))
                .collect();
            retry(
                conn,
                ApiKey::ListOffsets,
                7,
                serde_json::json!({"topics": [{"name": name, "partitions": parts}]}),
            )
        }
        "produce" => {
            let body = step
                .get("body")
                .cloned()
                .ok_or_else(|| anyhow!("setup produce needs a body"))?;
            let r = call(conn, ApiKey::Produce, 9, body)?;
            if has_error(&r) {
                bail!("produce failed: {r}");
            }
            Ok(())
        }
        "coordinator" => {
            let group = step
                .get("group")
                .and_then(Value::as_str)
                .ok_or_else(|| anyhow!("setup coordinator needs a group"))?;
            retry(
                conn,
                ApiKey::FindCoordinator,
                4,
                serde_json::json!({"key": group}),
            )
        }
        other => bail!("unknown setup {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_match_patterns() {
        assert!(path_matches(
            ".topics[0].error_message",
            "topics[*].error_message"
        ));
        assert!(path_matches(".topics[0].error_message", "error_message"));
        assert!(path_matches(".api_keys.17.max_version", "api_keys"));
        assert!(path_matches(
            ".topics[2].partitions.length",
            "topics[*].partitions"
        ));
        assert!(!path_matches(".topics[0].error_code", "error_message"));
    }

    #[test]
    fn uuids_are_masked_but_not_nil() {
        assert_eq!(
            mask_uuids("consumer-1b4e28ba-2fa1-11d2-883f-0016d3cca427"),
            "consumer-<uuid>"
        );
        let nil = "00000000-0000-0000-0000-000000000000";
        assert_eq!(mask_uuids(nil), nil);
    }

    #[test]
    fn differences_have_paths() {
        let mut out = Vec::new();
        compare(
            "",
            &serde_json::json!({"a": [1, 2], "b": {"c": 1}}),
            &serde_json::json!({"a": [1], "b": {"c": 2, "d": 0}}),
            &mut out,
        );
        let paths: Vec<&str> = out.iter().map(|d| d.0.as_str()).collect();
        assert_eq!(paths, vec![".a.length", ".b.c", ".b.d"]);
    }
}
