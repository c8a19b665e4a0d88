//! SASL on a SASL_PLAINTEXT listener (issue 13), from clients we did not write where they can:
//! librdkafka with PLAIN (users from the JAAS config), SCRAM-SHA-256/512 and OAUTHBEARER
//! signed tokens (KIP-768, a JWKS served on 127.0.0.1 over http, and over https with the CA in
//! the JAAS `ssl.truststore.location`) including re-authentication (KIP-368)
//! and wrong passwords; the
//! Java client and `kafka-configs` (SCRAM-SHA-512 and OAUTHBEARER logins, adding, describing
//! and deleting SCRAM users, a wrong password); raw-protocol checks of what the clients do not
//! show: SCRAM-SHA-256/512 exchanges with credentials from `gregor storage format
//! --add-scram` (KIP-900, surviving a restart), the handshake rules (UNSUPPORTED_SASL_MECHANISM
//! with the enabled list, any other request before authentication closes the connection,
//! SaslHandshake v0 with raw tokens), session expiry and re-authentication, OAUTHBEARER
//! unsecured JWTs (an expired token fails, the session follows `exp`); and the credentials of
//! a 3-node cluster.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use gregor_network::sasl::ScramMechanism;
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialUpsertion;
use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, ApiKey,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse, MetadataRequest,
    MetadataResponse, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const CLUSTER_ID: &str = "MkU3OEVBNTcwNTJENDM2Qg";

/// A one-node cluster with a PLAINTEXT (inter-broker), a CONTROLLER and a SASL_PLAINTEXT
/// listener, formatted with SCRAM users; killed on drop.
struct SaslNode {
    child: Child,
    dir: tempfile::TempDir,
    plaintext: u16,
    sasl: u16,
}

impl Drop for SaslNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl SaslNode {
    fn start(extra: &[&str]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let ports = gregor_tests::process::free_ports(3)?;
        let (plaintext, controller, sasl) = (ports[0], ports[1], ports[2]);
        let lines = [
            "node.id=1".to_string(),
            "process.roles=broker,controller".into(),
            format!("listeners=PLAINTEXT://127.0.0.1:{plaintext},CONTROLLER://127.0.0.1:{controller},SASL_PLAINTEXT://127.0.0.1:{sasl}"),
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT".into(),
            "controller.listener.names=CONTROLLER".into(),
            "inter.broker.listener.name=PLAINTEXT".into(),
            format!("controller.quorum.voters=1@127.0.0.1:{controller}"),
            format!("log.dirs={}", dir.path().join("data").display()),
            "admin.listener=".into(),
            "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER".into(),
            r#"listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";"#.into(),
            "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;".into(),
        ];
        let mut lines = lines.to_vec();
        lines.extend(extra.iter().map(|s| (*s).to_string()));
        let config = dir.path().join("server.properties");
        std::fs::write(&config, lines.join("\n") + "\n")?;
        let out = Command::new(BIN)
            .args(["storage", "format", "-t", CLUSTER_ID, "-c"])
            .arg(&config)
            .args([
                "--add-scram",
                "SCRAM-SHA-256=[name=bob,password=bob-secret]",
                "--add-scram",
                "SCRAM-SHA-512=[name=carol,password=carol-secret,iterations=8192]",
            ])
            .output()?;
        ensure!(
            out.status.success(),
            "format failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let child = spawn(&config, dir.path())?;
        let node = Self {
            child,
            dir,
            plaintext,
            sasl,
        };
        node.wait_listening()?;
        Ok(node)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gregor.log")).unwrap_or_default()
    }

    fn wait_listening(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.plaintext));
        while gregor_tests::process::api_versions_ok(addr, 1_000).is_err() {
            ensure!(
                Instant::now() < deadline,
                "not listening; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn sasl_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.sasl))
    }
}

fn spawn(config: &Path, dir: &Path) -> Result<Child> {
    let log = std::fs::File::create(dir.join("gregor.log"))?;
    Command::new(BIN)
        .arg("serve")
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .context("spawning gregor")
}

fn client(node: &SaslNode, mechanism: &str, user: &str, password: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", format!("127.0.0.1:{}", node.sasl))
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanism", mechanism)
        .set("sasl.username", user)
        .set("sasl.password", password);
    c
}

/// Metadata through an authenticated librdkafka connection.
fn metadata_ok(config: &ClientConfig) -> Result<()> {
    let consumer: BaseConsumer = config.clone().set("group.id", "g").create()?;
    let md = consumer.fetch_metadata(None, Duration::from_secs(10))?;
    ensure!(
        md.brokers().len() == 1,
        "one broker: {:?}",
        md.brokers().len()
    );
    Ok(())
}

#[test]
fn librdkafka_logs_in_with_plain_and_wrong_passwords_fail() -> Result<()> {
    let node = SaslNode::start(&[])?;
    metadata_ok(&client(&node, "PLAIN", "alice", "alice-secret")).context("PLAIN")?;
    // librdkafka is built with OpenSSL (ssl-vendored): SCRAM with the users formatted in.
    metadata_ok(&client(&node, "SCRAM-SHA-256", "bob", "bob-secret")).context("SCRAM-SHA-256")?;
    metadata_ok(&client(&node, "SCRAM-SHA-512", "carol", "carol-secret"))
        .context("SCRAM-SHA-512")?;

    // Produce as a PLAIN user: requests after authentication are served.
    let producer: ThreadedProducer<DefaultProducerContext> =
        client(&node, "PLAIN", "alice", "alice-secret").create()?;
    producer
        .send(BaseRecord::to("sasl-topic").key("k").payload("v"))
        .map_err(|(e, _)| e)?;
    producer.flush(Duration::from_secs(30))?;
    ensure!(producer.in_flight_count() == 0);

    // Wrong passwords and unknown users fail, for every mechanism, and are logged.
    for (mechanism, user, password) in [
        ("PLAIN", "alice", "wrong"),
        ("PLAIN", "nobody", "alice-secret"),
        ("SCRAM-SHA-256", "bob", "wrong"),
        ("SCRAM-SHA-512", "carol", "bob-secret"),
        ("SCRAM-SHA-512", "bob", "bob-secret"),
        ("SCRAM-SHA-256", "nobody", "x"),
    ] {
        let config = client(&node, mechanism, user, password);
        let consumer: BaseConsumer = config.clone().set("group.id", "g").create()?;
        let r = consumer.fetch_metadata(None, Duration::from_secs(3));
        ensure!(
            r.is_err(),
            "{mechanism} {user}/{password} must fail, got metadata"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !node.log().contains("Failed authentication with 127.0.0.1") {
        ensure!(
            Instant::now() < deadline,
            "no failure logged:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    ensure!(
        node.log()
            .contains("Authentication failed: Invalid username or password"),
        "{}",
        node.log()
    );
    Ok(())
}

fn handshake(conn: &mut KafkaConn, version: i16, mechanism: &str) -> Result<SaslHandshakeResponse> {
    conn.call(
        ApiKey::SaslHandshake,
        version,
        &SaslHandshakeRequest::default().with_mechanism(sb(mechanism)),
    )
}

fn authenticate(
    conn: &mut KafkaConn,
    version: i16,
    token: &[u8],
) -> Result<SaslAuthenticateResponse> {
    conn.call(
        ApiKey::SaslAuthenticate,
        version,
        &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::copy_from_slice(token)),
    )
}

#[test]
fn handshake_rules_raw_tokens_and_session_expiry() -> Result<()> {
    let node = SaslNode::start(&["connections.max.reauth.ms=1500"])?;

    // An unknown mechanism: UNSUPPORTED_SASL_MECHANISM (33) with the enabled list, then closed.
    let mut c = KafkaConn::connect(node.sasl_addr(), "t")?;
    let r = handshake(&mut c, 1, "GSSAPI")?;
    ensure!(r.error_code == 33, "{r:?}");
    let names: Vec<&str> = r.mechanisms.iter().map(|m| m.as_str()).collect();
    ensure!(
        names == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"],
        "{names:?}"
    );
    ensure!(c.closed_by_peer(), "open after an unsupported mechanism");

    // Any request but ApiVersions/SaslHandshake before authentication closes the connection.
    let mut c = KafkaConn::connect(node.sasl_addr(), "t")?;
    c.send(ApiKey::Metadata, 12, &MetadataRequest::default())?;
    ensure!(c.closed_by_peer(), "Metadata served before authentication");

    // SaslHandshake v1 + SaslAuthenticate: a wrong password gets SASL_AUTHENTICATION_FAILED
    // (58) with Kafka's message, then the connection closes.
    let mut c = KafkaConn::connect(node.sasl_addr(), "t")?;
    ensure!(handshake(&mut c, 1, "PLAIN")?.error_code == 0);
    let r = authenticate(&mut c, 2, b"\0alice\0nope")?;
    ensure!(r.error_code == 58, "{r:?}");
    ensure!(
        r.error_message.as_deref() == Some("Authentication failed: Invalid username or password"),
        "{r:?}"
    );
    ensure!(c.closed_by_peer(), "open after a failed login");

    // Success: the session lifetime is connections.max.reauth.ms; requests are served until it
    // passes, and the next request after it closes the connection (KIP-368).
    let mut c = KafkaConn::connect(node.sasl_addr(), "t")?;
    ensure!(handshake(&mut c, 1, "PLAIN")?.error_code == 0);
    let r = authenticate(&mut c, 2, b"\0alice\0alice-secret")?;
    ensure!(r.error_code == 0 && r.session_lifetime_ms == 1500, "{r:?}");
    let md: MetadataResponse = c.call(ApiKey::Metadata, 12, &MetadataRequest::default())?;
    ensure!(md.brokers.len() == 1);
    // A second SaslAuthenticate on an authenticated connection: ILLEGAL_SASL_STATE (34).
    let r = authenticate(&mut c, 2, b"\0alice\0alice-secret")?;
    ensure!(r.error_code == 34, "{r:?}");
    std::thread::sleep(Duration::from_millis(1600));
    c.send(ApiKey::Metadata, 12, &MetadataRequest::default())?;
    ensure!(c.closed_by_peer(), "served after the session expired");

    // Re-authentication before expiry keeps the connection; another principal is refused.
    let mut c = KafkaConn::connect(node.sasl_addr(), "t")?;
    ensure!(handshake(&mut c, 1, "PLAIN")?.error_code == 0);
    ensure!(authenticate(&mut c, 2, b"\0alice\0alice-secret")?.error_code == 0);
    std::thread::sleep(Duration::from_millis(1100));
    ensure!(handshake(&mut c, 1, "PLAIN")?.error_code == 0);
    let r = authenticate(&mut c, 2, b"\0alice\0alice-secret")?;
    ensure!(r.error_code == 0 && r.session_lifetime_ms == 1500, "{r:?}");
    std::thread::sleep(Duration::from_millis(1000));
    let md: MetadataResponse = c.call(ApiKey::Metadata, 12, &MetadataRequest::default())?;
    ensure!(md.brokers.len() == 1, "served after re-authentication");

    // SaslHandshake v0: the tokens that follow are raw frames with no Kafka header.
    let mut c = KafkaConn::connect(node.sasl_addr(), "t")?;
    ensure!(handshake(&mut c, 0, "PLAIN")?.error_code == 0);
    let token = b"\0alice\0alice-secret";
    let mut raw = (token.len() as u32).to_be_bytes().to_vec();
    raw.extend_from_slice(token);
    c.send_raw(&raw)?;
    let Some(reply) = c.read_frame()? else {
        bail!("closed after a raw PLAIN token");
    };
    ensure!(reply.is_empty(), "PLAIN's empty server token: {reply:?}");
    let md: MetadataResponse = c.call(ApiKey::Metadata, 12, &MetadataRequest::default())?;
    ensure!(md.brokers.len() == 1);
    Ok(())
}

/// A SCRAM client exchange over SaslHandshake v1 + SaslAuthenticate v2 (RFC 5802, computed
/// from the password as a client does); returns the final response.
fn scram_login(
    conn: &mut KafkaConn,
    mechanism: gregor_network::sasl::ScramMechanism,
    user: &str,
    password: &str,
) -> Result<SaslAuthenticateResponse> {
    use base64::engine::general_purpose::STANDARD as B64;
    use base64::Engine;
    let m = mechanism;
    ensure!(handshake(conn, 1, m.mechanism_name())?.error_code == 0);
    let bare = format!("n={user},r=clientnonce123");
    let first = authenticate(conn, 2, format!("n,,{bare}").as_bytes())?;
    if first.error_code != 0 {
        return Ok(first);
    }
    let server_first = String::from_utf8(first.auth_bytes.to_vec())?;
    let mut nonce = "";
    let mut salt = Vec::new();
    let mut iterations = 0u32;
    for part in server_first.split(',') {
        if let Some(v) = part.strip_prefix("r=") {
            nonce = v;
        } else if let Some(v) = part.strip_prefix("s=") {
            salt = B64.decode(v)?;
        } else if let Some(v) = part.strip_prefix("i=") {
            iterations = v.parse()?;
        }
    }
    ensure!(nonce.starts_with("clientnonce123"), "{server_first}");
    let without_proof = format!("c=biws,r={nonce}");
    let auth_message = format!("{bare},{server_first},{without_proof}");
    let salted = m.salted_password(password.as_bytes(), &salt, iterations);
    let client_key = m.hmac(&salted, b"Client Key");
    let signature = m.hmac(&m.hash(&client_key), auth_message.as_bytes());
    let proof: Vec<u8> = client_key
        .iter()
        .zip(&signature)
        .map(|(a, b)| a ^ b)
        .collect();
    let last = authenticate(
        conn,
        2,
        format!("{without_proof},p={}", B64.encode(proof)).as_bytes(),
    )?;
    if last.error_code == 0 {
        // The server proves it knows the credential too.
        let expected = m.hmac(&m.hmac(&salted, b"Server Key"), auth_message.as_bytes());
        ensure!(
            last.auth_bytes.as_ref() == format!("v={}", B64.encode(expected)).as_bytes(),
            "server signature"
        );
    }
    Ok(last)
}

#[test]
fn scram_credentials_from_add_scram_log_in_and_wrong_passwords_fail() -> Result<()> {
    use gregor_network::sasl::ScramMechanism::{Sha256, Sha512};
    let mut node = SaslNode::start(&[])?;
    for (m, user, password, ok) in [
        (Sha256, "bob", "bob-secret", true),
        (Sha512, "carol", "carol-secret", true),
        (Sha256, "bob", "wrong", false),
        (Sha512, "carol", "bob-secret", false),
        // bob has no SCRAM-SHA-512 credential, carol none for SHA-256.
        (Sha512, "bob", "bob-secret", false),
        (Sha256, "nobody", "x", false),
    ] {
        let mut c = KafkaConn::connect(node.sasl_addr(), "t")?;
        let r = scram_login(&mut c, m, user, password)?;
        if ok {
            ensure!(r.error_code == 0, "{user}: {r:?}");
            let md: MetadataResponse = c.call(ApiKey::Metadata, 12, &MetadataRequest::default())?;
            ensure!(md.brokers.len() == 1);
        } else {
            ensure!(r.error_code == 58, "{user}/{password} must fail: {r:?}");
            ensure!(
                r.error_message.as_deref()
                    == Some(&*format!(
                        "Authentication failed during authentication due to invalid credentials with SASL mechanism {}",
                        m.mechanism_name()
                    )),
                "{r:?}"
            );
            ensure!(c.closed_by_peer(), "open after a failed SCRAM login");
        }
    }
    // The credentials are metadata records: they survive a restart.
    let _ = node.child.kill();
    let _ = node.child.wait();
    node.child = spawn(&node.dir.path().join("server.properties"), node.dir.path())?;
    node.wait_listening()?;
    let mut c = KafkaConn::connect(node.sasl_addr(), "t")?;
    ensure!(scram_login(&mut c, Sha512, "carol", "carol-secret")?.error_code == 0);
    Ok(())
}

fn kafka_tool(tool: &str, args: &[&str]) -> Result<String> {
    gregor_tests::reference::tool_output(tool, args)
}

/// Kafka's own tools: `kafka-configs` adds, describes and deletes SCRAM users
/// (AlterUserScramCredentials / DescribeUserScramCredentials); the new user then logs in, and
/// the Java client authenticates over SASL_PLAINTEXT with SCRAM-SHA-512 and OAUTHBEARER
/// (unsecured JWT) from a client.properties, and fails cleanly with a wrong password.
#[test]
fn kafka_configs_manages_scram_users_and_the_java_client_logs_in() -> Result<()> {
    if !gregor_tests::reference::jars_or_skip() {
        return Ok(());
    }
    let node = SaslNode::start(&[])?;
    let plain = format!("127.0.0.1:{}", node.plaintext);
    let sasl = format!("127.0.0.1:{}", node.sasl);
    // As Kafka's ScramControlManager, one request may name a user once: both mechanisms in
    // one command are DUPLICATE_RESOURCE, so they are added one command each.
    let add = |config: &str| {
        kafka_tool(
            "kafka-configs",
            &[
                "--bootstrap-server",
                &plain,
                "--alter",
                "--add-config",
                config,
                "--entity-type",
                "users",
                "--entity-name",
                "erin",
            ],
        )
    };
    let out = add(
        "SCRAM-SHA-256=[iterations=8192,password=erin-secret],SCRAM-SHA-512=[password=erin-512]",
    )?;
    ensure!(
        out.contains("A user credential cannot be altered twice in the same request"),
        "{out}"
    );
    for config in [
        "SCRAM-SHA-256=[iterations=8192,password=erin-secret]",
        "SCRAM-SHA-512=[password=erin-512]",
    ] {
        let out = add(config)?;
        ensure!(
            out.contains("Completed updating config for user erin"),
            "{out}"
        );
    }
    // `kafka-configs --describe --entity-type users` also sends DescribeClientQuotas (the
    // quota work, issue 13); the SCRAM part is DescribeUserScramCredentials, asked here.
    let describe = |users: &[&str]| -> Result<DescribeUserScramCredentialsResponse> {
        let mut c = KafkaConn::connect(SocketAddr::from(([127, 0, 0, 1], node.plaintext)), "t")?;
        c.call(
            ApiKey::DescribeUserScramCredentials,
            0,
            &DescribeUserScramCredentialsRequest::default().with_users(Some(
                users
                    .iter()
                    .map(|u| UserName::default().with_name(sb(u)))
                    .collect(),
            )),
        )
    };
    let credentials = |r: &DescribeUserScramCredentialsResponse, user: &str| -> Vec<(i8, i32)> {
        r.results
            .iter()
            .filter(|x| x.user.as_str() == user)
            .flat_map(|x| {
                x.credential_infos
                    .iter()
                    .map(|i| (i.mechanism, i.iterations))
            })
            .collect()
    };
    let r = describe(&["erin"])?;
    ensure!(credentials(&r, "erin") == [(1, 8192), (2, 4096)], "{r:?}");
    let r = describe(&["erin", "erin", "ghost"])?;
    let code = |user: &str| {
        r.results
            .iter()
            .find(|x| x.user.as_str() == user)
            .map(|x| x.error_code)
    };
    ensure!(
        code("erin") == Some(92) && code("ghost") == Some(91),
        "{r:?}"
    );
    let mut c = KafkaConn::connect(node.sasl_addr(), "t")?;
    ensure!(
        scram_login(
            &mut c,
            gregor_network::sasl::ScramMechanism::Sha256,
            "erin",
            "erin-secret"
        )?
        .error_code
            == 0
    );
    // kafka-configs checks iterations itself; the broker's own check, raw:
    // UNACCEPTABLE_CREDENTIAL (93) for too few, UNSUPPORTED_SASL_MECHANISM (33) for type 3.
    let mut c = KafkaConn::connect(SocketAddr::from(([127, 0, 0, 1], node.plaintext)), "t")?;
    let upsert = |name: &str, mechanism: i8, iterations: i32| {
        ScramCredentialUpsertion::default()
            .with_name(sb(name))
            .with_mechanism(mechanism)
            .with_iterations(iterations)
            .with_salt(Bytes::from_static(b"salt"))
            .with_salted_password(Bytes::from_static(&[7; 32]))
    };
    let r: AlterUserScramCredentialsResponse = c.call(
        ApiKey::AlterUserScramCredentials,
        0,
        &AlterUserScramCredentialsRequest::default()
            .with_upsertions(vec![upsert("few", 1, 100), upsert("mech", 3, 4096)]),
    )?;
    let code = |user: &str| {
        r.results
            .iter()
            .find(|x| x.user.as_str() == user)
            .map(|x| x.error_code)
    };
    ensure!(code("few") == Some(93) && code("mech") == Some(33), "{r:?}");

    // The Java client over SASL_PLAINTEXT with SCRAM-SHA-512.
    let props = node.dir.path().join("client.properties");
    std::fs::write(
        &props,
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n\
         sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"erin\" password=\"erin-512\";\n",
    )?;
    let props_s = props.display().to_string();
    let out = kafka_tool(
        "kafka-topics",
        &[
            "--bootstrap-server",
            &sasl,
            "--command-config",
            &props_s,
            "--create",
            "--topic",
            "java-scram",
            "--partitions",
            "1",
        ],
    )?;
    ensure!(out.contains("Created topic java-scram"), "{out}");

    // OAUTHBEARER with an unsecured JWT made by the Java client's default login handler.
    let oauth = node.dir.path().join("oauth.properties");
    std::fs::write(
        &oauth,
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n\
         sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub=\"dave\";\n",
    )?;
    let oauth_s = oauth.display().to_string();
    let out = kafka_tool(
        "kafka-topics",
        &[
            "--bootstrap-server",
            &sasl,
            "--command-config",
            &oauth_s,
            "--list",
        ],
    )?;
    ensure!(out.contains("java-scram"), "{out}");

    // A wrong password: the Java client reports the authentication failure.
    let bad = node.dir.path().join("bad.properties");
    std::fs::write(
        &bad,
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n\
         sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"erin\" password=\"nope\";\n",
    )?;
    let bad_s = bad.display().to_string();
    let out = kafka_tool(
        "kafka-topics",
        &[
            "--bootstrap-server",
            &sasl,
            "--command-config",
            &bad_s,
            "--list",
        ],
    )?;
    ensure!(
        out.contains("Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"),
        "{out}"
    );

    // Deleting a credential, and deleting one that does not exist.
    let out = kafka_tool(
        "kafka-configs",
        &[
            "--bootstrap-server",
            &plain,
            "--alter",
            "--delete-config",
            "SCRAM-SHA-512",
            "--entity-type",
            "users",
            "--entity-name",
            "erin",
        ],
    )?;
    ensure!(
        out.contains("Completed updating config for user erin"),
        "{out}"
    );
    let r = describe(&["erin"])?;
    ensure!(credentials(&r, "erin") == [(1, 8192)], "{r:?}");
    let out = kafka_tool(
        "kafka-configs",
        &[
            "--bootstrap-server",
            &plain,
            "--alter",
            "--delete-config",
            "SCRAM-SHA-512",
            "--entity-type",
            "users",
            "--entity-name",
            "erin",
        ],
    )?;
    ensure!(
        out.contains("Attempt to delete a user credential that does not exist"),
        "{out}"
    );
    Ok(())
}

/// AlterUserScramCredentials sent to each node of a 3-node cluster (forwarded to the active
/// controller from the others) reaches every node's image: DescribeUserScramCredentials on
/// every node shows each credential, which is what each node's SASL listener authenticates
/// against.
#[test]
fn scram_credentials_replicate_to_every_node_of_a_cluster() -> Result<()> {
    use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
    let config = ClusterConfig::combined(Implementation::Gregor(BIN.into()), 3);
    let mut cluster = Cluster::start(&config)?;
    cluster.wait_ready(Duration::from_secs(60))?;
    let addrs: Vec<SocketAddr> = cluster
        .nodes()
        .iter()
        .map(|n| -> Result<SocketAddr> { Ok(n.bootstrap().context("a broker listener")?.parse()?) })
        .collect::<Result<_>>()?;
    for (i, addr) in addrs.iter().enumerate() {
        let mut c = KafkaConn::connect(*addr, "t")?;
        let salted = ScramMechanism::Sha512.salted_password(b"pw", b"salt", 4096);
        let r: AlterUserScramCredentialsResponse = c.call(
            ApiKey::AlterUserScramCredentials,
            0,
            &AlterUserScramCredentialsRequest::default().with_upsertions(vec![
                ScramCredentialUpsertion::default()
                    .with_name(sb(&format!("user{i}")))
                    .with_mechanism(2)
                    .with_iterations(4096)
                    .with_salt(Bytes::from_static(b"salt"))
                    .with_salted_password(Bytes::from(salted)),
            ]),
        )?;
        ensure!(
            r.results.len() == 1 && r.results[0].error_code == 0,
            "node {i}: {r:?}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for addr in &addrs {
        loop {
            let mut c = KafkaConn::connect(*addr, "t")?;
            let r: DescribeUserScramCredentialsResponse = c.call(
                ApiKey::DescribeUserScramCredentials,
                0,
                &DescribeUserScramCredentialsRequest::default(),
            )?;
            let users: Vec<&str> = r.results.iter().map(|x| x.user.as_str()).collect();
            if users == ["user0", "user1", "user2"]
                && r.results
                    .iter()
                    .all(|x| x.credential_infos.len() == 1 && x.credential_infos[0].mechanism == 2)
            {
                break;
            }
            ensure!(Instant::now() < deadline, "{addr}: {r:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// `gregor_connections_opened_total` from the admin listener's /metrics.
fn connections_opened(admin_port: u16) -> Result<u64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", admin_port))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    let line = body
        .lines()
        .find(|l| l.starts_with("gregor_connections_opened_total"))
        .context("no gregor_connections_opened_total")?;
    Ok(line.rsplit(' ').next().context("a value")?.parse::<f64>()? as u64)
}

/// librdkafka re-authenticates (KIP-368) within the session lifetime the broker sends, so a
/// producer keeps its connections past many lifetimes: no new connection is opened and every
/// record is acknowledged. (Without re-authentication the broker would close each connection
/// at its first request after expiry and the count would grow.)
#[test]
fn librdkafka_reauthenticates_within_connections_max_reauth_ms() -> Result<()> {
    let admin = gregor_tests::free_port()?;
    let node = SaslNode::start(&[
        "connections.max.reauth.ms=1500",
        &format!("admin.listener=127.0.0.1:{admin}"),
    ])?;
    let producer: ThreadedProducer<DefaultProducerContext> =
        client(&node, "PLAIN", "alice", "alice-secret")
            .set("linger.ms", "0")
            .create()?;
    let send = |i: usize| -> Result<()> {
        producer
            .send(BaseRecord::to("reauth").key("k").payload(&format!("{i}")))
            .map_err(|(e, _)| e)?;
        producer.flush(Duration::from_secs(10))?;
        ensure!(
            producer.in_flight_count() == 0,
            "record {i} not acknowledged"
        );
        Ok(())
    };
    send(0)?;
    let before = connections_opened(admin)?;
    let started = Instant::now();
    let mut i = 1;
    while started.elapsed() < Duration::from_secs(6) {
        send(i)?;
        i += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let after = connections_opened(admin)?;
    ensure!(
        after == before,
        "{} connections opened during 4 session lifetimes (librdkafka did not re-authenticate?)",
        after - before
    );
    Ok(())
}

/// OAUTHBEARER over the wire with unsecured JWTs: an expired token gets Kafka's error challenge
/// and, after the client's 0x01, SASL_AUTHENTICATION_FAILED and a closed connection; a valid
/// one logs in as its `sub` with a session lifetime that follows its `exp` (KIP-368).
#[test]
fn oauthbearer_expired_token_fails_and_session_follows_exp() -> Result<()> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
    use base64::Engine;
    let node = SaslNode::start(&[])?;
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let jwt = |claims: String| {
        format!(
            "{}.{}.",
            B64URL.encode(r#"{"alg":"none"}"#),
            B64URL.encode(claims)
        )
    };
    let initial = |token: &str| format!("n,,\x01auth=Bearer {token}\x01\x01").into_bytes();

    let mut c = KafkaConn::connect(node.sasl_addr(), "t")?;
    ensure!(handshake(&mut c, 1, "OAUTHBEARER")?.error_code == 0);
    let expired = jwt(format!(r#"{{"sub":"dave","exp":{}}}"#, now_s - 60));
    let r = authenticate(&mut c, 2, &initial(&expired))?;
    ensure!(
        r.error_code == 0 && r.auth_bytes.as_ref() == br#"{"status":"invalid_token"}"#,
        "{r:?}"
    );
    let r = authenticate(&mut c, 2, b"\x01")?;
    ensure!(r.error_code == 58, "{r:?}");
    ensure!(c.closed_by_peer(), "open after an expired token");

    let mut c = KafkaConn::connect(node.sasl_addr(), "t")?;
    ensure!(handshake(&mut c, 1, "OAUTHBEARER")?.error_code == 0);
    let valid = jwt(format!(r#"{{"sub":"dave","exp":{}}}"#, now_s + 3));
    let r = authenticate(&mut c, 2, &initial(&valid))?;
    ensure!(
        r.error_code == 0 && (1..=3000).contains(&r.session_lifetime_ms),
        "{r:?}"
    );
    let md: MetadataResponse = c.call(ApiKey::Metadata, 12, &MetadataRequest::default())?;
    ensure!(md.brokers.len() == 1);
    // Past the token's expiry the next request closes the connection.
    std::thread::sleep(Duration::from_millis(
        u64::try_from(r.session_lifetime_ms)? + 100,
    ));
    c.send(ApiKey::Metadata, 12, &MetadataRequest::default())?;
    ensure!(c.closed_by_peer(), "served after the token expired");
    Ok(())
}

/// An ES256 key made now: its signing key and its JWK.
fn es256_key(kid: &str) -> Result<(jsonwebtoken::EncodingKey, serde_json::Value)> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
    use base64::Engine;
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let point = kp.public_key_raw();
    let jwk = serde_json::json!({
        "kty": "EC", "crv": "P-256", "use": "sig", "kid": kid,
        "x": B64URL.encode(&point[1..33]),
        "y": B64URL.encode(&point[33..65]),
    });
    Ok((
        jsonwebtoken::EncodingKey::from_ec_der(&kp.serialize_der()),
        jwk,
    ))
}

fn signed_jwt(
    key: &jsonwebtoken::EncodingKey,
    kid: &str,
    claims: &serde_json::Value,
) -> Result<String> {
    let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    h.kid = Some(kid.into());
    Ok(jsonwebtoken::encode(&h, claims, key)?)
}

/// Serves `body` as JSON to every HTTP GET on 127.0.0.1 (a JWKS endpoint); the thread ends
/// with the test process.
fn serve_jwks(body: String) -> Result<String> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok(format!("http://{addr}/jwks.json"))
}

/// Serves `body` as JSON to every HTTPS GET on 127.0.0.1, with a certificate for 127.0.0.1
/// signed by a CA made now; returns the URL and the CA's PEM. The thread ends with the test
/// process.
fn serve_jwks_https(body: String) -> Result<(String, String)> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    use std::io::{Read, Write};
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "JWKS test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_pem = ca_params.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])?.signed_by(&key, &issuer)?;
    let config = std::sync::Arc::new(
        rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )?,
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let Ok(conn) = rustls::ServerConnection::new(config.clone()) else {
                continue;
            };
            let mut s = rustls::StreamOwned::new(conn, tcp);
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            s.conn.send_close_notify();
            let _ = s.flush();
        }
    });
    Ok((format!("https://{addr}/jwks.json"), ca_pem))
}

/// KIP-768 with the JWKS over https: the broker trusts the CA named by `ssl.truststore.location`
/// in the listener's OAUTHBEARER JAAS options (gregor has no system trust store in this test's
/// eyes: the CA was made now), fetches the keys at start-up, and verifies a signed token with
/// them; a token signed by another key is refused.
#[test]
fn oauthbearer_jwks_over_https_with_a_truststore() -> Result<()> {
    let (key, jwk) = es256_key("k1")?;
    let (other_key, _) = es256_key("k1")?;
    let (url, ca_pem) = serve_jwks_https(serde_json::json!({ "keys": [jwk] }).to_string())?;
    let ca_dir = tempfile::tempdir()?;
    let ca = ca_dir.path().join("jwks-ca.pem");
    std::fs::write(&ca, ca_pem)?;
    let jaas = format!(
        "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ssl.truststore.location=\"{}\";",
        ca.display()
    );
    let node = SaslNode::start(&[
        "listener.name.sasl_plaintext.oauthbearer.sasl.server.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
        &format!("listener.name.sasl_plaintext.sasl.oauthbearer.jwks.endpoint.url={url}"),
        &jaas,
        "sasl.oauthbearer.expected.audience=gregor",
        "sasl.oauthbearer.expected.issuer=https://idp.test",
    ])?;
    let now_s = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs(),
    )?;
    let claims = serde_json::json!({"sub": "erin", "aud": "gregor", "iss": "https://idp.test", "iat": now_s, "exp": now_s + 600});
    librdkafka_oauth_metadata(
        &node,
        signed_jwt(&key, "k1", &claims)?,
        (now_s + 600) * 1000,
    )?;
    ensure!(
        librdkafka_oauth_metadata(
            &node,
            signed_jwt(&other_key, "k1", &claims)?,
            (now_s + 600) * 1000
        )
        .is_err(),
        "a token signed by a key not in the JWKS logged in"
    );
    ensure!(
        node.log().contains("signature is invalid"),
        "{}",
        node.log()
    );
    Ok(())
}

/// librdkafka's OAUTHBEARER token refresh callback, handing out a fixed token.
struct StaticToken {
    token: String,
    exp_ms: i64,
}

impl rdkafka::ClientContext for StaticToken {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(
        &self,
        _: Option<&str>,
    ) -> std::result::Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        Ok(rdkafka::client::OAuthToken {
            token: self.token.clone(),
            principal_name: "erin".into(),
            lifetime_ms: self.exp_ms,
        })
    }
}

impl rdkafka::consumer::ConsumerContext for StaticToken {}

/// Metadata through librdkafka logged in over OAUTHBEARER with `token`.
fn librdkafka_oauth_metadata(node: &SaslNode, token: String, exp_ms: i64) -> Result<()> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", format!("127.0.0.1:{}", node.sasl))
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanism", "OAUTHBEARER")
        .set("group.id", "g");
    let consumer: BaseConsumer<StaticToken> =
        c.create_with_context(StaticToken { token, exp_ms })?;
    // Serves the token refresh event that librdkafka queues at creation.
    let _ = consumer.poll(Duration::from_millis(200));
    let md = consumer.fetch_metadata(None, Duration::from_secs(5))?;
    ensure!(md.brokers().len() == 1);
    Ok(())
}

/// OAUTHBEARER with signed JWTs (KIP-768): the listener verifies ES256 tokens (key made now)
/// against a JWKS served over http on 127.0.0.1, with the expected audience and issuer.
/// librdkafka (token refresh callback) and the Java client (Kafka's
/// OAuthBearerLoginCallbackHandler with a token file as its token endpoint) log in with a good
/// token; a bad signature, a wrong audience and an expired token fail, the broker logging
/// why; the session lifetime follows `exp`.
#[test]
fn oauthbearer_signed_tokens_are_verified_with_a_jwks() -> Result<()> {
    let (key, jwk) = es256_key("k1")?;
    let (other_key, _) = es256_key("k1")?;
    let url = serve_jwks(serde_json::json!({ "keys": [jwk] }).to_string())?;
    let node = SaslNode::start(&[
        "listener.name.sasl_plaintext.oauthbearer.sasl.server.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
        &format!("listener.name.sasl_plaintext.sasl.oauthbearer.jwks.endpoint.url={url}"),
        "sasl.oauthbearer.expected.audience=gregor",
        "sasl.oauthbearer.expected.issuer=https://idp.test",
    ])?;
    let now_s = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs(),
    )?;
    let claims = |aud: &str, exp: i64| serde_json::json!({"sub": "erin", "aud": aud, "iss": "https://idp.test", "iat": now_s, "exp": exp});
    let good = signed_jwt(&key, "k1", &claims("gregor", now_s + 600))?;
    librdkafka_oauth_metadata(&node, good.clone(), (now_s + 600) * 1000)?;
    for (token, why) in [
        (
            signed_jwt(&other_key, "k1", &claims("gregor", now_s + 600))?,
            "signature is invalid",
        ),
        (
            signed_jwt(&key, "k1", &claims("other", now_s + 600))?,
            "Audience (aud) claim",
        ),
        (
            signed_jwt(&key, "k1", &claims("gregor", now_s - 120))?,
            "The JWT is no longer valid",
        ),
    ] {
        ensure!(
            librdkafka_oauth_metadata(&node, token.clone(), (now_s + 600) * 1000).is_err(),
            "logged in although {why}"
        );
        ensure!(node.log().contains(why), "{why}: {}", node.log());
        // On the wire: Kafka's error challenge, then SASL_AUTHENTICATION_FAILED.
        let mut c = KafkaConn::connect(node.sasl_addr(), "t")?;
        ensure!(handshake(&mut c, 1, "OAUTHBEARER")?.error_code == 0);
        let initial = format!("n,,\x01auth=Bearer {token}\x01\x01");
        let r = authenticate(&mut c, 2, initial.as_bytes())?;
        ensure!(
            r.auth_bytes.as_ref() == br#"{"status":"invalid_token"}"#,
            "{r:?}"
        );
        ensure!(authenticate(&mut c, 2, b"\x01")?.error_code == 58);
    }
    // An unsecured JWT is refused on this listener.
    {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
        use base64::Engine;
        let unsecured = format!(
            "{}.{}.",
            B64URL.encode(r#"{"alg":"none"}"#),
            B64URL.encode(claims("gregor", now_s + 600).to_string())
        );
        ensure!(librdkafka_oauth_metadata(&node, unsecured, (now_s + 600) * 1000).is_err());
    }
    // The session lifetime follows exp.
    let now_s = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs(),
    )?;
    let short = signed_jwt(&key, "k1", &claims("gregor", now_s + 60))?;
    let mut c = KafkaConn::connect(node.sasl_addr(), "t")?;
    ensure!(handshake(&mut c, 1, "OAUTHBEARER")?.error_code == 0);
    let r = authenticate(
        &mut c,
        2,
        format!("n,,\x01auth=Bearer {short}\x01\x01").as_bytes(),
    )?;
    ensure!(
        r.error_code == 0 && (50_000..=61_000).contains(&r.session_lifetime_ms),
        "{r:?}"
    );

    // The Java client: Kafka's login callback handler reads the token from a file URL (the
    // token endpoint); Kafka 4 allows only the URLs named in a system property.
    if !gregor_tests::reference::jars_or_skip() {
        return Ok(());
    }
    let token_file = node.dir.path().join("token.jwt");
    let props = node.dir.path().join("oauth-signed.properties");
    let java_create = |token: &str| -> Result<String> {
        std::fs::write(&token_file, token)?;
        std::fs::write(
            &props,
            format!(
                "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n\
                 sasl.login.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler\n\
                 sasl.oauthbearer.token.endpoint.url=file://{}\n\
                 sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;\n",
                token_file.display()
            ),
        )?;
        let sasl = format!("127.0.0.1:{}", node.sasl);
        let props_s = props.display().to_string();
        let out = gregor_tests::reference::tool_command(
            "kafka-topics",
            &[
                "--bootstrap-server".into(),
                sasl,
                "--command-config".into(),
                props_s,
                "--create".into(),
                "--topic".into(),
                "java-oauth".into(),
                "--partitions".into(),
                "1".into(),
            ],
        )?
        .env(
            "JAVA_TOOL_OPTIONS",
            format!(
                "-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=file://{}",
                token_file.display()
            ),
        )
        .stdin(Stdio::null())
        .output()?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    };
    let out = java_create(&good)?;
    ensure!(out.contains("Created topic java-oauth"), "{out}");
    let out = java_create(&signed_jwt(
        &other_key,
        "k1",
        &claims("gregor", now_s + 600),
    )?)?;
    ensure!(out.contains("invalid_token"), "{out}");
    Ok(())
}
