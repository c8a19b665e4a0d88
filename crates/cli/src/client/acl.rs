//! `gregor acl add|list|remove`: ACLs with Kafka's `kafka-acls` concepts (principals, hosts,
//! operations, resources and their pattern type), through CreateAcls, DescribeAcls and
//! DeleteAcls (KIP-140). librdkafka's Rust binding has no ACL calls, so this command speaks the
//! Kafka protocol itself, over one plaintext connection to the first reachable bootstrap
//! server (`-X` properties, TLS and SASL do not apply to it).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context, Result};
use gregor_protocol::kafka_protocol::messages::create_acls_request::AclCreation;
use gregor_protocol::kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse, RequestHeader, ResponseHeader,
};
use gregor_protocol::kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use super::{ConnectionArgs, Output};

/// The largest response this command reads (a sanity bound).
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// `gregor acl`.
#[derive(clap::Args, Debug)]
pub struct AclArgs {
    #[command(subcommand)]
    command: AclCommand,
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t, global = true)]
    output: Output,
}

#[derive(clap::Subcommand, Debug)]
enum AclCommand {
    /// Add ACLs: every principal x host x operation x resource given (as `kafka-acls --add`).
    Add(BindingArgs),
    /// List ACLs, all or those of the resources given (as `kafka-acls --list`).
    List(ListArgs),
    /// Remove exactly the ACLs `add` with the same flags would add (as `kafka-acls --remove`).
    Remove(BindingArgs),
}

/// The resources an ACL command names.
#[derive(clap::Args, Debug, Default)]
struct Resources {
    /// A topic (`*`: every topic). Repeatable.
    #[arg(long)]
    topic: Vec<String>,
    /// A consumer group (`*`: every group). Repeatable.
    #[arg(long)]
    group: Vec<String>,
    /// The cluster (`kafka-cluster`).
    #[arg(long)]
    cluster: bool,
    /// A transactional id (`*`: every one). Repeatable.
    #[arg(long)]
    transactional_id: Vec<String>,
    /// A delegation token id. Repeatable.
    #[arg(long)]
    delegation_token: Vec<String>,
    /// A user principal name (for CREATE_TOKENS / DESCRIBE_TOKENS). Repeatable.
    #[arg(long)]
    user_principal: Vec<String>,
}

impl Resources {
    /// (resource type code, name) of every resource named.
    fn list(&self) -> Vec<(i8, String)> {
        let mut out = Vec::new();
        out.extend(self.topic.iter().map(|n| (2, n.clone())));
        out.extend(self.group.iter().map(|n| (3, n.clone())));
        if self.cluster {
            out.push((4, "kafka-cluster".to_string()));
        }
        out.extend(self.transactional_id.iter().map(|n| (5, n.clone())));
        out.extend(self.delegation_token.iter().map(|n| (6, n.clone())));
        out.extend(self.user_principal.iter().map(|n| (7, n.clone())));
        out
    }
}

#[derive(clap::Args, Debug)]
struct BindingArgs {
    /// A principal to allow, `Type:name` (e.g. `User:alice`, `User:*`). Repeatable.
    #[arg(long)]
    allow_principal: Vec<String>,
    /// A principal to deny. Repeatable.
    #[arg(long)]
    deny_principal: Vec<String>,
    /// Hosts (IP addresses) the allow ACLs apply to; default every host (`*`).
    #[arg(long)]
    allow_host: Vec<String>,
    /// Hosts the deny ACLs apply to; default every host (`*`).
    #[arg(long)]
    deny_host: Vec<String>,
    /// Operations: all, read, write, create, delete, alter, describe, cluster-action,
    /// describe-configs, alter-configs, idempotent-write, create-tokens, describe-tokens (Kafka's
    /// names, any case, `-` or `_`). Repeatable.
    #[arg(long, required = true)]
    operation: Vec<String>,
    /// How resource names match: literal (the name; `*` is every name) or prefixed.
    #[arg(long, default_value = "literal")]
    resource_pattern_type: String,
    #[command(flatten)]
    resources: Resources,
}

#[derive(clap::Args, Debug)]
struct ListArgs {
    /// Only the ACLs of this principal.
    #[arg(long)]
    principal: Option<String>,
    /// any (default: the names given, any pattern type), match (every ACL that applies to the
    /// names given, wildcards and prefixes included), literal or prefixed.
    #[arg(long, default_value = "any")]
    resource_pattern_type: String,
    #[command(flatten)]
    resources: Resources,
}

/// Kafka's `AclOperation` code of a name.
fn operation_code(name: &str) -> Result<i8> {
    let n = name.to_ascii_uppercase().replace('-', "_");
    Ok(match n.as_str() {
        "ALL" => 2,
        "READ" => 3,
        "WRITE" => 4,
        "CREATE" => 5,
        "DELETE" => 6,
        "ALTER" => 7,
        "DESCRIBE" => 8,
        "CLUSTER_ACTION" | "CLUSTERACTION" => 9,
        "DESCRIBE_CONFIGS" | "DESCRIBECONFIGS" => 10,
        "ALTER_CONFIGS" | "ALTERCONFIGS" => 11,
        "IDEMPOTENT_WRITE" | "IDEMPOTENTWRITE" => 12,
        "CREATE_TOKENS" | "CREATETOKENS" => 13,
        "DESCRIBE_TOKENS" | "DESCRIBETOKENS" => 14,
        _ => bail!("unknown operation {name:?}"),
    })
}

fn pattern_code(name: &str) -> Result<i8> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "any" => 1,
        "match" => 2,
        "literal" => 3,
        "prefixed" => 4,
        _ => bail!("unknown resource pattern type {name:?} (any, match, literal, prefixed)"),
    })
}

fn names(codes: &[(&str, i8)], code: i8) -> String {
    codes
        .iter()
        .find(|(_, c)| *c == code)
        .map_or_else(|| format!("UNKNOWN({code})"), |(n, _)| (*n).to_string())
}

fn resource_type_name(code: i8) -> String {
    names(
        &[
            ("TOPIC", 2),
            ("GROUP", 3),
            ("CLUSTER", 4),
            ("TRANSACTIONAL_ID", 5),
            ("DELEGATION_TOKEN", 6),
            ("USER", 7),
        ],
        code,
    )
}

fn pattern_name(code: i8) -> String {
    names(&[("LITERAL", 3), ("PREFIXED", 4)], code)
}

fn operation_name(code: i8) -> String {
    names(
        &[
            ("ALL", 2),
            ("READ", 3),
            ("WRITE", 4),
            ("CREATE", 5),
            ("DELETE", 6),
            ("ALTER", 7),
            ("DESCRIBE", 8),
            ("CLUSTER_ACTION", 9),
            ("DESCRIBE_CONFIGS", 10),
            ("ALTER_CONFIGS", 11),
            ("IDEMPOTENT_WRITE", 12),
            ("CREATE_TOKENS", 13),
            ("DESCRIBE_TOKENS", 14),
        ],
        code,
    )
}

fn permission_name(code: i8) -> String {
    names(&[("DENY", 2), ("ALLOW", 3)], code)
}

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// One ACL: (resource type, name, pattern type, principal, host, operation, permission).
type Binding = (i8, String, i8, String, String, i8, i8);

impl BindingArgs {
    /// Every ACL the flags name.
    fn bindings(&self) -> Result<Vec<Binding>> {
        let pattern = pattern_code(&self.resource_pattern_type)?;
        ensure!(
            pattern == 3 || pattern == 4,
            "--resource-pattern-type must be literal or prefixed here"
        );
        let resources = self.resources.list();
        ensure!(
            !resources.is_empty(),
            "name a resource: --topic, --group, --cluster, --transactional-id, \
             --delegation-token or --user-principal"
        );
        ensure!(
            !self.allow_principal.is_empty() || !self.deny_principal.is_empty(),
            "name a principal: --allow-principal or --deny-principal"
        );
        let ops = self
            .operation
            .iter()
            .map(|o| operation_code(o))
            .collect::<Result<Vec<_>>>()?;
        let star = vec!["*".to_string()];
        let mut out = Vec::new();
        for (permission, principals, hosts) in [
            (3i8, &self.allow_principal, &self.allow_host),
            (2i8, &self.deny_principal, &self.deny_host),
        ] {
            let hosts = if hosts.is_empty() { &star } else { hosts };
            for p in principals {
                ensure!(
                    p.contains(':'),
                    "principal {p:?} is not Type:name (e.g. User:alice)"
                );
                for h in hosts {
                    for op in &ops {
                        for (rt, name) in &resources {
                            out.push((
                                *rt,
                                name.clone(),
                                pattern,
                                p.clone(),
                                h.clone(),
                                *op,
                                permission,
                            ));
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

/// One plaintext connection to a broker.
struct Conn {
    stream: TcpStream,
    correlation_id: i32,
}

impl Conn {
    fn connect(connection: &ConnectionArgs) -> Result<Self> {
        // This client speaks the protocol itself, without librdkafka: `-X` security settings
        // would be ignored, so say so instead of failing later with an unreadable answer.
        if let Some((_, protocol)) = connection
            .client_properties
            .iter()
            .find(|(k, v)| k == "security.protocol" && !v.eq_ignore_ascii_case("plaintext"))
        {
            bail!(
                "gregor acl connects with PLAINTEXT only (-X security.protocol={protocol} is not \
                 supported here); use a PLAINTEXT listener, or Kafka's kafka-acls with \
                 --command-config"
            );
        }
        let mut errors = Vec::new();
        for server in connection.bootstrap_server.split(',').map(str::trim) {
            let hostport = server.split_once("://").map_or(server, |(_, rest)| rest);
            let addrs = match hostport.to_socket_addrs() {
                Ok(a) => a,
                Err(e) => {
                    errors.push(format!("{server}: {e}"));
                    continue;
                }
            };
            for addr in addrs {
                match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
                    Ok(stream) => {
                        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
                        return Ok(Self {
                            stream,
                            correlation_id: 0,
                        });
                    }
                    Err(e) => errors.push(format!("{addr}: {e}")),
                }
            }
        }
        bail!(
            "cannot connect to a bootstrap server: {}",
            errors.join(", ")
        )
    }

    fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &Req,
    ) -> Result<Resp> {
        self.correlation_id += 1;
        let mut buf: Vec<u8> = Vec::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(sb("gregor-acl")))
            .encode(&mut buf, key.request_header_version(version))?;
        req.encode(&mut buf, version)?;
        let len = i32::try_from(buf.len())?;
        self.stream.write_all(&len.to_be_bytes())?;
        self.stream.write_all(&buf)?;
        let mut size = [0u8; 4];
        self.stream
            .read_exact(&mut size)
            .with_context(|| format!("reading the {key:?} response (is this a Kafka listener? gregor acl connects with PLAINTEXT only: a SASL listener closes the connection)"))?;
        // A TLS listener answers bytes that are not Kafka's framing with a TLS alert record
        // (content type 21, version 3.x), which reads as a size of about 350 MB.
        ensure!(
            !(size[0] == 0x15 && size[1] == 0x03),
            "the listener answered with a TLS alert: it speaks SSL or SASL_SSL, and gregor acl \
             connects with PLAINTEXT only; use a PLAINTEXT listener, or Kafka's kafka-acls with \
             --command-config"
        );
        let size = usize::try_from(i32::from_be_bytes(size))
            .map_err(|_| anyhow!("negative response size"))?;
        ensure!(
            size <= MAX_RESPONSE_BYTES,
            "response of {size} bytes (is this a Kafka listener?)"
        );
        let mut body = vec![0u8; size];
        self.stream.read_exact(&mut body)?;
        let mut body: &[u8] = &body;
        let header = ResponseHeader::decode(&mut body, key.response_header_version(version))?;
        ensure!(
            header.correlation_id == self.correlation_id,
            "correlation id mismatch"
        );
        Resp::decode(&mut body, version).with_context(|| format!("decoding {key:?}"))
    }
}

fn error_text(code: i16, message: Option<&StrBytes>) -> String {
    let name = gregor_protocol::error::ErrorCode::from_code(code)
        .map_or_else(|| format!("error {code}"), |e| e.name().to_string());
    match message.filter(|m| !m.is_empty()) {
        Some(m) => format!("{name}: {m}"),
        None => name,
    }
}

fn print_bindings(bindings: &[Binding], output: Output) {
    match output {
        Output::Json => {
            let v: Vec<serde_json::Value> = bindings
                .iter()
                .map(|(rt, name, pt, p, h, op, perm)| {
                    serde_json::json!({
                        "resource_type": resource_type_name(*rt),
                        "resource_name": name,
                        "pattern_type": pattern_name(*pt),
                        "principal": p,
                        "host": h,
                        "operation": operation_name(*op),
                        "permission_type": permission_name(*perm),
                    })
                })
                .collect();
            println!("{}", serde_json::Value::Array(v));
        }
        Output::Table => {
            let mut last: Option<(i8, &str, i8)> = None;
            for (rt, name, pt, p, h, op, perm) in bindings {
                if last != Some((*rt, name.as_str(), *pt)) {
                    println!(
                        "{} {} ({}):",
                        resource_type_name(*rt),
                        name,
                        pattern_name(*pt)
                    );
                    last = Some((*rt, name.as_str(), *pt));
                }
                println!(
                    "  {} {} {} from {}",
                    permission_name(*perm),
                    p,
                    operation_name(*op),
                    h
                );
            }
        }
    }
}

/// Runs `gregor acl`.
///
/// # Errors
/// Bad flags, an unreachable broker, or the broker's refusal (e.g. SECURITY_DISABLED without
/// `authorizer.class.name`, CLUSTER_AUTHORIZATION_FAILED without Alter/Describe on the cluster).
pub async fn run(args: AclArgs) -> Result<()> {
    tokio::task::spawn_blocking(move || run_blocking(&args)).await?
}

fn run_blocking(args: &AclArgs) -> Result<()> {
    let mut conn = Conn::connect(&args.connection)?;
    match &args.command {
        AclCommand::Add(b) => {
            let bindings = b.bindings()?;
            let req = CreateAclsRequest::default().with_creations(
                bindings
                    .iter()
                    .map(|(rt, name, pt, p, h, op, perm)| {
                        AclCreation::default()
                            .with_resource_type(*rt)
                            .with_resource_name(sb(name))
                            .with_resource_pattern_type(*pt)
                            .with_principal(sb(p))
                            .with_host(sb(h))
                            .with_operation(*op)
                            .with_permission_type(*perm)
                    })
                    .collect(),
            );
            let r: CreateAclsResponse = conn.call(ApiKey::CreateAcls, 3, &req)?;
            let failed: Vec<String> = r
                .results
                .iter()
                .zip(&bindings)
                .filter(|(res, _)| res.error_code != 0)
                .map(|(res, (_, name, ..))| {
                    format!(
                        "{name}: {}",
                        error_text(res.error_code, res.error_message.as_ref())
                    )
                })
                .collect();
            ensure!(
                failed.is_empty(),
                "adding ACLs failed: {}",
                failed.join("; ")
            );
            if args.output == Output::Table {
                println!("Added {} ACL(s):", bindings.len());
            }
            print_bindings(&bindings, args.output);
        }
        AclCommand::Remove(b) => {
            let bindings = b.bindings()?;
            let req = DeleteAclsRequest::default().with_filters(
                bindings
                    .iter()
                    .map(|(rt, name, pt, p, h, op, perm)| {
                        DeleteAclsFilter::default()
                            .with_resource_type_filter(*rt)
                            .with_resource_name_filter(Some(sb(name)))
                            .with_pattern_type_filter(*pt)
                            .with_principal_filter(Some(sb(p)))
                            .with_host_filter(Some(sb(h)))
                            .with_operation(*op)
                            .with_permission_type(*perm)
                    })
                    .collect(),
            );
            let r: DeleteAclsResponse = conn.call(ApiKey::DeleteAcls, 3, &req)?;
            let mut removed = Vec::new();
            for res in &r.filter_results {
                ensure!(
                    res.error_code == 0,
                    "removing ACLs failed: {}",
                    error_text(res.error_code, res.error_message.as_ref())
                );
                removed.extend(res.matching_acls.iter().map(|m| {
                    (
                        m.resource_type,
                        m.resource_name.to_string(),
                        m.pattern_type,
                        m.principal.to_string(),
                        m.host.to_string(),
                        m.operation,
                        m.permission_type,
                    )
                }));
            }
            if args.output == Output::Table {
                println!("Removed {} ACL(s):", removed.len());
            }
            print_bindings(&removed, args.output);
        }
        AclCommand::List(l) => {
            let pattern = pattern_code(&l.resource_pattern_type)?;
            let mut resources: Vec<(i8, Option<String>)> = l
                .resources
                .list()
                .into_iter()
                .map(|(rt, n)| (rt, Some(n)))
                .collect();
            if resources.is_empty() {
                resources.push((1, None));
            }
            let mut all: Vec<Binding> = Vec::new();
            for (rt, name) in resources {
                let req = DescribeAclsRequest::default()
                    .with_resource_type_filter(rt)
                    .with_resource_name_filter(name.as_deref().map(sb))
                    .with_pattern_type_filter(if name.is_none() { 1 } else { pattern })
                    .with_principal_filter(l.principal.as_deref().map(sb))
                    .with_host_filter(None)
                    .with_operation(1)
                    .with_permission_type(1);
                let r: DescribeAclsResponse = conn.call(ApiKey::DescribeAcls, 3, &req)?;
                ensure!(
                    r.error_code == 0,
                    "listing ACLs failed: {}",
                    error_text(r.error_code, r.error_message.as_ref())
                );
                for res in &r.resources {
                    for a in &res.acls {
                        all.push((
                            res.resource_type,
                            res.resource_name.to_string(),
                            res.pattern_type,
                            a.principal.to_string(),
                            a.host.to_string(),
                            a.operation,
                            a.permission_type,
                        ));
                    }
                }
            }
            all.sort();
            all.dedup();
            print_bindings(&all, args.output);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_expand_as_kafka_acls() {
        let b = BindingArgs {
            allow_principal: vec!["User:a".into(), "User:b".into()],
            deny_principal: vec!["User:c".into()],
            allow_host: vec![],
            deny_host: vec!["10.0.0.1".into()],
            operation: vec!["Read".into(), "describe-configs".into()],
            resource_pattern_type: "PREFIXED".into(),
            resources: Resources {
                topic: vec!["t".into()],
                cluster: true,
                ..Resources::default()
            },
        };
        let all = b.bindings().unwrap();
        // (2 allow + 1 deny principals) x 1 host x 2 operations x 2 resources.
        assert_eq!(all.len(), 12);
        assert!(all.contains(&(2, "t".into(), 4, "User:a".into(), "*".into(), 3, 3)));
        assert!(all.contains(&(
            4,
            "kafka-cluster".into(),
            4,
            "User:c".into(),
            "10.0.0.1".into(),
            10,
            2
        )));
        assert!(operation_code("bogus").is_err());
        let bad = BindingArgs {
            allow_principal: vec!["alice".into()],
            ..b
        };
        assert!(bad.bindings().is_err(), "a principal needs its type");
    }
}
