//! The TLS set-up of `cargo xtask bench`'s SSL workloads (issue 13: the cost of TLS on
//! throughput, gregor vs Kafka): one CA and one server certificate for 127.0.0.1 made at run
//! time with rcgen (never committed), written as PEM files that both brokers read the same way
//! (`ssl.keystore.type=PEM`, `ssl.keystore.location` holding the PKCS #8 key and the
//! certificate), and the librdkafka properties of the load generator (`security.protocol=ssl`,
//! `ssl.ca.location`, hostname verification left on).

use anyhow::{Context, Result};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use std::path::{Path, PathBuf};

/// The PEM files of one bench run.
pub struct BenchTls {
    /// The CA certificate the load generator trusts.
    pub ca: PathBuf,
    /// The brokers' keystore: the server key (PKCS #8) followed by its certificate.
    pub keystore: PathBuf,
}

impl BenchTls {
    /// Makes a CA and a server certificate for 127.0.0.1 and localhost (ECDSA P-256, rcgen's
    /// default) and writes them under `dir`.
    ///
    /// # Errors
    /// When a certificate cannot be made or a file cannot be written.
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "gregor bench CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
        params
            .distinguished_name
            .push(DnType::CommonName, "gregor bench broker");
        let cert = params.signed_by(&key, &issuer)?;

        let tls = Self {
            ca: dir.join("bench-ca.pem"),
            keystore: dir.join("bench-broker.pem"),
        };
        std::fs::write(&tls.ca, ca_cert.pem())
            .with_context(|| format!("writing {}", tls.ca.display()))?;
        std::fs::write(
            &tls.keystore,
            format!("{}{}", key.serialize_pem(), cert.pem()),
        )
        .with_context(|| format!("writing {}", tls.keystore.display()))?;
        Ok(tls)
    }

    /// The broker settings of an SSL listener named `SSL` (gregor's `--set`s and Kafka's
    /// `server.properties` lines alike), besides the listener itself.
    pub fn broker_settings(&self) -> Vec<String> {
        vec![
            "ssl.keystore.type=PEM".to_string(),
            format!("ssl.keystore.location={}", self.keystore.display()),
        ]
    }

    /// The load generator's librdkafka properties (`-X`) for the SSL listener.
    pub fn client_properties(&self) -> Vec<(String, String)> {
        vec![
            ("security.protocol".to_string(), "ssl".to_string()),
            ("ssl.ca.location".to_string(), self.ca.display().to_string()),
        ]
    }
}
