//! Secured controller listeners (issue 13), judged by gregor's own clients and Kafka's tools:
//! a cluster whose CONTROLLER listener is SASL_SSL with PLAIN (raft, the controller channel
//! and the brokers' registrations log in with `sasl.mechanism.controller.protocol` and the
//! listener's JAAS `username`/`password`) survives a kill -9 of its active controller; a node
//! with a wrong controller password cannot join and says why; `kafka-metadata-quorum
//! --bootstrap-controller --command-config` reads the quorum over SASL_SSL (and a principal
//! that is not a super user is refused), and over an SSL controller listener with mTLS.
//! Certificates are made at test time with rcgen, never committed.
//!
//! `cargo test -p gregor --test controller_security`

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use gregor_tests::clients::{consumer, producer, TIMEOUT};
use gregor_tests::cluster::{
    Cluster, ClusterConfig, ClusterOptions, ControllerSasl, Implementation, InternalSecurity,
    Layout, QuorumStatus,
};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const STANDARD_AUTHORIZER: &str = "org.apache.kafka.metadata.authorizer.StandardAuthorizer";

/// The test CA's certificate parameters (the same each time, so that its saved key signs
/// again as the same issuer).
fn ca_params() -> Result<CertificateParams> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "controller test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(ca)
}

/// A CA, and a keystore PEM (key, then certificate) for 127.0.0.1 signed by it, in `dir`
/// (`ca.pem`, `node.pem`).
fn make_pki(dir: &Path) -> Result<()> {
    make_pki_with_serial(dir, 1)
}

/// [`make_pki`] with the node certificate's serial number; the CA key is kept in `dir` as
/// `ca.key` so that [`rotate_node_keystore`] can sign another.
fn make_pki_with_serial(dir: &Path, serial: u64) -> Result<()> {
    let ca_key = KeyPair::generate()?;
    let ca = ca_params()?;
    let ca_cert = ca.self_signed(&ca_key)?;
    std::fs::write(dir.join("ca.pem"), ca_cert.pem())?;
    std::fs::write(dir.join("ca.key"), ca_key.serialize_pem())?;
    write_node_keystore(dir, &Issuer::new(ca, ca_key), serial)
}

/// `node.pem` in `dir`: a new key and a certificate for 127.0.0.1 with `serial`.
fn write_node_keystore(dir: &Path, issuer: &Issuer<'_, KeyPair>, serial: u64) -> Result<()> {
    let key = KeyPair::generate()?;
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, "gregor node");
    params.serial_number = Some(rcgen::SerialNumber::from(serial));
    let cert = params.signed_by(&key, issuer)?;
    // Written whole, then renamed over the old file, so a reload never reads half a file.
    let tmp = dir.join("node.pem.tmp");
    std::fs::write(&tmp, format!("{}{}", key.serialize_pem(), cert.pem()))?;
    std::fs::rename(&tmp, dir.join("node.pem"))?;
    Ok(())
}

/// Signs a new `node.pem` in `dir` (made by [`make_pki`]) with `serial`.
fn rotate_node_keystore(dir: &Path, serial: u64) -> Result<()> {
    let ca_key = KeyPair::from_pem(&std::fs::read_to_string(dir.join("ca.key"))?)?;
    write_node_keystore(dir, &Issuer::new(ca_params()?, ca_key), serial)
}

/// The serial of the certificate a TLS listener on `port` presents to a new connection that
/// trusts `dir/ca.pem` and offers `dir/node.pem` (mTLS).
fn served_serial(port: u16, dir: &Path) -> Result<Vec<u8>> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(dir.join("ca.pem"))? {
        roots.add(c?)?;
    }
    let chain =
        CertificateDer::pem_file_iter(dir.join("node.pem"))?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(dir.join("node.pem"))?;
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)?;
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1")?.to_owned();
    let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name)?;
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", port))?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock)?;
    }
    let cert = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .context("no server certificate")?;
    let (_, x509) = x509_parser::parse_x509_certificate(cert)?;
    Ok(x509.raw_serial().to_vec())
}

fn internal_security(pki: &Path) -> InternalSecurity {
    InternalSecurity {
        keystore: pki.join("node.pem"),
        truststore: pki.join("ca.pem"),
        scram_user: "inter-broker".into(),
        scram_password: "ib-secret".into(),
    }
}

/// Creates `topic` with one partition, `replication` and `min.insync.replicas=2`.
fn create_topic(bootstrap: &str, topic: &str, replication: TopicReplication<'_>) -> Result<()> {
    let new_topic = NewTopic::new(topic, 1, replication).set("min.insync.replicas", "2");
    let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let rt = gregor_tests::clients::runtime()?;
    for r in
        rt.block_on(gregor_tests::clients::admin(bootstrap)?.create_topics(&[new_topic], &opts))?
    {
        if let Err((t, e)) = r {
            bail!("creating {t}: {e}");
        }
    }
    Ok(())
}

/// Produces records `first..first + n` (`record-<i>`) to partition 0 of `topic`, acks=all.
fn produce(bootstrap: &str, topic: &str, first: usize, n: usize) -> Result<()> {
    let p = producer(bootstrap, &[("acks", "all")])?;
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
fn consume(bootstrap: &str, topic: &str, n: usize) -> Result<()> {
    let c = consumer(
        bootstrap,
        &[
            ("group.id", "controller-sasl"),
            ("enable.auto.commit", "false"),
        ],
    )?;
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
            // librdkafka reports a lost connection (the killed node's) as an error it
            // recovers from itself; the deadline still applies.
            Some(Err(KafkaError::MessageConsumption(
                code
                @ (RDKafkaErrorCode::AllBrokersDown | RDKafkaErrorCode::BrokerTransportFailure),
            ))) => eprintln!("transient consumer error: {code:?}"),
            Some(Err(e)) => bail!("consuming {topic}: {e}"),
            None => {}
        }
    }
    Ok(())
}

/// Partition 0 of `topic`: its leader and ISR size, as `bootstrap` reports them.
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

/// Waits up to 60 s for a quorum leader other than `old` (DescribeQuorum through the brokers).
fn new_quorum_leader(cluster: &mut Cluster, old: i32) -> Result<i32> {
    gregor_tests::process::poll(Duration::from_secs(60), || {
        cluster
            .describe_quorum()
            .ok()
            .flatten()
            .map(|s| s.leader_id)
            .filter(|l| *l >= 0 && *l != old)
    })
    .with_context(|| format!("no quorum leader after {old}\n{}", cluster.logs(40)))
}

/// How often the running nodes' logs say a login failed (the SASL authenticator).
fn failed_logins(cluster: &Cluster) -> usize {
    cluster
        .nodes()
        .iter()
        .map(|n| {
            std::fs::read_to_string(n.log_file())
                .unwrap_or_default()
                .to_ascii_lowercase()
                .matches("failed authentication")
                .count()
        })
        .sum()
}

/// The broker ids in the Metadata that `bootstrap` answers.
fn broker_ids(bootstrap: &str) -> Result<Vec<i32>> {
    let c = consumer(bootstrap, &[])?;
    let md = c.fetch_metadata(None, Duration::from_secs(10))?;
    let mut ids: Vec<i32> = md.brokers().iter().map(|b| b.id()).collect();
    ids.sort_unstable();
    Ok(ids)
}

/// A client.properties for Kafka's tools at `path`.
fn write_props(path: &Path, lines: &[String]) -> Result<String> {
    std::fs::write(path, lines.join("\n") + "\n")?;
    Ok(path.display().to_string())
}

/// `kafka-metadata-quorum --bootstrap-controller <controllers> --command-config <props>
/// describe --status`: its output.
fn metadata_quorum_tool(controllers: &str, props: &str) -> Result<String> {
    gregor_tests::reference::tool_output(
        "kafka-metadata-quorum",
        &[
            "--bootstrap-controller",
            controllers,
            "--command-config",
            props,
            "describe",
            "--status",
        ],
    )
}

/// A 3-voter cluster (and a fourth, broker-only node) whose controller listener is SASL_SSL
/// with PLAIN, with StandardAuthorizer (the nodes' users are super users, so ClusterAction on
/// the controller RPCs passes for them and for no one else):
/// - a topic with RF 3 led by the active controller takes acks=all records with all 3 replicas
///   in the ISR; the active controller is killed with SIGKILL, another voter leads the quorum,
///   the partition gets a new leader and every record is read back, and more are written;
/// - `kafka-metadata-quorum --bootstrap-controller` over SASL_SSL reads the quorum as a super
///   user, is refused CLUSTER_AUTHORIZATION_FAILED as an authenticated user without ACLs, and
///   fails authentication with a wrong password;
/// - the broker-only node restarted with a wrong controller password cannot join (it is not
///   in Metadata) and its log says the controller listener refused its login; with the right
///   password it joins again.
#[test]
fn sasl_ssl_controller_listener_with_plain() -> Result<()> {
    let pki = tempfile::tempdir()?;
    make_pki(pki.path())?;
    let controller_sasl = ControllerSasl {
        protocol: "SASL_SSL",
        mechanism: "PLAIN",
        user: "ctrl".into(),
        password: "ctrl-secret".into(),
        other_users: vec![("mallory".into(), "mallory-secret".into())],
    };
    let config = ClusterConfig::new(
        Implementation::Gregor(BIN.into()),
        Layout::CombinedAndBrokers {
            combined: 3,
            brokers: 1,
        },
    )
    .with("replica.lag.time.max.ms", "10000")
    .with("authorizer.class.name", STANDARD_AUTHORIZER)
    // The test's own clients use the PLAINTEXT listener (User:ANONYMOUS).
    .with("super.users", "User:ctrl;User:inter-broker;User:ANONYMOUS");
    let mut cluster = Cluster::start_with(
        &config,
        &ClusterOptions::default()
            .with_internal_security(internal_security(pki.path()))
            .with_controller_sasl(controller_sasl),
    )?;
    cluster.wait_ready(Duration::from_secs(120))?;
    for n in cluster.nodes() {
        let text = std::fs::read_to_string(n.config_file())?;
        ensure!(
            text.contains("CONTROLLER:SASL_SSL")
                && text.contains("sasl.mechanism.controller.protocol=PLAIN"),
            "node {} has no SASL_SSL controller listener:\n{text}",
            n.node_id
        );
    }
    let active = cluster.active_controller()?;
    let others: Vec<i32> = (1..=3).filter(|id| *id != active).collect();
    let bootstrap = cluster.bootstrap();
    let topic = "replicated";
    let assignment = [active, others[0], others[1]];
    create_topic(
        &bootstrap,
        topic,
        TopicReplication::Variable(&[&assignment[..]]),
    )
    .with_context(|| cluster.logs(40))?;
    produce(&bootstrap, topic, 0, 200).context("producing acks=all")?;
    let (leader, isr) = leader_and_isr(&bootstrap, topic)?;
    ensure!(
        isr == 3,
        "ISR of {isr} after acks=all\n{}",
        cluster.logs(40)
    );
    ensure!(
        leader == active,
        "partition leader {leader}, active controller {active}"
    );
    // Until now every login of the nodes' own clients succeeded.
    for n in cluster.nodes() {
        let log = std::fs::read_to_string(n.log_file()).unwrap_or_default();
        ensure!(
            !log.contains("could not secure a connection"),
            "node {} logged a failed handshake or login:\n{}",
            n.node_id,
            n.log_tail(60)
        );
    }

    // Kafka's tool over the SASL_SSL controller listener.
    if gregor_tests::reference::jars_or_skip() {
        let controllers = cluster.bootstrap_controllers();
        let props = |file: &str, user: &str, password: &str| {
            write_props(
                &pki.path().join(file),
                &[
                    "security.protocol=SASL_SSL".into(),
                    "ssl.truststore.type=PEM".into(),
                    format!("ssl.truststore.location={}", pki.path().join("ca.pem").display()),
                    "sasl.mechanism=PLAIN".into(),
                    format!("sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username=\"{user}\" password=\"{password}\";"),
                ],
            )
        };
        let out = metadata_quorum_tool(
            &controllers,
            &props("ctrl.properties", "ctrl", "ctrl-secret")?,
        )?;
        let status = QuorumStatus::parse_tool_output(&out)
            .with_context(|| format!("kafka-metadata-quorum as ctrl:\n{out}"))?;
        ensure!(status.leader_id == active, "{status:?}");
        ensure!(status.voters == [1, 2, 3], "{status:?}");
        let out = metadata_quorum_tool(
            &controllers,
            &props("mallory.properties", "mallory", "mallory-secret")?,
        )?;
        ensure!(
            out.contains("ClusterAuthorizationException"),
            "mallory (no ACL, not a super user) was not refused:\n{out}"
        );
        let out = metadata_quorum_tool(&controllers, &props("wrong.properties", "ctrl", "nope")?)?;
        ensure!(
            out.contains("SaslAuthenticationException") || out.contains("Authentication failed"),
            "a wrong password was not refused:\n{out}"
        );
    }

    // kill -9 of the active controller (the partition's leader).
    cluster.node_mut(active).kill9()?;
    let new_active = new_quorum_leader(&mut cluster, active)?;
    ensure!(others.contains(&new_active), "leader {new_active}");
    let survivors = cluster.bootstrap_of_running()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match leader_and_isr(&survivors, topic) {
            Ok((l, _)) if l >= 0 && l != active => break,
            other => ensure!(
                Instant::now() < deadline,
                "no new partition leader after killing {active}: {other:?}\n{}",
                cluster.logs(40)
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    consume(&survivors, topic, 200).with_context(|| cluster.logs(60))?;
    produce(&survivors, topic, 200, 50).context("producing after the failover")?;
    consume(&survivors, topic, 250).with_context(|| cluster.logs(60))?;

    // The broker-only node with a wrong controller password.
    let good = format!(
        "127.0.0.1:{}",
        cluster.node(new_active).client_port.context("port")?
    );
    cluster.node_mut(4).stop()?;
    cluster.wait_for(Duration::from_secs(60), "node 4 to leave Metadata", || {
        broker_ids(&good).ok().filter(|ids| !ids.contains(&4))
    });
    let config_file = cluster.node(4).config_file();
    let text = std::fs::read_to_string(&config_file)?;
    let right = r#"username="ctrl" password="ctrl-secret""#;
    ensure!(text.contains(right), "no controller JAAS config:\n{text}");
    std::fs::write(
        &config_file,
        text.replace(right, r#"username="ctrl" password="wrong-secret""#),
    )?;
    let log_file = cluster.node(4).log_file();
    let log_start = std::fs::metadata(&log_file).map(|m| m.len()).unwrap_or(0);
    let new_log = || -> String {
        let all = std::fs::read(&log_file).unwrap_or_default();
        let start = usize::try_from(log_start).unwrap_or(0).min(all.len());
        String::from_utf8_lossy(&all[start..]).into_owned()
    };
    let failed_before = failed_logins(&cluster);
    cluster.node_mut(4).spawn()?;
    let refused = cluster.wait_for(
        Duration::from_secs(60),
        "node 4 to log the refused controller login",
        || {
            new_log()
                .lines()
                .find(|l| {
                    l.contains("could not secure a connection")
                        && l.contains("CONTROLLER")
                        && l.contains("SASL authentication failed")
                })
                .map(String::from)
        },
    );
    cluster.node_mut(4).check_alive()?;
    ensure!(
        !broker_ids(&good)?.contains(&4),
        "node 4 joined with a wrong controller password ({refused})"
    );
    // The controllers logged the failed login too.
    let server_logged = gregor_tests::process::poll(Duration::from_secs(30), || {
        (failed_logins(&cluster) > failed_before).then_some(())
    });
    ensure!(
        server_logged.is_some(),
        "no controller logged the failed login\n{}",
        cluster.logs(20)
    );
    // With the right password it joins.
    cluster.node_mut(4).kill9()?;
    std::fs::write(&config_file, text)?;
    cluster.node_mut(4).spawn()?;
    cluster.wait_for(Duration::from_secs(60), "node 4 to join again", || {
        broker_ids(&good).ok().filter(|ids| ids.contains(&4))
    });
    Ok(())
}

/// SCRAM on the controller listener (SASL_SSL, SCRAM-SHA-256) of a one-controller
/// quorum with two brokers: the controller serves SCRAM logins with the credentials formatted
/// into its bootstrap checkpoint (`storage format --add-scram`, KIP-900) once its metadata is
/// loaded, so both brokers register and replicate.
#[test]
fn scram_controller_listener_of_a_single_controller() -> Result<()> {
    let pki = tempfile::tempdir()?;
    make_pki(pki.path())?;
    let controller_sasl = ControllerSasl {
        protocol: "SASL_SSL",
        mechanism: "SCRAM-SHA-256",
        user: "ctrl".into(),
        password: "ctrl-secret".into(),
        other_users: Vec::new(),
    };
    let config = ClusterConfig::new(
        Implementation::Gregor(BIN.into()),
        Layout::Split {
            controllers: 1,
            brokers: 2,
        },
    );
    let mut cluster = Cluster::start_with(
        &config,
        &ClusterOptions::default()
            .with_internal_security(internal_security(pki.path()))
            .with_controller_sasl(controller_sasl),
    )?;
    cluster.wait_ready(Duration::from_secs(120))?;
    let text = std::fs::read_to_string(cluster.node(2).config_file())?;
    ensure!(
        text.contains("CONTROLLER:SASL_SSL")
            && text.contains("sasl.mechanism.controller.protocol=SCRAM-SHA-256"),
        "{text}"
    );
    let bootstrap = cluster.bootstrap();
    ensure!(broker_ids(&bootstrap)? == [2, 3], "{}", cluster.logs(20));
    create_topic(&bootstrap, "scram-controller", TopicReplication::Fixed(2))?;
    produce(&bootstrap, "scram-controller", 0, 50)?;
    ensure!(leader_and_isr(&bootstrap, "scram-controller")?.1 == 2);
    consume(&bootstrap, "scram-controller", 50)?;
    Ok(())
}

/// `kafka-metadata-quorum --bootstrap-controller --command-config` over an SSL controller
/// listener with mTLS (the Java client offers a PEM keystore), and refused without one.
#[test]
fn metadata_quorum_tool_over_an_mtls_controller_listener() -> Result<()> {
    if !gregor_tests::reference::jars_or_skip() {
        return Ok(());
    }
    let pki = tempfile::tempdir()?;
    make_pki(pki.path())?;
    let config = ClusterConfig::combined(Implementation::Gregor(BIN.into()), 1);
    let mut cluster = Cluster::start_with(
        &config,
        &ClusterOptions::default().with_internal_security(internal_security(pki.path())),
    )?;
    cluster.wait_ready(Duration::from_secs(120))?;
    let controllers = cluster.bootstrap_controllers();
    let trust = [
        "security.protocol=SSL".to_string(),
        "ssl.truststore.type=PEM".into(),
        format!(
            "ssl.truststore.location={}",
            pki.path().join("ca.pem").display()
        ),
    ];
    let mut with_keystore = trust.to_vec();
    with_keystore.push("ssl.keystore.type=PEM".into());
    with_keystore.push(format!(
        "ssl.keystore.location={}",
        pki.path().join("node.pem").display()
    ));
    let out = metadata_quorum_tool(
        &controllers,
        &write_props(&pki.path().join("mtls.properties"), &with_keystore)?,
    )?;
    let status = QuorumStatus::parse_tool_output(&out)
        .with_context(|| format!("kafka-metadata-quorum over mTLS:\n{out}"))?;
    ensure!(status.leader_id == 1 && status.voters == [1], "{status:?}");
    // No client certificate: the handshake fails (ssl.client.auth=required).
    let out = metadata_quorum_tool(
        &controllers,
        &write_props(&pki.path().join("no-cert.properties"), &trust)?,
    )?;
    ensure!(
        QuorumStatus::parse_tool_output(&out).is_err(),
        "the quorum was read without a client certificate:\n{out}"
    );
    Ok(())
}

/// With StandardAuthorizer and the voters' own principal (here `User:CN=gregor node`, from the mTLS
/// controller listener) missing from `super.users`, no quorum forms, as in Kafka: before a
/// leader is elected the authorizer has no ACLs. Both sides say why: the voter asked logs the
/// denial naming the principal and `super.users`, the voter asking logs the refusal of its
/// requests (the security trial found a cluster that never formed with nothing in the logs
/// but "a majority of the voters must be running").
#[test]
fn voters_missing_from_super_users_are_told_why_no_quorum_forms() -> Result<()> {
    let pki = tempfile::tempdir()?;
    make_pki(pki.path())?;
    let config = ClusterConfig::combined(Implementation::Gregor(BIN.into()), 3)
        .with("authorizer.class.name", STANDARD_AUTHORIZER)
        .with("super.users", "User:admin");
    let mut cluster = Cluster::prepare_with(
        &config,
        &ClusterOptions::default().with_internal_security(internal_security(pki.path())),
    )?;
    cluster.format()?;
    for id in 1..=3 {
        cluster.node_mut(id).spawn()?;
    }
    let logs = |cluster: &Cluster| -> String {
        (1..=3)
            .filter_map(|id| std::fs::read_to_string(cluster.node(id).log_file()).ok())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let told = gregor_tests::process::poll(Duration::from_secs(60), || {
        let text = logs(&cluster);
        (text.contains("denied: the authorizer has not loaded the metadata yet")
            && text.contains("User:CN=gregor node")
            && text.contains("refused this node's Vote request with CLUSTER_AUTHORIZATION_FAILED"))
        .then_some(())
    });
    ensure!(
        told.is_some(),
        "no denial and refusal logged within 60 s:{}",
        cluster.logs(40)
    );
    ensure!(
        !logs(&cluster).contains("elected leader"),
        "a leader was elected although the voters are not super users:{}",
        cluster.logs(40)
    );
    Ok(())
}

/// Certificate rotation on the controller listener (SSL with mTLS) of a running 3-voter
/// cluster: a new keystore is written over the file all nodes read; every controller listener
/// presents the new certificate to new connections within `ssl.reload.check.interval.ms`,
/// and the quorum keeps working over it (the active controller is killed, another voter is
/// elected over new connections, and a topic created after it takes and serves records).
#[test]
fn controller_listener_certificates_rotate_without_restart() -> Result<()> {
    let pki = tempfile::tempdir()?;
    make_pki(pki.path())?;
    let config = ClusterConfig::combined(Implementation::Gregor(BIN.into()), 3)
        .with("ssl.reload.check.interval.ms", "200");
    let mut cluster = Cluster::start_with(
        &config,
        &ClusterOptions::default().with_internal_security(internal_security(pki.path())),
    )?;
    cluster.wait_ready(Duration::from_secs(120))?;
    let ports: Vec<u16> = cluster
        .nodes()
        .iter()
        .filter_map(|n| n.controller_port)
        .collect();
    for p in &ports {
        ensure!(
            served_serial(*p, pki.path())? == [1],
            "port {p}: the first certificate"
        );
    }
    rotate_node_keystore(pki.path(), 2)?;
    for p in &ports {
        let rotated = gregor_tests::process::poll(Duration::from_secs(15), || {
            (served_serial(*p, pki.path()).ok()? == [2]).then_some(())
        });
        ensure!(
            rotated.is_some(),
            "controller listener {p} never presented the new certificate\n{}",
            cluster.logs(20)
        );
    }
    let active = cluster.active_controller()?;
    cluster.node_mut(active).kill9()?;
    let new_active = new_quorum_leader(&mut cluster, active)?;
    let survivors = cluster.bootstrap_of_running()?;
    // The killed broker stays in Metadata (and may get replicas) until its session expires:
    // the new topic must be placed on the two live brokers for min.insync.replicas=2.
    cluster.wait_for(
        Duration::from_secs(60),
        "the killed node to leave Metadata",
        || {
            broker_ids(&survivors)
                .ok()
                .filter(|ids| !ids.contains(&active))
        },
    );
    create_topic(&survivors, "after-rotation", TopicReplication::Fixed(2))?;
    produce(&survivors, "after-rotation", 0, 20).context("producing after the rotation")?;
    consume(&survivors, "after-rotation", 20)
        .with_context(|| format!("leader {new_active}\n{}", cluster.logs(40)))?;
    Ok(())
}

/// Three combined nodes of `main` and a broker-only node 4 of `broker`, with secured internal
/// traffic: the controller listener SASL_SSL with PLAIN, the inter-broker listener SASL_SSL
/// with SCRAM-SHA-512. The directory holds the keystore and truststore the nodes read.
fn secured_mixed_cluster(
    main: Implementation,
    broker: Implementation,
) -> Result<(Cluster, tempfile::TempDir)> {
    let pki = tempfile::tempdir()?;
    make_pki(pki.path())?;
    let config = ClusterConfig::new(
        main,
        Layout::CombinedAndBrokers {
            combined: 3,
            brokers: 1,
        },
    )
    .with_node_implementation(4, broker)
    .with("broker.session.timeout.ms", "4000")
    .with("broker.heartbeat.interval.ms", "500");
    let controller_sasl = ControllerSasl {
        protocol: "SASL_SSL",
        mechanism: "PLAIN",
        user: "ctrl".into(),
        password: "ctrl-secret".into(),
        other_users: Vec::new(),
    };
    let cluster = Cluster::start_with(
        &config,
        &ClusterOptions::default()
            .with_internal_security(internal_security(pki.path()))
            .with_controller_sasl(controller_sasl),
    )?;
    Ok((cluster, pki))
}

/// A Kafka 4.4.0 broker in a gregor quorum whose controller listener is SASL_SSL (PLAIN) and
/// whose inter-broker listener is SASL_SSL (SCRAM-SHA-512): it registers and heartbeats over
/// gregor's SASL_SSL controller listener, replicates from and to gregor brokers over
/// SASL_SSL, and the mixed scenario (`gregor_tests::mixed`) loses nothing acknowledged.
#[test]
fn kafka_broker_in_a_gregor_cluster_over_sasl_ssl() -> Result<()> {
    if !gregor_tests::reference::jars_or_skip() {
        return Ok(());
    }
    let (mut cluster, _pki) =
        secured_mixed_cluster(Implementation::Gregor(BIN.into()), Implementation::Kafka)?;
    let m = gregor_tests::mixed::replicate_across_implementations(&mut cluster, 1, 4, 2)?;
    ensure!(m.acknowledged >= 600, "{m:?}");
    Ok(())
}

/// A gregor broker in a Kafka 4.4.0 quorum, the same way secured: gregor's own clients log
/// in to Kafka's SASL_SSL controller listener (PLAIN) and inter-broker listener
/// (SCRAM-SHA-512).
#[test]
fn gregor_broker_in_a_kafka_cluster_over_sasl_ssl() -> Result<()> {
    if !gregor_tests::reference::jars_or_skip() {
        return Ok(());
    }
    let (mut cluster, _pki) =
        secured_mixed_cluster(Implementation::Kafka, Implementation::Gregor(BIN.into()))?;
    let m = gregor_tests::mixed::replicate_across_implementations(&mut cluster, 1, 4, 2)?;
    ensure!(m.acknowledged >= 600, "{m:?}");
    Ok(())
}
