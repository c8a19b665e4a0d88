//! The secured broker of the interop suites (issue 13): one node with a listener per security
//! protocol, certificates made at run time, SCRAM users added before the suites start. The
//! suites find it through environment variables ([`SecureTarget::env`]); the plaintext broker
//! they already test stays as it is.
//!
//! | listener | protocol | what |
//! |---|---|---|
//! | `PLAINTEXT` | PLAINTEXT | inter-broker; setup only |
//! | `SSL` | SSL | `ssl.client.auth=requested`: TLS alone, or mTLS with a client certificate |
//! | `MTLS` | SSL | `ssl.client.auth=required` |
//! | `SASL_PLAINTEXT` | SASL_PLAINTEXT | PLAIN (users in the JAAS config) and SCRAM-SHA-256 |
//! | `SASL_SSL` | SASL_SSL | SCRAM-SHA-512 and OAUTHBEARER with unsecured JWTs |
//!
//! The same properties start the reference Kafka (`--against-kafka`), so that each suite's
//! security checks are shown to hold against Kafka too. gregor's SCRAM users come from
//! `gregor storage format --add-scram` (KIP-900); Kafka's from `kafka-configs --alter` on the
//! PLAINTEXT listener (AlterUserScramCredentials, KIP-554), once it runs.

use crate::kafka;
use crate::proc::{self, ChildGuard};
use anyhow::{bail, Context, Result};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// PLAIN's user on `SASL_PLAINTEXT` (from the listener's JAAS config).
const PLAIN_USER: (&str, &str) = ("alice", "alice-secret");
/// SCRAM-SHA-256's user on `SASL_PLAINTEXT`.
const SCRAM256_USER: (&str, &str) = ("bob", "bob-secret");
/// SCRAM-SHA-512's user on `SASL_SSL`.
const SCRAM512_USER: (&str, &str) = ("carol", "carol-secret");
/// The distinguished name of the client certificate (principal `User:CN=interop-client`).
const CLIENT_CN: &str = "interop-client";

/// A certificate authority that signs the broker's and the client's certificates.
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

    /// A certificate for `cn`, valid for 127.0.0.1 and localhost: (PKCS #8 key PEM, cert PEM).
    fn sign(&self, cn: &str) -> Result<(String, String)> {
        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((key.serialize_pem(), cert.pem()))
    }
}

/// The secured broker, stopped by [`SecureTarget::stop`] or when dropped.
pub struct SecureTarget {
    pub name: &'static str,
    pub log_file: PathBuf,
    guard: ChildGuard,
    env: Vec<(&'static str, String)>,
}

impl SecureTarget {
    /// Makes the certificates in `work/secure-<port>/`, starts gregor (`binary`) or, with
    /// `against_kafka`, the reference Kafka, and adds the SCRAM users.
    ///
    /// # Errors
    /// When a file cannot be written, a port is taken, or the broker does not come up (with the
    /// last lines of its log).
    pub fn start(work: &Path, binary: Option<&Path>) -> Result<Self> {
        let ports = proc::free_ports(6)?;
        let (plaintext, controller, ssl, mtls, sasl_plaintext, sasl_ssl) =
            (ports[0], ports[1], ports[2], ports[3], ports[4], ports[5]);
        let dir = work.join(format!("secure-{plaintext}"));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("wiping {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let write = |name: &str, text: &str| -> Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        };
        let ca = Ca::new("gregor interop CA")?;
        let ca_file = write("ca.pem", &ca.pem)?;
        let (broker_key, broker_cert) = ca.sign("gregor-interop-broker")?;
        let keystore = write("broker-keystore.pem", &format!("{broker_key}{broker_cert}"))?;
        let (client_key, client_cert) = ca.sign(CLIENT_CN)?;
        let client_key_file = write("client.key", &client_key)?;
        let client_cert_file = write("client.pem", &client_cert)?;
        let client_keystore = write("client-keystore.pem", &format!("{client_key}{client_cert}"))?;
        let untrusted = Ca::new("untrusted CA")?;
        let untrusted_ca = write("untrusted-ca.pem", &untrusted.pem)?;
        let (stranger_key, stranger_cert) = untrusted.sign(CLIENT_CN)?;
        let stranger_key_file = write("untrusted-client.key", &stranger_key)?;
        let stranger_cert_file = write("untrusted-client.pem", &stranger_cert)?;

        let host = "127.0.0.1";
        let listeners = format!(
            "PLAINTEXT://{host}:{plaintext},SSL://{host}:{ssl},MTLS://{host}:{mtls},\
             SASL_PLAINTEXT://{host}:{sasl_plaintext},SASL_SSL://{host}:{sasl_ssl}"
        );
        let (plain_user, plain_password) = PLAIN_USER;
        let mut props = vec![
            format!("listeners={listeners},CONTROLLER://{host}:{controller}"),
            format!("advertised.listeners={listeners}"),
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SSL:SSL,\
             MTLS:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"
                .to_string(),
            "inter.broker.listener.name=PLAINTEXT".into(),
            "controller.listener.names=CONTROLLER".into(),
            "ssl.keystore.type=PEM".into(),
            format!("ssl.keystore.location={}", keystore.display()),
            "ssl.truststore.type=PEM".into(),
            format!("ssl.truststore.location={}", ca_file.display()),
            "listener.name.ssl.ssl.client.auth=requested".into(),
            "listener.name.mtls.ssl.client.auth=required".into(),
            "listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256".into(),
            format!(
                "listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.\
                 security.plain.PlainLoginModule required user_{plain_user}=\"{plain_password}\";"
            ),
            "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.\
             security.scram.ScramLoginModule required;"
                .into(),
            "listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512,OAUTHBEARER".into(),
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.\
             security.scram.ScramLoginModule required;"
                .into(),
            "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config=org.apache.kafka.common.\
             security.oauthbearer.OAuthBearerLoginModule required;"
                .into(),
        ];
        let (name, guard, log_file) = match binary {
            Some(binary) => {
                props.extend([
                    "node.id=1".to_string(),
                    "process.roles=broker,controller".into(),
                    format!("controller.quorum.voters=1@{host}:{controller}"),
                    format!("log.dirs={}", dir.join("data").display()),
                    // No admin HTTP listener: its default port may be another gregor's.
                    "admin.listener=".into(),
                    "group.initial.rebalance.delay.ms=0".into(),
                ]);
                let config = write("server.properties", &(props.join("\n") + "\n"))?;
                let scram = |(mechanism, (user, password)): (&str, (&str, &str))| {
                    format!("{mechanism}=[name={user},password={password}]")
                };
                let mut format = Command::new(binary);
                format
                    .args(["storage", "format", "-t"])
                    .arg(gregor_tests::reference::random_cluster_id()?)
                    .arg("-c")
                    .arg(&config)
                    .arg("--add-scram")
                    .arg(scram(("SCRAM-SHA-256", SCRAM256_USER)))
                    .arg("--add-scram")
                    .arg(scram(("SCRAM-SHA-512", SCRAM512_USER)));
                proc::run_checked(&mut format).context("gregor storage format")?;
                let log_file = dir.join("gregor.log");
                let log = std::fs::File::create(&log_file)
                    .with_context(|| format!("creating {}", log_file.display()))?;
                let mut cmd = Command::new(binary);
                cmd.arg("serve")
                    .arg("--config")
                    .arg(&config)
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log);
                eprintln!(
                    "$ {} (log: {})",
                    proc::display_command(&cmd),
                    log_file.display()
                );
                let mut guard = ChildGuard::new(
                    "secured gregor",
                    cmd.spawn()
                        .with_context(|| format!("starting {}", binary.display()))?,
                );
                let addr = format!("{host}:{plaintext}").parse()?;
                proc::wait_for_broker(addr, 60_000, || guard.check_alive()).with_context(|| {
                    format!(
                        "the secured gregor did not come up; last lines of {}:\n{}",
                        log_file.display(),
                        proc::tail(&log_file, 30)
                    )
                })?;
                ("gregor", guard, log_file)
            }
            None => {
                kafka::fetch()?;
                let mut instance =
                    kafka::Instance::new(plaintext, Some(controller), Some(dir.join("data")))?;
                // Later lines win in a properties file: these replace the instance's listeners.
                instance.extra_properties = props;
                let mut guard = ChildGuard::new("secured kafka", instance.spawn()?);
                instance.wait_ready(|| guard.check_alive())?;
                for (mechanism, (user, password)) in [
                    ("SCRAM-SHA-256", SCRAM256_USER),
                    ("SCRAM-SHA-512", SCRAM512_USER),
                ] {
                    let args = [
                        "--bootstrap-server".to_string(),
                        instance.bootstrap(),
                        "--alter".into(),
                        "--entity-type".into(),
                        "users".into(),
                        "--entity-name".into(),
                        user.into(),
                        "--add-config".into(),
                        format!("{mechanism}=[password={password}]"),
                    ];
                    proc::run_checked(&mut kafka::tool_command("kafka-configs", &args)?)
                        .with_context(|| format!("adding the {mechanism} user {user}"))?;
                }
                ("kafka", guard, instance.server_log())
            }
        };
        let path = |p: &Path| p.display().to_string();
        let env = vec![
            (
                "GREGOR_SECURE_PLAINTEXT_BOOTSTRAP",
                format!("{host}:{plaintext}"),
            ),
            ("GREGOR_SSL_BOOTSTRAP", format!("{host}:{ssl}")),
            ("GREGOR_MTLS_BOOTSTRAP", format!("{host}:{mtls}")),
            (
                "GREGOR_SASL_PLAINTEXT_BOOTSTRAP",
                format!("{host}:{sasl_plaintext}"),
            ),
            ("GREGOR_SASL_SSL_BOOTSTRAP", format!("{host}:{sasl_ssl}")),
            ("GREGOR_CA", path(&ca_file)),
            ("GREGOR_UNTRUSTED_CA", path(&untrusted_ca)),
            ("GREGOR_CLIENT_CERT", path(&client_cert_file)),
            ("GREGOR_CLIENT_KEY", path(&client_key_file)),
            ("GREGOR_CLIENT_KEYSTORE", path(&client_keystore)),
            ("GREGOR_CLIENT_DN", format!("CN={CLIENT_CN}")),
            ("GREGOR_UNTRUSTED_CLIENT_CERT", path(&stranger_cert_file)),
            ("GREGOR_UNTRUSTED_CLIENT_KEY", path(&stranger_key_file)),
            ("GREGOR_PLAIN_USER", PLAIN_USER.0.into()),
            ("GREGOR_PLAIN_PASSWORD", PLAIN_USER.1.into()),
            ("GREGOR_SCRAM256_USER", SCRAM256_USER.0.into()),
            ("GREGOR_SCRAM256_PASSWORD", SCRAM256_USER.1.into()),
            ("GREGOR_SCRAM512_USER", SCRAM512_USER.0.into()),
            ("GREGOR_SCRAM512_PASSWORD", SCRAM512_USER.1.into()),
            ("GREGOR_SECURE_LOG", path(&log_file)),
        ];
        Ok(Self {
            name,
            log_file,
            guard,
            env,
        })
    }

    /// Sets the suites' environment variables on `cmd`: the endpoints (`GREGOR_SSL_BOOTSTRAP`,
    /// `GREGOR_MTLS_BOOTSTRAP`, `GREGOR_SASL_PLAINTEXT_BOOTSTRAP`, `GREGOR_SASL_SSL_BOOTSTRAP`,
    /// `GREGOR_SECURE_PLAINTEXT_BOOTSTRAP`), the PEM files (`GREGOR_CA`, `GREGOR_UNTRUSTED_CA`,
    /// `GREGOR_CLIENT_CERT`, `GREGOR_CLIENT_KEY`, `GREGOR_CLIENT_KEYSTORE` (key and
    /// certificate in one file), `GREGOR_UNTRUSTED_CLIENT_CERT`/`_KEY`) and the users
    /// (`GREGOR_PLAIN_USER`/`_PASSWORD`, `GREGOR_SCRAM256_...`, `GREGOR_SCRAM512_...`), and the
    /// broker's log (`GREGOR_SECURE_LOG`).
    pub fn env(&self, cmd: &mut Command) {
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
    }

    /// Errors (with the last lines of its log) when the broker has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if self.guard.check_alive().is_err() {
            bail!(
                "the secured {} died during the suite; last lines of {}:\n{}",
                self.name,
                self.log_file.display(),
                proc::tail(&self.log_file, 30)
            );
        }
        Ok(())
    }

    pub fn stop(mut self) {
        eprintln!(
            "Stopping the secured {} (pid {})",
            self.name,
            self.guard.id()
        );
        if let Err(e) = self.guard.stop() {
            eprintln!("warning: stopping the secured {}: {e:#}", self.name);
        }
    }
}
