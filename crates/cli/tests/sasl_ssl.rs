//! SASL_SSL (issue 13): the TLS transport and the SASL authenticator on one listener, judged
//! by librdkafka (built with OpenSSL, so SCRAM works): PLAIN and SCRAM-SHA-512 log in over
//! TLS and produce and consume, a wrong password fails, a client that does not trust the
//! server's CA fails before SASL starts. Certificates are made at test time with rcgen, never
//! committed.
//!
//! `cargo test -p gregor --test sasl_ssl`

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use gregor_tests::clients::{consumer, producer, TIMEOUT};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const CLUSTER_ID: &str = "MkU3OEVBNTcwNTJENDM2Qg";
const PLAIN_JAAS: &str = r#"org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";"#;

/// A CA that signs certificates.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        Ok(Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A keystore PEM (key, then the certificate) for `cn`, valid for 127.0.0.1 and
    /// localhost (as a server and as a client).
    fn keystore(&self, cn: &str) -> Result<String> {
        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(format!("{}{}", key.serialize_pem(), cert.pem()))
    }
}

/// One combined node with a PLAINTEXT inter-broker listener, a PLAINTEXT controller listener
/// and a SASL_SSL listener (PLAIN with alice, SCRAM-SHA-512 with carol from `storage format
/// --add-scram`); killed on drop.
struct Node {
    child: Child,
    dir: tempfile::TempDir,
    plaintext: u16,
    sasl_ssl: u16,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    fn start() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let ca = Ca::new("gregor test CA")?;
        std::fs::write(dir.path().join("ca.pem"), &ca.pem)?;
        std::fs::write(dir.path().join("server.pem"), ca.keystore("broker")?)?;
        std::fs::write(
            dir.path().join("other-ca.pem"),
            Ca::new("untrusted CA")?.pem,
        )?;
        let ports = gregor_tests::process::free_ports(3)?;
        let (plaintext, controller, sasl_ssl) = (ports[0], ports[1], ports[2]);
        let lines = [
            "node.id=1".to_string(),
            "process.roles=broker,controller".into(),
            format!("listeners=PLAINTEXT://127.0.0.1:{plaintext},CONTROLLER://127.0.0.1:{controller},SASL_SSL://127.0.0.1:{sasl_ssl}"),
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL".into(),
            "controller.listener.names=CONTROLLER".into(),
            "inter.broker.listener.name=PLAINTEXT".into(),
            format!("controller.quorum.voters=1@127.0.0.1:{controller}"),
            format!("log.dirs={}", dir.path().join("data").display()),
            "admin.listener=".into(),
            "listener.name.sasl_ssl.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512".into(),
            format!("listener.name.sasl_ssl.plain.sasl.jaas.config={PLAIN_JAAS}"),
            "listener.name.sasl_ssl.ssl.keystore.type=PEM".into(),
            format!(
                "listener.name.sasl_ssl.ssl.keystore.location={}",
                dir.path().join("server.pem").display()
            ),
        ];
        let config = dir.path().join("server.properties");
        std::fs::write(&config, lines.join("\n") + "\n")?;
        let out = Command::new(BIN)
            .args(["storage", "format", "-t", CLUSTER_ID, "-c"])
            .arg(&config)
            .args([
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
        let log = std::fs::File::create(dir.path().join("gregor.log"))?;
        let child = Command::new(BIN)
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("spawning gregor")?;
        let node = Self {
            child,
            dir,
            plaintext,
            sasl_ssl,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = SocketAddr::from(([127, 0, 0, 1], node.plaintext));
        while gregor_tests::process::api_versions_ok(addr, 1_000).is_err() {
            ensure!(
                Instant::now() < deadline,
                "not listening; log:\n{}",
                node.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(node)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("gregor.log")).unwrap_or_default()
    }

    fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.sasl_ssl)
    }

    /// librdkafka settings for SASL_SSL with `mechanism`, trusting `ca`.
    fn client(
        &self,
        ca: &Path,
        mechanism: &str,
        user: &str,
        password: &str,
    ) -> Vec<(String, String)> {
        [
            ("security.protocol", "SASL_SSL".to_string()),
            ("ssl.ca.location", ca.display().to_string()),
            ("sasl.mechanism", mechanism.to_string()),
            ("sasl.username", user.to_string()),
            ("sasl.password", password.to_string()),
            ("socket.timeout.ms", "10000".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

fn pairs(c: &[(String, String)]) -> Vec<(&str, &str)> {
    c.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Whether librdkafka can fetch metadata over `client` from `bootstrap` within 5 s.
fn metadata_ok(bootstrap: &str, client: &[(String, String)]) -> Result<bool> {
    let c = consumer(bootstrap, &pairs(client))?;
    Ok(c.fetch_metadata(None, Duration::from_secs(5)).is_ok())
}

/// Produces records `first..first + n` (`record-<i>`) to partition 0 of `topic`, acks=all.
fn produce(
    bootstrap: &str,
    client: &[(String, String)],
    topic: &str,
    first: usize,
    n: usize,
) -> Result<()> {
    let mut settings = pairs(client);
    settings.push(("acks", "all"));
    let p = producer(bootstrap, &settings)?;
    for i in first..first + n {
        let key = i.to_string();
        let value = format!("record-{i}");
        p.send(BaseRecord::to(topic).partition(0).key(&key).payload(&value))
            .map_err(|(e, _)| e)
            .context("enqueueing a record")?;
        p.poll(Duration::ZERO);
    }
    p.flush(TIMEOUT).context("flushing the producer")?;
    Ok(())
}

/// Consumes partition 0 of `topic` from the start until `n` records arrived; checks them.
fn consume(bootstrap: &str, client: &[(String, String)], topic: &str, n: usize) -> Result<()> {
    let mut settings = pairs(client);
    settings.push(("group.id", "sasl-ssl-test"));
    settings.push(("enable.auto.commit", "false"));
    let c = consumer(bootstrap, &settings)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    c.assign(&tpl)?;
    let mut got = 0;
    let deadline = Instant::now() + TIMEOUT;
    while got < n {
        ensure!(
            Instant::now() < deadline,
            "read {got} of {n} records of {topic}"
        );
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                ensure!(m.offset() == got as i64, "offset {} at {got}", m.offset());
                ensure!(
                    m.payload() == Some(format!("record-{got}").as_bytes()),
                    "record {got} has other bytes"
                );
                got += 1;
            }
            Some(Err(e)) => bail!("consuming {topic}: {e}"),
            None => {}
        }
    }
    Ok(())
}

#[test]
fn librdkafka_over_sasl_ssl_with_plain_and_scram() -> Result<()> {
    let node = Node::start()?;
    let ca = node.path("ca.pem");
    let bootstrap = node.bootstrap();
    gregor_tests::clients::create_topic(&format!("127.0.0.1:{}", node.plaintext), "secure", 1)?;

    // PLAIN over TLS: produce and consume.
    let alice = node.client(&ca, "PLAIN", "alice", "alice-secret");
    produce(&bootstrap, &alice, "secure", 0, 20).context("PLAIN over SASL_SSL")?;
    consume(&bootstrap, &alice, "secure", 20).context("PLAIN over SASL_SSL")?;
    // SCRAM-SHA-512 (credentials from storage format --add-scram) over TLS.
    let carol = node.client(&ca, "SCRAM-SHA-512", "carol", "carol-secret");
    produce(&bootstrap, &carol, "secure", 20, 5).context("SCRAM-SHA-512 over SASL_SSL")?;
    consume(&bootstrap, &carol, "secure", 25).context("SCRAM-SHA-512 over SASL_SSL")?;

    // Wrong passwords fail, for both mechanisms.
    let wrong = node.client(&ca, "PLAIN", "alice", "nope");
    ensure!(
        !metadata_ok(&bootstrap, &wrong)?,
        "PLAIN with a wrong password got metadata"
    );
    let wrong = node.client(&ca, "SCRAM-SHA-512", "carol", "nope");
    ensure!(
        !metadata_ok(&bootstrap, &wrong)?,
        "SCRAM with a wrong password got metadata"
    );
    // A client that does not trust the server's CA never gets to SASL.
    let untrusted = node.client(&node.path("other-ca.pem"), "PLAIN", "alice", "alice-secret");
    ensure!(
        !metadata_ok(&bootstrap, &untrusted)?,
        "a client trusting another CA got metadata"
    );
    // Plaintext bytes on the SASL_SSL port are not served either.
    let plain = vec![
        (
            "security.protocol".to_string(),
            "SASL_PLAINTEXT".to_string(),
        ),
        ("sasl.mechanism".to_string(), "PLAIN".to_string()),
        ("sasl.username".to_string(), "alice".to_string()),
        ("sasl.password".to_string(), "alice-secret".to_string()),
    ];
    ensure!(
        !metadata_ok(&bootstrap, &plain)?,
        "SASL without TLS got metadata from the SASL_SSL listener"
    );
    let log = node.log();
    ensure!(
        log.contains("failed authentication"),
        "no failed authentication logged:\n{log}"
    );
    Ok(())
}

/// The leader and the ISR size of partition 0 of `topic` as `bootstrap` reports them.
fn leader_of(bootstrap: &str, topic: &str) -> Result<i32> {
    leader_and_isr(bootstrap, topic).map(|(l, _)| l)
}

fn leader_and_isr(bootstrap: &str, topic: &str) -> Result<(i32, usize)> {
    let c = consumer(bootstrap, &[])?;
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .context("topic missing from Metadata")?;
    let p = t
        .partitions()
        .iter()
        .find(|p| p.id() == 0)
        .context("partition 0 missing")?;
    ensure!(p.error().is_none(), "partition 0: {:?}", p.error());
    Ok((p.leader(), p.isr().len()))
}

/// gregor's own connections secured end to end: a 3-node cluster whose controller listener is
/// SSL with mTLS (raft, the controller channel) and whose inter-broker listener is SASL_SSL
/// with SCRAM-SHA-512 (replica fetchers; credentials from `storage format --add-scram`). A
/// topic with RF 3 takes acks=all records while its ISR keeps all 3 replicas (both followers
/// replicated them over SASL_SSL: a follower that cannot fetch leaves the ISR after
/// `replica.lag.time.max.ms`); the leader is killed with SIGKILL and a new leader serves every
/// record (`min.insync.replicas=2`: with KIP-966 the high watermark only advances while the
/// ISR has that many). Until the kill no node logs a failed handshake or authentication of its own clients.
#[test]
fn cluster_with_mtls_controllers_and_sasl_ssl_inter_broker_fails_over() -> Result<()> {
    use gregor_tests::cluster::{
        Cluster, ClusterConfig, ClusterOptions, Implementation, InternalSecurity,
    };
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    let pki = tempfile::tempdir()?;
    let ca = Ca::new("cluster CA")?;
    std::fs::write(pki.path().join("ca.pem"), &ca.pem)?;
    std::fs::write(pki.path().join("node.pem"), ca.keystore("gregor node")?)?;
    let security = InternalSecurity {
        keystore: pki.path().join("node.pem"),
        truststore: pki.path().join("ca.pem"),
        scram_user: "inter-broker".into(),
        scram_password: "ib-secret".into(),
    };
    let config = ClusterConfig::combined(Implementation::Gregor(BIN.into()), 3)
        .with("replica.lag.time.max.ms", "10000");
    let mut cluster = Cluster::start_with(
        &config,
        &ClusterOptions::default().with_internal_security(security),
    )?;
    cluster.wait_ready(Duration::from_secs(120))?;
    for n in cluster.nodes() {
        let text = std::fs::read_to_string(n.config_file())?;
        ensure!(
            text.contains("inter.broker.listener.name=INTERNAL")
                && text.contains("CONTROLLER:SSL,INTERNAL:SASL_SSL"),
            "node {} is not secured:\n{text}",
            n.node_id
        );
    }
    let bootstrap = cluster.bootstrap();
    let topic =
        NewTopic::new("replicated", 1, TopicReplication::Fixed(3)).set("min.insync.replicas", "2");
    let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let rt = gregor_tests::clients::runtime()?;
    for r in
        rt.block_on(gregor_tests::clients::admin(&bootstrap)?.create_topics(&[topic], &opts))?
    {
        if let Err((t, e)) = r {
            bail!("creating {t}: {e}");
        }
    }
    // acks=all with all 3 replicas in the ISR: every record is on both followers, which
    // fetched it over SASL_SSL.
    produce(&bootstrap, &[], "replicated", 0, 200).context("producing acks=all")?;
    let (leader, isr) = leader_and_isr(&bootstrap, "replicated")?;
    ensure!(
        isr == 3,
        "ISR of {isr} after acks=all\n{}",
        cluster.logs(40)
    );
    // Until the kill (which resets handshakes in flight to the killed node), every TLS
    // handshake and SCRAM login of gregor's own clients succeeded.
    for n in cluster.nodes() {
        let log = std::fs::read_to_string(n.log_file()).unwrap_or_default();
        ensure!(
            !log.contains("could not secure a connection"),
            "node {} logged a failed handshake or authentication:\n{}",
            n.node_id,
            n.log_tail(60)
        );
    }
    cluster.node_mut(leader).kill9()?;
    let survivors = cluster.bootstrap_of_running()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match leader_of(&survivors, "replicated") {
            Ok(l) if l >= 0 && l != leader => break,
            other => ensure!(
                Instant::now() < deadline,
                "no new leader after killing {leader}: {other:?}\n{}",
                cluster.logs(40)
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    if let Err(e) = consume(&survivors, &[], "replicated", 200) {
        bail!(
            "consuming from the new leader (old leader {leader}): {e:#}\n{}",
            cluster.logs(60)
        );
    }
    // The quorum still answers through a surviving broker's controller channel (mTLS).
    let status = cluster
        .describe_quorum()?
        .context("no DescribeQuorum answer after the kill")?;
    ensure!(status.leader_id >= 0, "{status:?}");
    Ok(())
}

/// Kafka's tools (the Java client) over SASL_SSL from a client.properties: a PEM truststore
/// and SCRAM-SHA-512; a wrong password fails with an authentication error.
#[test]
fn the_java_client_logs_in_over_sasl_ssl() -> Result<()> {
    if !gregor_tests::reference::jars_or_skip() {
        return Ok(());
    }
    let node = Node::start()?;
    let bootstrap = node.bootstrap();
    let props = |name: &str, password: &str| -> Result<String> {
        let path = node.path(name);
        std::fs::write(
            &path,
            format!(
                "security.protocol=SASL_SSL\nssl.truststore.type=PEM\nssl.truststore.location={}\n\
                 sasl.mechanism=SCRAM-SHA-512\n\
                 sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"carol\" password=\"{password}\";\n",
                node.path("ca.pem").display()
            ),
        )?;
        Ok(path.display().to_string())
    };
    let good = props("client.properties", "carol-secret")?;
    let out = gregor_tests::reference::tool_output(
        "kafka-topics",
        &[
            "--bootstrap-server",
            &bootstrap,
            "--command-config",
            &good,
            "--create",
            "--topic",
            "java-sasl-ssl",
            "--partitions",
            "1",
        ],
    )?;
    ensure!(out.contains("Created topic java-sasl-ssl"), "{out}");
    let out = gregor_tests::reference::tool_output(
        "kafka-topics",
        &[
            "--bootstrap-server",
            &bootstrap,
            "--command-config",
            &good,
            "--list",
        ],
    )?;
    ensure!(out.lines().any(|l| l.trim() == "java-sasl-ssl"), "{out}");
    let bad = props("wrong.properties", "nope")?;
    let out = gregor_tests::reference::tool_output(
        "kafka-topics",
        &[
            "--bootstrap-server",
            &bootstrap,
            "--command-config",
            &bad,
            "--list",
        ],
    )?;
    ensure!(
        out.contains("SaslAuthenticationException") || out.contains("Authentication failed"),
        "{out}"
    );
    Ok(())
}
