//! SSL listeners (issue 13, items 1-3), judged by librdkafka and rustls clients. Certificates
//! are made at test time with rcgen (a CA, a server certificate for 127.0.0.1, client
//! certificates; a second CA nobody trusts), never committed.
//!
//! - librdkafka produces and consumes over SSL (Fetch responses take the copying path) and
//!   over mTLS (`ssl.client.auth=required`), where the broker's log shows the principal
//!   mapped from the client certificate's subject by `ssl.principal.mapping.rules`; a client
//!   certificate on a listener that does not ask for one leaves `User:ANONYMOUS`.
//! - A client certificate from an untrusted CA, no client certificate on a `required`
//!   listener, and a server certificate the client does not trust each fail the connection
//!   cleanly: the broker counts and logs the failed handshake and keeps serving.
//! - A missing keystore, a keystore file that does not exist, a key that does not fit, an
//!   encrypted key without `ssl.key.password`: start-up stops, naming the listener and key.
//! - Rotation: the keystore file is replaced while the broker runs; new connections get the
//!   new certificate (its serial), a connection opened before keeps working, and a broken file
//!   keeps the old certificate.
//!
//! `cargo test -p gregor --test tls`

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use gregor_tests::clients::{consumer, create_topic, producer, TIMEOUT};
use gregor_tests::process::poll;
use gregor_tests::Gregor;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SerialNumber,
};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");

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

    /// A leaf certificate and its key (PEM): for 127.0.0.1 and localhost, or a client with
    /// the subject `dn`.
    fn leaf(&self, dn: &[(DnType, &str)], serial: u64, server: bool) -> Result<(String, String)> {
        let key = KeyPair::generate()?;
        let sans = if server {
            vec!["127.0.0.1".to_string(), "localhost".to_string()]
        } else {
            Vec::new()
        };
        let mut params = CertificateParams::new(sans)?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in dn {
            params.distinguished_name.push(t.clone(), *v);
        }
        params.serial_number = Some(SerialNumber::from(serial));
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// The files of one test: CA, server keystore (key and chain in one PEM), clients.
struct Pki {
    dir: tempfile::TempDir,
    ca: Ca,
    other_ca: Ca,
}

impl Pki {
    fn new() -> Result<Self> {
        let pki = Self {
            dir: tempfile::tempdir()?,
            ca: Ca::new("gregor test CA")?,
            other_ca: Ca::new("untrusted CA")?,
        };
        std::fs::write(pki.path("ca.pem"), &pki.ca.pem)?;
        std::fs::write(pki.path("other-ca.pem"), &pki.other_ca.pem)?;
        pki.write_server_keystore("server.pem", 1)?;
        // Clients: alice (trusted), mallory (signed by the untrusted CA).
        let alice = [
            (DnType::CountryName, "US"),
            (DnType::OrganizationName, "Example"),
            (DnType::OrganizationalUnitName, "eng"),
            (DnType::CommonName, "Alice"),
        ];
        let (cert, key) = pki.ca.leaf(&alice, 100, false)?;
        std::fs::write(pki.path("alice.pem"), cert)?;
        std::fs::write(pki.path("alice.key"), key)?;
        let (cert, key) = pki
            .other_ca
            .leaf(&[(DnType::CommonName, "mallory")], 101, false)?;
        std::fs::write(pki.path("mallory.pem"), cert)?;
        std::fs::write(pki.path("mallory.key"), key)?;
        Ok(pki)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn p(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    /// Writes a server keystore (key, then the certificate) with `serial`, replacing the file
    /// at once (a rename), as an operator's tooling would.
    fn write_server_keystore(&self, name: &str, serial: u64) -> Result<()> {
        let (cert, key) = self
            .ca
            .leaf(&[(DnType::CommonName, "gregor broker")], serial, true)?;
        let tmp = self.path(&format!("{name}.tmp"));
        std::fs::write(&tmp, format!("{key}{cert}"))?;
        std::fs::rename(&tmp, self.path(name))?;
        Ok(())
    }
}

/// A broker with a PLAINTEXT listener (the harness's), an SSL listener without client
/// authentication and an mTLS listener (`MTLS`, `ssl.client.auth=required`, the principal
/// mapped to the lower-cased CN). Returns it with the SSL and MTLS ports.
fn broker(pki: &Pki, extra: &[&str]) -> Result<(Gregor, u16, u16)> {
    let ssl = gregor_tests::free_port()?;
    let mtls = gregor_tests::free_port()?;
    let mut sets = vec![
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL".to_string(),
        "ssl.keystore.type=PEM".to_string(),
        format!("ssl.keystore.location={}", pki.p("server.pem")),
        "listener.name.mtls.ssl.client.auth=required".to_string(),
        "listener.name.mtls.ssl.truststore.type=PEM".to_string(),
        format!(
            "listener.name.mtls.ssl.truststore.location={}",
            pki.p("ca.pem")
        ),
        "listener.name.mtls.ssl.principal.mapping.rules=RULE:^CN=([^,]+),.*$/$1/L,DEFAULT"
            .to_string(),
    ];
    sets.extend(extra.iter().map(|s| (*s).to_string()));
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let g = Gregor::start_with_listeners(
        BIN,
        &format!("SSL://127.0.0.1:{ssl},MTLS://127.0.0.1:{mtls}"),
        &sets,
        &[("RUST_LOG", "info,gregor_network::tls=debug")],
    )?;
    Ok((g, ssl, mtls))
}

/// librdkafka settings for SSL to `port` trusting `ca`, with a client certificate if given.
fn ssl_client(pki: &Pki, ca: &str, cert: Option<&str>) -> Vec<(String, String)> {
    let mut c = vec![
        ("security.protocol".to_string(), "ssl".to_string()),
        ("ssl.ca.location".to_string(), pki.p(ca)),
        ("socket.timeout.ms".to_string(), "10000".to_string()),
    ];
    if let Some(name) = cert {
        c.push((
            "ssl.certificate.location".into(),
            pki.p(&format!("{name}.pem")),
        ));
        c.push(("ssl.key.location".into(), pki.p(&format!("{name}.key"))));
    }
    c
}

fn pairs(c: &[(String, String)]) -> Vec<(&str, &str)> {
    c.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Produces `n` records of 2 KiB to partition 0 of `topic` over `bootstrap`, acks=all.
fn produce(bootstrap: &str, client: &[(String, String)], topic: &str, n: usize) -> Result<()> {
    let mut settings = pairs(client);
    settings.push(("acks", "all"));
    let p = producer(bootstrap, &settings)?;
    for i in 0..n {
        let value = vec![b'a' + (i % 26) as u8; 2048];
        let key = i.to_string();
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
    settings.push(("group.id", "tls-test"));
    settings.push(("enable.auto.commit", "false"));
    let c = consumer(bootstrap, &settings)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    c.assign(&tpl)?;
    let mut got = 0;
    let deadline = std::time::Instant::now() + TIMEOUT;
    while got < n {
        ensure!(
            std::time::Instant::now() < deadline,
            "read {got} of {n} records of {topic}"
        );
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                let i: usize = std::str::from_utf8(m.key().unwrap_or_default())?.parse()?;
                ensure!(m.offset() == got as i64, "offset {} at {got}", m.offset());
                ensure!(
                    m.payload() == Some(&vec![b'a' + (i % 26) as u8; 2048][..]),
                    "record {i} has other bytes"
                );
                got += 1;
            }
            Some(Err(e)) => bail!("consuming {topic}: {e}"),
            None => {}
        }
    }
    Ok(())
}

/// Whether librdkafka can fetch metadata over `client` from `bootstrap` within 5 s.
fn metadata_ok(bootstrap: &str, client: &[(String, String)]) -> Result<bool> {
    let c = consumer(bootstrap, &pairs(client))?;
    Ok(c.fetch_metadata(None, Duration::from_secs(5)).is_ok())
}

fn metric(g: &Gregor, name: &str) -> Result<f64> {
    let (_, body) = g.admin_get("/metrics")?;
    Ok(body
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

#[test]
fn librdkafka_over_ssl_and_mtls_with_the_certificate_principal() -> Result<()> {
    let pki = Pki::new()?;
    let (g, ssl, mtls) = broker(&pki, &[])?;
    create_topic(&g.bootstrap(), "tls", 1)?;
    let over_ssl = ssl_client(&pki, "ca.pem", None);
    produce(&format!("127.0.0.1:{ssl}"), &over_ssl, "tls", 500)?;
    consume(&format!("127.0.0.1:{ssl}"), &over_ssl, "tls", 500)?;
    // mTLS: alice's certificate, CN=Alice mapped to `alice` by the listener's rule.
    let over_mtls = ssl_client(&pki, "ca.pem", Some("alice"));
    produce(&format!("127.0.0.1:{mtls}"), &over_mtls, "tls", 200)?;
    consume(&format!("127.0.0.1:{mtls}"), &over_mtls, "tls", 700)?;
    let log = g.server_log();
    ensure!(
        log.lines().any(|l| l.contains("TLS connection established")
            && l.contains("listener=MTLS")
            && l.contains("principal=User:alice")),
        "no mTLS connection as User:alice in the log:\n{log}"
    );
    // The SSL listener does not ask for a certificate: anonymous even with one offered.
    ensure!(metadata_ok(
        &format!("127.0.0.1:{ssl}"),
        &ssl_client(&pki, "ca.pem", Some("alice"))
    )?);
    let log = g.server_log();
    ensure!(
        log.lines().any(|l| l.contains("TLS connection established")
            && l.contains("listener=SSL")
            && l.contains("principal=User:ANONYMOUS")),
        "no anonymous SSL connection in the log:\n{log}"
    );
    ensure!(
        !log.lines()
            .any(|l| l.contains("listener=SSL") && l.contains("principal=User:alice")),
        "a certificate was taken on a listener that does not ask for one:\n{log}"
    );
    Ok(())
}

#[test]
fn untrusted_certificates_fail_cleanly() -> Result<()> {
    let pki = Pki::new()?;
    let (g, ssl, mtls) = broker(&pki, &[])?;
    let mtls_addr = format!("127.0.0.1:{mtls}");
    let before = metric(&g, "gregor_tls_handshake_failures_total")?;
    // A client certificate signed by a CA the listener does not trust.
    ensure!(
        !metadata_ok(&mtls_addr, &ssl_client(&pki, "ca.pem", Some("mallory")))?,
        "an untrusted client certificate was accepted"
    );
    // No client certificate where one is required.
    ensure!(
        !metadata_ok(&mtls_addr, &ssl_client(&pki, "ca.pem", None))?,
        "a client without a certificate was accepted on a required listener"
    );
    // A client that does not trust the server's certificate.
    ensure!(
        !metadata_ok(
            &format!("127.0.0.1:{ssl}"),
            &ssl_client(&pki, "other-ca.pem", None)
        )?,
        "the client accepted a server certificate from a CA it does not trust"
    );
    // Plaintext bytes to a TLS listener.
    let mut s = TcpStream::connect(("127.0.0.1", ssl))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(&[0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 1, 0, 0])?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap_or(0);
    ensure!(
        n == 0 || buf[0] == 0x15,
        "a plaintext request on the SSL listener got {n} bytes that are not a TLS alert"
    );
    let failures = poll(Duration::from_secs(10), || {
        let n = metric(&g, "gregor_tls_handshake_failures_total").ok()?;
        (n >= before + 3.0).then_some(n)
    });
    ensure!(failures.is_some(), "the failed handshakes were not counted");
    let log = g.server_log();
    ensure!(
        log.contains("TLS handshake failed") && log.contains("peer=Some(127.0.0.1:"),
        "no log line with the peer for a failed handshake:\n{log}"
    );
    // Everything else still works.
    ensure!(metadata_ok(
        &mtls_addr,
        &ssl_client(&pki, "ca.pem", Some("alice"))
    )?);
    ensure!(metadata_ok(
        &format!("127.0.0.1:{ssl}"),
        &ssl_client(&pki, "ca.pem", None)
    )?);
    ensure!(metadata_ok(&g.bootstrap(), &[])?);
    Ok(())
}

/// Runs `gregor serve` with `sets`, which must fail; returns its stderr.
fn serve_refuses(sets: &[String]) -> Result<String> {
    let dir = tempfile::tempdir()?;
    let mut cmd = std::process::Command::new(BIN);
    cmd.arg("serve")
        .arg("--set")
        .arg(format!("log.dirs={}", dir.path().display()))
        .arg("--set")
        .arg("admin.listener=");
    for s in sets {
        cmd.arg("--set").arg(s);
    }
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .context("running gregor serve")?;
    ensure!(!out.status.success(), "gregor started with {sets:?}");
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_listener_that_cannot_work_stops_start_up_naming_the_key() -> Result<()> {
    let pki = Pki::new()?;
    let port = gregor_tests::free_port()?;
    let listeners = format!("listeners=PLAINTEXT://127.0.0.1:0,EXTERNAL://127.0.0.1:{port}");
    let map = "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,EXTERNAL:SSL".to_string();
    let check = |extra: &[String], wanted: &[&str]| -> Result<()> {
        let mut sets = vec![listeners.clone(), map.clone()];
        sets.extend(extra.iter().cloned());
        let err = serve_refuses(&sets)?;
        for w in wanted {
            ensure!(err.contains(w), "{extra:?}: no {w:?} in:\n{err}");
        }
        ensure!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "the refused listener accepts connections"
        );
        Ok(())
    };
    // No keystore at all.
    check(&[], &["ssl.keystore.location", "listener EXTERNAL"])?;
    // Kafka's default keystore type, JKS.
    check(
        &[format!("ssl.keystore.location={}", pki.p("server.pem"))],
        &["ssl.keystore.type", "JKS"],
    )?;
    // A file that does not exist, named by the listener's own key.
    check(
        &[
            "ssl.keystore.type=PEM".into(),
            format!(
                "listener.name.external.ssl.keystore.location={}",
                pki.p("nope.pem")
            ),
        ],
        &[
            "listener.name.external.ssl.keystore.location",
            "listener EXTERNAL",
            "nope.pem",
        ],
    )?;
    // A key that does not belong to the certificate.
    let mixed = pki.path("mixed.pem");
    let server = std::fs::read_to_string(pki.path("server.pem"))?;
    let alice_key = std::fs::read_to_string(pki.path("alice.key"))?;
    let cert_start = server.find("-----BEGIN CERTIFICATE-----").unwrap_or(0);
    std::fs::write(&mixed, format!("{alice_key}{}", &server[cert_start..]))?;
    check(
        &[
            "ssl.keystore.type=PEM".into(),
            format!("ssl.keystore.location={}", mixed.display()),
        ],
        &["ssl.keystore.location", "does not fit"],
    )?;
    // A certificate without its key.
    check(
        &[
            "ssl.keystore.type=PEM".into(),
            format!("ssl.keystore.location={}", pki.p("ca.pem")),
        ],
        &["ssl.keystore.location", "no PRIVATE KEY"],
    )?;
    // required client auth without a truststore.
    check(
        &[
            "ssl.keystore.type=PEM".into(),
            format!("ssl.keystore.location={}", pki.p("server.pem")),
            "ssl.client.auth=required".into(),
        ],
        &["ssl.truststore.location", "listener EXTERNAL"],
    )?;
    Ok(())
}

/// The serial of the certificate the broker presents on `port` to a new connection
/// (rustls client trusting `ca`).
fn served_serial(port: u16, ca: &Path) -> Result<Vec<u8>> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(ca)? {
        roots.add(c?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1")?.to_owned();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name)?;
    let mut sock = TcpStream::connect(("127.0.0.1", port))?;
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

#[test]
fn rotated_certificates_reach_new_connections_without_restart() -> Result<()> {
    let pki = Pki::new()?;
    let (g, ssl, _) = broker(&pki, &["ssl.reload.check.interval.ms=200"])?;
    let ca = pki.path("ca.pem");
    ensure!(served_serial(ssl, &ca)? == [1], "the first certificate");
    create_topic(&g.bootstrap(), "rotate", 1)?;
    // A producer connected before the rotation.
    let client = ssl_client(&pki, "ca.pem", None);
    let mut settings = pairs(&client);
    settings.push(("acks", "all"));
    let p = producer(&format!("127.0.0.1:{ssl}"), &settings)?;
    p.send(
        BaseRecord::to("rotate")
            .partition(0)
            .key("0")
            .payload(&vec![b'a'; 2048]),
    )
    .map_err(|(e, _)| e)?;
    p.flush(TIMEOUT)?;

    pki.write_server_keystore("server.pem", 2)?;
    let rotated = poll(Duration::from_secs(15), || {
        (served_serial(ssl, &ca).ok()? == [2]).then_some(())
    });
    ensure!(
        rotated.is_some(),
        "new connections never saw the new certificate"
    );
    // The connection from before keeps working.
    p.send(
        BaseRecord::to("rotate")
            .partition(0)
            .key("1")
            .payload(&vec![b'b'; 2048]),
    )
    .map_err(|(e, _)| e)?;
    p.flush(TIMEOUT)?;
    consume(&format!("127.0.0.1:{ssl}"), &client, "rotate", 2)?;

    // A broken file keeps the certificate in use, and says why.
    std::fs::write(pki.path("server.pem"), "not a PEM file")?;
    let logged = poll(Duration::from_secs(15), || {
        g.server_log()
            .contains("cannot be used; the listener keeps its current certificates")
            .then_some(())
    });
    ensure!(logged.is_some(), "the failed reload was not logged");
    ensure!(
        served_serial(ssl, &ca)? == [2],
        "a broken file replaced the certificate"
    );
    Ok(())
}

#[test]
fn dynamic_listener_keystore_change_reaches_new_connections() -> Result<()> {
    use rdkafka::admin::{AdminOptions, AlterConfig, ResourceSpecifier};
    let pki = Pki::new()?;
    // No file polling: only the dynamic config can change the certificate.
    let (g, ssl, _) = broker(&pki, &["ssl.reload.check.interval.ms=0"])?;
    let ca = pki.path("ca.pem");
    ensure!(served_serial(ssl, &ca)? == [1], "the first certificate");
    pki.write_server_keystore("server-3.pem", 3)?;
    let admin = gregor_tests::clients::admin(&g.bootstrap())?;
    let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let location = pki.p("server-3.pem");
    let change = AlterConfig::new(ResourceSpecifier::Broker(1))
        .set("listener.name.ssl.ssl.keystore.location", &location);
    let results =
        gregor_tests::clients::runtime()?.block_on(admin.alter_configs(&[change], &opts))?;
    for r in results {
        if let Err((_, e)) = r {
            bail!("AlterConfigs: {e}");
        }
    }
    let rotated = poll(Duration::from_secs(15), || {
        (served_serial(ssl, &ca).ok()? == [3]).then_some(())
    });
    ensure!(
        rotated.is_some(),
        "the dynamic keystore change did not reach new connections"
    );
    // Refused before it is stored (Kafka's SslFactory validation, INVALID_REQUEST): a file
    // that does not exist, and a certificate with another subject unless
    // ssl.allow.dn.changes; the certificate in use stays.
    let (cert, key) = pki
        .ca
        .leaf(&[(rcgen::DnType::CommonName, "another broker")], 4, true)?;
    std::fs::write(pki.path("server-4.pem"), format!("{key}{cert}"))?;
    let server_4 = pki.p("server-4.pem");
    // rdkafka's binding reports every AlterConfigs resource as a success, so the refusals are
    // read off the wire.
    let alter = |pairs: &[(&str, &str)]| -> Result<(i16, String)> {
        use kafka_protocol::messages::alter_configs_request::{
            AlterConfigsResource, AlterableConfig,
        };
        use kafka_protocol::messages::{AlterConfigsRequest, AlterConfigsResponse, ApiKey};
        let sb = gregor_tests::wire::sb;
        let req =
            AlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
                .with_resource_type(4)
                .with_resource_name(sb("1"))
                .with_configs(
                    pairs
                        .iter()
                        .map(|(k, v)| {
                            AlterableConfig::default()
                                .with_name(sb(k))
                                .with_value(Some(sb(v)))
                        })
                        .collect(),
                )]);
        let mut conn = gregor_tests::wire::KafkaConn::connect(g.bootstrap(), "t")?;
        let r: AlterConfigsResponse = conn.call(ApiKey::AlterConfigs, 2, &req)?;
        let r = r.responses.first().context("no response")?;
        Ok((
            r.error_code,
            r.error_message
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
        ))
    };
    for (location, why) in [
        ("/nonexistent/keystore.pem", "cannot read"),
        (
            server_4.as_str(),
            "Keystore DistinguishedName does not match",
        ),
    ] {
        let (code, message) = alter(&[("listener.name.ssl.ssl.keystore.location", location)])?;
        ensure!(
            code == 42
                && message.starts_with("Validation of dynamic config update of SSLFactory failed")
                && message.contains(why),
            "{location}: {code} {message}"
        );
        ensure!(
            served_serial(ssl, &ca)? == [3],
            "a refused change replaced the certificate"
        );
    }
    let (code, message) = alter(&[
        ("listener.name.ssl.ssl.keystore.location", &server_4),
        ("listener.name.ssl.ssl.allow.dn.changes", "true"),
    ])?;
    ensure!(code == 0, "{code} {message}");
    let rotated = poll(Duration::from_secs(15), || {
        (served_serial(ssl, &ca).ok()? == [4]).then_some(())
    });
    ensure!(
        rotated.is_some(),
        "the allowed DN change did not reach new connections"
    );
    Ok(())
}

/// Runs `program` with `args`; fails with its output if it fails.
fn run_tool(program: &str, args: &[&str]) -> Result<()> {
    let out = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    ensure!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// PKCS12 stores (`ssl.keystore.type=PKCS12`, `ssl.truststore.type=PKCS12`), made now by
/// `openssl pkcs12 -export` (the server's key and chain) and `keytool -importcert` (the CA as
/// a trusted entry): librdkafka over SSL and mTLS, the Java client with a PKCS12 truststore
/// over SSL; a wrong store password and an openssl-made truststore without trusted entries
/// stop start-up naming the key.
#[test]
fn pkcs12_keystore_and_truststore() -> Result<()> {
    let pki = Pki::new()?;
    let server = std::fs::read_to_string(pki.path("server.pem"))?;
    let cert_start = server
        .find("-----BEGIN CERTIFICATE-----")
        .context("no certificate")?;
    std::fs::write(pki.path("server.key"), &server[..cert_start])?;
    std::fs::write(pki.path("server.crt"), &server[cert_start..])?;
    run_tool(
        "openssl",
        &[
            "pkcs12",
            "-export",
            "-in",
            &pki.p("server.crt"),
            "-inkey",
            &pki.p("server.key"),
            "-certfile",
            &pki.p("ca.pem"),
            "-name",
            "broker",
            "-passout",
            "pass:store-secret",
            "-out",
            &pki.p("server.p12"),
        ],
    )?;
    run_tool(
        "keytool",
        &[
            "-importcert",
            "-noprompt",
            "-storetype",
            "PKCS12",
            "-alias",
            "ca",
            "-file",
            &pki.p("ca.pem"),
            "-keystore",
            &pki.p("trust.p12"),
            "-storepass",
            "trust-secret",
        ],
    )?;
    let ssl = gregor_tests::free_port()?;
    let mtls = gregor_tests::free_port()?;
    let sets = [
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL".to_string(),
        "ssl.keystore.type=PKCS12".to_string(),
        format!("ssl.keystore.location={}", pki.p("server.p12")),
        "ssl.keystore.password=store-secret".to_string(),
        "listener.name.mtls.ssl.client.auth=required".to_string(),
        "listener.name.mtls.ssl.truststore.type=PKCS12".to_string(),
        format!(
            "listener.name.mtls.ssl.truststore.location={}",
            pki.p("trust.p12")
        ),
        "listener.name.mtls.ssl.truststore.password=trust-secret".to_string(),
    ];
    let set_refs: Vec<&str> = sets.iter().map(String::as_str).collect();
    let g = Gregor::start_with_listeners(
        BIN,
        &format!("SSL://127.0.0.1:{ssl},MTLS://127.0.0.1:{mtls}"),
        &set_refs,
        &[("RUST_LOG", "info,gregor_network::tls=debug")],
    )?;
    create_topic(&g.bootstrap(), "p12", 1)?;
    let over_ssl = ssl_client(&pki, "ca.pem", None);
    produce(&format!("127.0.0.1:{ssl}"), &over_ssl, "p12", 50)?;
    let over_mtls = ssl_client(&pki, "ca.pem", Some("alice"));
    consume(&format!("127.0.0.1:{mtls}"), &over_mtls, "p12", 50)?;
    // A client certificate from a CA the PKCS12 truststore does not hold is refused.
    ensure!(!metadata_ok(
        &format!("127.0.0.1:{mtls}"),
        &ssl_client(&pki, "ca.pem", Some("mallory"))
    )?);

    if gregor_tests::reference::jars_or_skip() {
        let props = pki.path("client.properties");
        std::fs::write(
            &props,
            format!(
                "security.protocol=SSL\nssl.truststore.type=PKCS12\nssl.truststore.location={}\nssl.truststore.password=trust-secret\n",
                pki.p("trust.p12")
            ),
        )?;
        let out = gregor_tests::reference::tool_output(
            "kafka-topics",
            &[
                "--bootstrap-server",
                &format!("127.0.0.1:{ssl}"),
                "--command-config",
                &props.display().to_string(),
                "--create",
                "--topic",
                "java-p12",
                "--partitions",
                "1",
            ],
        )?;
        ensure!(out.contains("Created topic java-p12"), "{out}");
    }
    drop(g);

    // Start-up refusals.
    let port = gregor_tests::free_port()?;
    let base = vec![
        format!("listeners=PLAINTEXT://127.0.0.1:0,EXTERNAL://127.0.0.1:{port}"),
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,EXTERNAL:SSL".to_string(),
        "ssl.keystore.type=PKCS12".to_string(),
        format!("ssl.keystore.location={}", pki.p("server.p12")),
    ];
    let mut wrong = base.clone();
    wrong.push("ssl.keystore.password=nope".into());
    let err = serve_refuses(&wrong)?;
    ensure!(
        err.contains("ssl.keystore.location") && err.contains("wrong ssl.keystore.password"),
        "{err}"
    );
    let err = serve_refuses(&base)?;
    ensure!(err.contains("ssl.keystore.password"), "{err}");
    run_tool(
        "openssl",
        &[
            "pkcs12",
            "-export",
            "-nokeys",
            "-in",
            &pki.p("ca.pem"),
            "-passout",
            "pass:trust-secret",
            "-out",
            &pki.p("openssl-trust.p12"),
        ],
    )?;
    let mut untrusted = base.clone();
    untrusted.extend([
        "ssl.keystore.password=store-secret".to_string(),
        "ssl.client.auth=required".to_string(),
        "ssl.truststore.type=PKCS12".to_string(),
        format!("ssl.truststore.location={}", pki.p("openssl-trust.p12")),
        "ssl.truststore.password=trust-secret".to_string(),
    ]);
    let err = serve_refuses(&untrusted)?;
    ensure!(err.contains("no trusted certificate entry"), "{err}");
    Ok(())
}
