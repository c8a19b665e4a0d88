//! Storage formatting as Apache Kafka 4.4's `kafka-storage format` does it, and the checks a
//! starting node makes on what it finds.
//!
//! Formatting writes, in every log dir and the metadata log dir, a `meta.properties`
//! (`version=1`, `node.id`, `cluster.id`, `directory.id`), and, on a controller, the bootstrap
//! snapshot `__cluster_metadata-0/00000000000000000000-0000000000.checkpoint` in the metadata
//! log dir: a SnapshotHeader, the `FeatureLevelRecord`s of the cluster's initial finalized
//! features, and a SnapshotFooter; with a KIP-853 dynamic quorum (`--standalone`,
//! `--initial-controllers`) also KRaftVersion(1) and KRaftVoters. The rules (which features
//! at which levels, which combinations are refused and with which message) are Kafka's
//! `Formatter` and `StorageTool`; `crates/cli/tests/storage_format.rs` checks them against
//! the real tool.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use gregor_protocol::kafka_protocol::messages::voters_record::{
    Endpoint, KRaftVersionFeature, Voter,
};
use gregor_protocol::kafka_protocol::messages::{
    KRaftVersionRecord, SnapshotFooterRecord, SnapshotHeaderRecord, VotersRecord,
};
use gregor_protocol::kafka_protocol::protocol::StrBytes;
use gregor_protocol::metadata_records::log::{
    build_control_batch, build_metadata_batch, ControlRecord,
};
use gregor_protocol::metadata_records::{ApiMessageAndVersion, FeatureLevelRecord};
use thiserror::Error;
use uuid::Uuid;

/// The file naming a log dir's node, cluster and directory id.
pub const META_PROPERTIES: &str = "meta.properties";
/// The KRaft metadata log's directory inside the metadata log dir.
pub const CLUSTER_METADATA_DIR: &str = "__cluster_metadata-0";
/// The bootstrap snapshot (end offset 0, epoch 0) that `format` writes on controllers.
pub const BOOTSTRAP_SNAPSHOT: &str = "00000000000000000000-0000000000.checkpoint";

/// Why formatting or the start-up check failed. The message is the operator's: it names the
/// problem, and for Kafka's own checks it is Kafka's wording.
#[derive(Debug, Error)]
pub enum StorageError {
    /// The configuration or the arguments are inconsistent.
    #[error("{0}")]
    Invalid(String),
    /// A file or directory could not be read or written.
    #[error("{context} {path}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

fn invalid(msg: impl Into<String>) -> StorageError {
    StorageError::Invalid(msg.into())
}

fn io(context: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StorageError {
    let path = path.to_path_buf();
    move |source| StorageError::Io {
        context,
        path,
        source,
    }
}

// ---------------------------------------------------------------------------------------------
// Uuids

/// URL-safe base64 without padding, as Kafka prints a `Uuid` (22 characters for 16 bytes).
pub fn base64_url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// Parses a Kafka `Uuid` string (22 characters of URL-safe base64).
pub fn parse_kafka_uuid(s: &str) -> Option<Uuid> {
    if s.len() != 22 {
        return None;
    }
    let mut bits: u128 = 0;
    for (i, c) in s.bytes().enumerate() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        if i < 21 {
            bits = (bits << 6) | u128::from(v);
        } else {
            // The last character carries the 2 remaining bits in its high bits.
            if v & 0x0f != 0 {
                return None;
            }
            bits = (bits << 2) | u128::from(v >> 4);
        }
    }
    Some(Uuid::from_u128(bits))
}

/// The Kafka string form of `id`.
pub fn kafka_uuid_string(id: Uuid) -> String {
    base64_url(id.as_bytes())
}

/// Kafka reserves the all-zero uuid and 1 (the metadata topic's id), and directory ids
/// below 100 (`DirectoryId.UNASSIGNED`, `LOST`, `MIGRATING` and future ones).
fn is_reserved(id: Uuid) -> bool {
    id.as_u128() < 100
}

/// A random id as Kafka's `Uuid.randomUuid()`: never a reserved one, never one whose string
/// starts with `-` (it would read as a command-line flag).
pub fn random_uuid() -> Uuid {
    loop {
        let id = Uuid::new_v4();
        if !is_reserved(id) && !kafka_uuid_string(id).starts_with('-') {
            return id;
        }
    }
}

/// A new cluster id, as `gregor storage random-uuid` prints it.
pub fn random_cluster_id() -> String {
    kafka_uuid_string(random_uuid())
}

// ---------------------------------------------------------------------------------------------
// meta.properties

/// The contents of a `meta.properties` (Kafka's version 1, KRaft).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaProperties {
    /// `cluster.id`.
    pub cluster_id: String,
    /// `node.id`.
    pub node_id: i32,
    /// `directory.id` (KIP-858), if written.
    pub directory_id: Option<Uuid>,
}

impl MetaProperties {
    /// Parses the text of a `meta.properties` file. Only Kafka's version 1 (KRaft) is
    /// accepted; version 0 is a ZooKeeper-era broker.
    ///
    /// # Errors
    /// [`StorageError::Invalid`] naming the missing or bad key.
    pub fn parse(text: &str) -> Result<Self, StorageError> {
        let props: BTreeMap<&str, &str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('!'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim(), v.trim()))
            .collect();
        match props.get("version").copied() {
            Some("1") => {}
            Some("0") => {
                return Err(invalid(
                    "it is a version 0 meta.properties (a ZooKeeper-mode broker); KRaft needs version 1",
                ))
            }
            Some(v) => return Err(invalid(format!("unknown meta.properties version {v}"))),
            None => return Err(invalid("no version in meta.properties")),
        }
        let cluster_id = props
            .get("cluster.id")
            .ok_or_else(|| invalid("no cluster.id in meta.properties"))?
            .to_string();
        let node_id = props
            .get("node.id")
            .ok_or_else(|| invalid("no node.id in meta.properties"))?;
        let node_id = node_id.parse::<i32>().map_err(|_| {
            invalid(format!(
                "node.id {node_id} in meta.properties is not a number"
            ))
        })?;
        let directory_id = match props.get("directory.id") {
            None => None,
            Some(s) => Some(parse_kafka_uuid(s).ok_or_else(|| {
                invalid(format!(
                    "directory.id {s} in meta.properties is not a Kafka uuid"
                ))
            })?),
        };
        Ok(Self {
            cluster_id,
            node_id,
            directory_id,
        })
    }

    /// The file's text, with the keys Kafka 4.4 writes, in its order.
    pub fn to_file_text(&self) -> String {
        let mut out = format!(
            "#\n#Written by gregor {}\nnode.id={}\n",
            env!("CARGO_PKG_VERSION"),
            self.node_id
        );
        if let Some(d) = self.directory_id {
            out.push_str(&format!("directory.id={}\n", kafka_uuid_string(d)));
        }
        out.push_str(&format!("version=1\ncluster.id={}\n", self.cluster_id));
        out
    }
}

/// Reads `<dir>/meta.properties`; `None` when the dir or the file does not exist.
///
/// # Errors
/// An unreadable or invalid file (the message names it).
pub fn read_meta_properties(dir: &Path) -> Result<Option<MetaProperties>, StorageError> {
    let path = dir.join(META_PROPERTIES);
    match std::fs::read_to_string(&path) {
        Ok(text) => MetaProperties::parse(&text)
            .map(Some)
            .map_err(|e| invalid(format!("Error loading {}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io("reading", &path)(e)),
    }
}

/// Writes `<dir>/meta.properties` through a temporary file and a rename, then syncs both.
///
/// # Errors
/// The I/O error, naming the file.
pub fn write_meta_properties(dir: &Path, props: &MetaProperties) -> Result<(), StorageError> {
    std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let path = dir.join(META_PROPERTIES);
    let tmp = dir.join("meta.properties.tmp");
    write_synced(&tmp, props.to_file_text().as_bytes())?;
    std::fs::rename(&tmp, &path).map_err(io("renaming", &tmp))?;
    sync_dir(dir)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(io("creating", path))?;
    f.write_all(bytes).map_err(io("writing", path))?;
    f.sync_all().map_err(io("syncing", path))
}

fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("syncing", dir))
}

// ---------------------------------------------------------------------------------------------
// metadata.version and the other features

/// `(version, feature level)` of every `metadata.version` Kafka 4.4.0 knows, oldest first.
/// The last one is not production-ready (only with `unstable.feature.versions.enable`).
const METADATA_VERSIONS: &[(&str, i16)] = &[
    ("3.3-IV3", 7),
    ("3.4-IV0", 8),
    ("3.5-IV0", 9),
    ("3.5-IV1", 10),
    ("3.5-IV2", 11),
    ("3.6-IV0", 12),
    ("3.6-IV1", 13),
    ("3.6-IV2", 14),
    ("3.7-IV0", 15),
    ("3.7-IV1", 16),
    ("3.7-IV2", 17),
    ("3.7-IV3", 18),
    ("3.7-IV4", 19),
    ("3.8-IV0", 20),
    ("3.9-IV0", 21),
    ("4.0-IV0", 22),
    ("4.0-IV1", 23),
    ("4.0-IV2", 24),
    ("4.0-IV3", 25),
    ("4.1-IV0", 26),
    ("4.1-IV1", 27),
    ("4.2-IV0", 28),
    ("4.2-IV1", 29),
    ("4.3-IV0", 30),
    ("4.4-IV0", 31),
    ("4.4-IV1", 32),
    ("4.4-IV2", 33),
    ("4.5-IV0", 34),
];

/// The newest production `metadata.version`, 4.4-IV2 (level 33), gregor's default (see
/// [`MetadataVersion::latest_production`]).
const LATEST_PRODUCTION_LEVEL: i16 = 33;

/// A `metadata.version`: the cluster's metadata format level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct MetadataVersion {
    level: i16,
}

impl MetadataVersion {
    /// The feature's name.
    pub const FEATURE_NAME: &'static str = "metadata.version";

    /// The default of `gregor storage format`: 4.4-IV2 (level 33), Kafka 4.4.0's newest
    /// production level. gregor reads and writes every metadata record at the versions this
    /// level implies (`gregor_protocol::metadata_records` round-trips Kafka 4.4.0's own logs
    /// byte for byte), and a lower default would make a gregor-formatted node disagree with
    /// Kafka 4.4 nodes formatted with their default; the features this level finalizes
    /// (`transaction.version` 2, `share.version` 2, ...) are what Kafka nodes of the cluster
    /// act on, while gregor's brokers advertise what they implement in ApiVersions.
    pub fn latest_production() -> Self {
        Self {
            level: LATEST_PRODUCTION_LEVEL,
        }
    }

    /// The version with feature level `level`, if Kafka 4.4 knows it.
    pub fn from_feature_level(level: i16) -> Option<Self> {
        METADATA_VERSIONS
            .iter()
            .any(|(_, l)| *l == level)
            .then_some(Self { level })
    }

    /// Parses a release version: `4.4-IV2`, `4.4` (the release's newest level), `4.4.0`
    /// (the same); only production levels unless `unstable` (Kafka's
    /// `MetadataVersion.fromVersionString`).
    ///
    /// # Errors
    /// Kafka's message, listing the versions that are accepted.
    pub fn from_version_string(s: &str, unstable: bool) -> Result<Self, StorageError> {
        let parts: Vec<&str> = s.split('.').collect();
        let key = if parts.len() >= 3 {
            parts[..2].join(".")
        } else {
            s.to_string()
        };
        let found = METADATA_VERSIONS
            .iter()
            .filter(|(v, _)| *v == key || v.split('-').next() == Some(key.as_str()))
            .map(|(_, l)| *l)
            .filter(|l| unstable || *l <= LATEST_PRODUCTION_LEVEL)
            .max();
        found.map(|level| Self { level }).ok_or_else(|| {
            let supported: Vec<&str> = METADATA_VERSIONS
                .iter()
                .filter(|(_, l)| unstable || *l <= LATEST_PRODUCTION_LEVEL)
                .map(|(v, _)| *v)
                .collect();
            invalid(format!(
                "Unknown metadata.version '{s}'. Supported metadata.version are: {}",
                supported.join(", ")
            ))
        })
    }

    /// The feature level.
    pub fn feature_level(self) -> i16 {
        self.level
    }

    /// `4.4-IV2`.
    pub fn version(self) -> &'static str {
        METADATA_VERSIONS
            .iter()
            .find(|(_, l)| *l == self.level)
            .map_or("?", |(v, _)| v)
    }

    /// Whether Kafka calls it production-ready.
    pub fn is_production(self) -> bool {
        self.level <= LATEST_PRODUCTION_LEVEL
    }
}

impl fmt::Display for MetadataVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.version())
    }
}

/// A feature other than `metadata.version` that Kafka 4.4 finalizes at format time.
struct Feature {
    name: &'static str,
    /// Highest production level (unstable levels: none in 4.4.0 beyond these).
    max_level: i16,
    /// `(metadata.version level, default level)`: from that MV on, the default is that level.
    defaults: &'static [(i16, i16)],
    /// `(level, required metadata.version level)`.
    mv_dependencies: &'static [(i16, i16)],
}

/// Kafka 4.4.0's production features, by name (the order of `TreeMap` iteration, which is the
/// order the records are written in after `metadata.version`). Levels and defaults are from
/// `kafka-storage version-mapping` and `feature-dependencies` of 4.4.0.
const FEATURES: &[Feature] = &[
    Feature {
        name: "eligible.leader.replicas.version",
        max_level: 1,
        defaults: &[(26, 1)],
        mv_dependencies: &[(1, 23)],
    },
    Feature {
        name: "group.version",
        max_level: 1,
        defaults: &[(22, 1)],
        mv_dependencies: &[],
    },
    Feature {
        name: KRAFT_VERSION,
        max_level: 1,
        defaults: &[(21, 1)],
        mv_dependencies: &[],
    },
    Feature {
        name: "share.version",
        max_level: 2,
        defaults: &[(28, 1), (31, 2)],
        mv_dependencies: &[],
    },
    Feature {
        name: "streams.version",
        max_level: 1,
        defaults: &[(29, 1)],
        mv_dependencies: &[],
    },
    Feature {
        name: "transaction.version",
        max_level: 2,
        defaults: &[(24, 2)],
        mv_dependencies: &[],
    },
];

const KRAFT_VERSION: &str = "kraft.version";

impl Feature {
    fn default_level(&self, mv: MetadataVersion) -> i16 {
        self.defaults
            .iter()
            .rev()
            .find(|(from, _)| mv.level >= *from)
            .map(|(_, l)| *l)
            .unwrap_or(0)
    }
}

/// Parses a `--feature` argument, `name=level`.
///
/// # Errors
/// Kafka's message for a missing `=` or a level that is not a short.
pub fn parse_feature_arg(arg: &str) -> Result<(String, i16), StorageError> {
    let (name, level) = arg.split_once('=').ok_or_else(|| {
        invalid(format!(
            "Can't parse feature=level string {arg}: equals sign not found."
        ))
    })?;
    let level = level.trim().parse::<i16>().map_err(|_| {
        invalid(format!(
            "Can't parse feature=level string {arg}: unable to parse {} as a short.",
            level.trim()
        ))
    })?;
    Ok((name.trim().to_string(), level))
}

// ---------------------------------------------------------------------------------------------
// Dynamic voters (KIP-853)

/// One `--initial-controllers` entry, `id@host:port:directory-id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicVoter {
    /// The controller's node id.
    pub node_id: i32,
    /// Host of its controller listener.
    pub host: String,
    /// Port of its controller listener.
    pub port: u16,
    /// The directory id of its metadata log dir.
    pub directory_id: Uuid,
}

impl DynamicVoter {
    /// Parses `id@host:port:directory-id` (`host` may be `[ipv6]`), with Kafka's messages.
    ///
    /// # Errors
    /// [`StorageError::Invalid`] saying which part is wrong.
    pub fn parse(input: &str) -> Result<Self, StorageError> {
        let s = input.trim();
        let at = s
            .find('@')
            .ok_or_else(|| invalid("No @ found in dynamic voter string."))?;
        if at == 0 {
            return Err(invalid("Invalid @ at beginning of dynamic voter string."));
        }
        let node_id: i32 = s[..at]
            .parse()
            .map_err(|_| invalid("Failed to parse node id in dynamic voter string."))?;
        if node_id < 0 {
            return Err(invalid(format!(
                "Invalid negative node id {node_id} in dynamic voter string."
            )));
        }
        let rest = &s[at + 1..];
        if rest.is_empty() {
            return Err(invalid("No hostname found after node id."));
        }
        let (host, rest) = if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').ok_or_else(|| {
                invalid("Hostname began with left bracket, but no right bracket was found.")
            })?;
            (&r[..end], &r[end + 1..])
        } else {
            let colon = rest
                .find(':')
                .ok_or_else(|| invalid("No colon following hostname could be found."))?;
            (&rest[..colon], &rest[colon..])
        };
        let rest = rest
            .strip_prefix(':')
            .ok_or_else(|| invalid("Port section must start with a colon."))?;
        let colon = rest
            .find(':')
            .ok_or_else(|| invalid("No colon following port could be found."))?;
        let port: i64 = rest[..colon]
            .parse()
            .map_err(|_| invalid("Failed to parse port in dynamic voter string."))?;
        let port = u16::try_from(port)
            .map_err(|_| invalid(format!("Invalid port {port} in dynamic voter string.")))?;
        let directory_id = parse_kafka_uuid(&rest[colon + 1..])
            .ok_or_else(|| invalid("Failed to parse directory ID in dynamic voter string."))?;
        Ok(Self {
            node_id,
            host: host.to_string(),
            port,
            directory_id,
        })
    }
}

/// Parses the `--initial-controllers` list (comma-separated [`DynamicVoter`]s).
///
/// # Errors
/// An empty list, a bad entry, or a node id given twice.
pub fn parse_dynamic_voters(s: &str) -> Result<Vec<DynamicVoter>, StorageError> {
    let mut voters: Vec<DynamicVoter> = Vec::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let v = DynamicVoter::parse(part)?;
        if voters.iter().any(|o| o.node_id == v.node_id) {
            return Err(invalid(format!(
                "Node id {} was specified more than once.",
                v.node_id
            )));
        }
        voters.push(v);
    }
    if voters.is_empty() {
        return Err(invalid("No voters given."));
    }
    voters.sort_by_key(|v| v.node_id);
    Ok(voters)
}

// ---------------------------------------------------------------------------------------------
// The node's configuration, as far as formatting needs it

/// A `host:port` endpoint of a listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerEndpoint {
    /// Listener name, upper-case.
    pub name: String,
    /// Host; empty when the listener binds every interface.
    pub host: String,
    /// Port.
    pub port: u16,
}

/// What formatting reads from `server.properties` (Kafka's property names and rules).
#[derive(Debug, Clone)]
pub struct StorageConfig {
    /// `node.id` (required).
    pub node_id: i32,
    /// `process.roles` contains `broker`.
    pub broker: bool,
    /// `process.roles` contains `controller`.
    pub controller: bool,
    /// `controller.quorum.voters`: node ids (static quorum).
    pub static_voters: Vec<i32>,
    /// `controller.listener.names`.
    pub controller_listener_names: Vec<String>,
    /// The advertised endpoints of the controller listeners (`advertised.listeners`, else
    /// `listeners`).
    pub controller_endpoints: Vec<ListenerEndpoint>,
    /// `log.dirs` (or `log.dir`); gregor's default `./gregor-data`.
    pub log_dirs: Vec<PathBuf>,
    /// `metadata.log.dir`, default the first log dir.
    pub metadata_log_dir: PathBuf,
    /// `unstable.feature.versions.enable`.
    pub unstable_feature_versions: bool,
}

fn parse_endpoints(v: &str) -> Vec<ListenerEndpoint> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .filter_map(|l| {
            let (name, addr) = l.split_once("://")?;
            let (host, port) = addr.rsplit_once(':')?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            Some(ListenerEndpoint {
                name: name.trim().to_ascii_uppercase(),
                host: host.to_string(),
                port: port.trim().parse().ok()?,
            })
        })
        .collect()
}

impl StorageConfig {
    /// Reads and checks the properties as Kafka's `KafkaConfig` does for a KRaft node.
    ///
    /// # Errors
    /// [`StorageError::Invalid`] with the rule that is broken.
    pub fn from_properties(props: &BTreeMap<String, String>) -> Result<Self, StorageError> {
        let get = |k: &str| props.get(k).map(|v| v.trim().to_string());
        let node_id = get("node.id").ok_or_else(|| {
            invalid("Missing required configuration \"node.id\" which has no default value.")
        })?;
        let node_id: i32 = node_id.parse().map_err(|_| {
            invalid(format!(
                "Invalid value {node_id} for configuration node.id: Not a number of type INT"
            ))
        })?;
        let roles = get("process.roles").ok_or_else(|| {
            invalid("Missing required configuration \"process.roles\" which has no default value.")
        })?;
        let (mut broker, mut controller) = (false, false);
        for r in roles.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            match r {
                "broker" => broker = true,
                "controller" => controller = true,
                other => {
                    return Err(invalid(format!(
                        "Invalid value {roles} for configuration process.roles: Unknown process role '{other}' (only 'broker' and 'controller' are allowed roles)"
                    )))
                }
            }
        }
        if !broker && !controller {
            return Err(invalid(
                "Configuration 'process.roles' must not be empty. Valid values include: [broker, controller]",
            ));
        }
        let mut static_voters = Vec::new();
        for v in get("controller.quorum.voters")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let id = v
                .split_once('@')
                .and_then(|(id, addr)| addr.rsplit_once(':').map(|_| id))
                .and_then(|id| id.trim().parse::<i32>().ok())
                .ok_or_else(|| {
                    invalid(format!(
                        "Invalid value {v} in controller.quorum.voters: expected {{id}}@{{host}}:{{port}}"
                    ))
                })?;
            static_voters.push(id);
        }
        let bootstrap_servers = get("controller.quorum.bootstrap.servers").unwrap_or_default();
        if static_voters.is_empty() && bootstrap_servers.is_empty() {
            return Err(invalid(
                "If using process.roles, either controller.quorum.bootstrap.servers must contain the set of bootstrap controllers or controller.quorum.voters must contain a parseable set of controllers.",
            ));
        }
        let voter_set = || {
            let ids: Vec<String> = static_voters.iter().map(i32::to_string).collect();
            format!("Set({})", ids.join(", "))
        };
        if !static_voters.is_empty() {
            if controller && !static_voters.contains(&node_id) {
                return Err(invalid(format!(
                    "If process.roles contains the 'controller' role, the node id {node_id} must be included in the set of voters controller.quorum.voters={}",
                    voter_set()
                )));
            }
            if !controller && static_voters.contains(&node_id) {
                return Err(invalid(format!(
                    "If process.roles contains just the 'broker' role, the node id {node_id} must not be included in the set of voters controller.quorum.voters={}",
                    voter_set()
                )));
            }
        }
        let controller_listener_names: Vec<String> = get("controller.listener.names")
            .unwrap_or_default()
            .split(',')
            .map(|s| s.trim().to_ascii_uppercase())
            .filter(|s| !s.is_empty())
            .collect();
        if controller_listener_names.is_empty() {
            return Err(invalid(
                "controller.listener.names must contain at least one value when running in KRaft mode (process.roles is set)",
            ));
        }
        let listeners = parse_endpoints(&get("listeners").unwrap_or_default());
        let advertised = parse_endpoints(&get("advertised.listeners").unwrap_or_default());
        if controller
            && !listeners
                .iter()
                .any(|l| controller_listener_names.contains(&l.name))
        {
            return Err(invalid(format!(
                "controller.listener.names must contain at least one value appearing in the 'listeners' configuration when running the KRaft controller role (controller.listener.names={}, listeners={})",
                controller_listener_names.join(","),
                get("listeners").unwrap_or_default()
            )));
        }
        let controller_endpoints = controller_listener_names
            .iter()
            .filter_map(|name| {
                advertised
                    .iter()
                    .find(|l| &l.name == name)
                    .or_else(|| listeners.iter().find(|l| &l.name == name))
                    .cloned()
            })
            .collect();
        let log_dirs: Vec<PathBuf> = get("log.dirs")
            .or_else(|| get("log.dir"))
            .unwrap_or_else(|| "./gregor-data".into())
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect();
        if log_dirs.is_empty() {
            return Err(invalid("You must specify at least one directory to format"));
        }
        let metadata_log_dir = get("metadata.log.dir")
            .filter(|s| !s.is_empty())
            .map_or_else(|| log_dirs[0].clone(), PathBuf::from);
        Ok(Self {
            node_id,
            broker,
            controller,
            static_voters,
            controller_listener_names,
            controller_endpoints,
            log_dirs,
            metadata_log_dir,
            unstable_feature_versions: get("unstable.feature.versions.enable")
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        })
    }

    /// Every dir to format: `log.dirs` and `metadata.log.dir`, sorted, without duplicates.
    pub fn directories(&self) -> BTreeSet<PathBuf> {
        let mut d: BTreeSet<PathBuf> = self.log_dirs.iter().cloned().collect();
        d.insert(self.metadata_log_dir.clone());
        d
    }
}

// ---------------------------------------------------------------------------------------------
// The format command

/// How the quorum is initialised (the mutually exclusive flags of `format`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum InitialControllers {
    /// None of the flags.
    #[default]
    Unspecified,
    /// `--standalone`: this controller alone, with a new directory id.
    Standalone,
    /// `--initial-controllers`: these voters.
    Listed(Vec<DynamicVoter>),
    /// `--no-initial-controllers`.
    None,
}

/// The arguments of `format` other than the configuration.
#[derive(Debug, Clone, Default)]
pub struct FormatOptions {
    /// `--cluster-id`.
    pub cluster_id: String,
    /// `--release-version`.
    pub release_version: Option<String>,
    /// `--feature name=level` (parsed).
    pub features: Vec<(String, i16)>,
    /// `--ignore-formatted`.
    pub ignore_formatted: bool,
    /// `--standalone`, `--initial-controllers`, `--no-initial-controllers`.
    pub initial_controllers: InitialControllers,
    /// `--add-scram` arguments (KIP-900: UserScramCredentialRecords in the bootstrap).
    pub add_scram: Vec<String>,
}

/// What a successful format did, for the command's output.
#[derive(Debug, Clone, Default)]
pub struct FormatReport {
    /// Lines to print, as Kafka prints them.
    pub lines: Vec<String>,
    /// The bootstrap records (empty when none was written and none would be).
    pub bootstrap_records: Vec<ApiMessageAndVersion>,
}

/// The computed result of the rules, before anything is written.
#[derive(Debug, Clone)]
pub struct FormatPlan {
    /// The `metadata.version`.
    pub release_version: MetadataVersion,
    /// Every finalized feature level, `metadata.version` and `kraft.version` included.
    pub feature_levels: BTreeMap<String, i16>,
    /// The KIP-853 voters to write, if any.
    pub voters: Option<Vec<DynamicVoter>>,
    /// The bootstrap metadata records (FeatureLevelRecords), in Kafka's order.
    pub bootstrap_records: Vec<ApiMessageAndVersion>,
}

/// Applies Kafka 4.4's rules (`StorageTool.runFormatCommand` and `Formatter`) to the
/// configuration and the arguments; writes nothing.
///
/// # Errors
/// [`StorageError::Invalid`] with Kafka's message for the first rule broken.
pub fn plan_format(cfg: &StorageConfig, opts: &FormatOptions) -> Result<FormatPlan, StorageError> {
    let has_dynamic_quorum = cfg.static_voters.is_empty();
    if !cfg.static_voters.is_empty()
        && matches!(
            opts.initial_controllers,
            InitialControllers::Standalone | InitialControllers::Listed(_)
        )
    {
        return Err(invalid(
            "You cannot specify controller.quorum.voters and format the node with --initial-controllers or --standalone. If you want to use dynamic quorum, please remove controller.quorum.voters and specify controller.quorum.bootstrap.servers instead.",
        ));
    }
    let voters = match &opts.initial_controllers {
        InitialControllers::Listed(v) => Some(v.clone()),
        InitialControllers::Standalone => {
            if !cfg.controller {
                return Err(invalid("You can only use --standalone on a controller."));
            }
            let l = cfg
                .controller_endpoints
                .first()
                .ok_or_else(|| invalid("No controller listeners found."))?;
            let host = if l.host.is_empty() {
                "localhost".to_string()
            } else {
                l.host.clone()
            };
            Some(vec![DynamicVoter {
                node_id: cfg.node_id,
                host,
                port: l.port,
                directory_id: random_uuid(),
            }])
        }
        InitialControllers::Unspecified | InitialControllers::None => None,
    };
    if opts.initial_controllers == InitialControllers::Unspecified
        && cfg.controller
        && cfg.static_voters.is_empty()
        && voters.is_none()
    {
        return Err(invalid(
            "Because controller.quorum.voters is not set on this controller, you must specify one of the following: --standalone, --initial-controllers, or --no-initial-controllers.",
        ));
    }
    let scram_records = opts
        .add_scram
        .iter()
        .map(|a| parse_add_scram(a))
        .collect::<Result<Vec<_>, _>>()?;
    if cfg.node_id < 0 {
        return Err(invalid("You must specify a valid non-negative node ID."));
    }

    // Formatter.calculateEffectiveReleaseVersion
    let requested: BTreeMap<String, i16> = opts.features.iter().cloned().collect();
    let unstable = cfg.unstable_feature_versions;
    let verify = |mv: MetadataVersion| -> Result<MetadataVersion, StorageError> {
        if !unstable && !mv.is_production() {
            return Err(invalid(format!("metadata.version {mv} is not yet stable.")));
        }
        Ok(mv)
    };
    let release_version = if let Some(level) = requested.get(MetadataVersion::FEATURE_NAME) {
        if opts.release_version.is_some() {
            return Err(invalid(
                "Use --release-version instead of --feature metadata.version=X to avoid ambiguity.",
            ));
        }
        let mv = MetadataVersion::from_feature_level(*level).ok_or_else(|| {
            invalid(format!(
                "No MetadataVersion with feature level {level}. Valid feature levels are from {} to {}.",
                METADATA_VERSIONS[0].1,
                if unstable { METADATA_VERSIONS[METADATA_VERSIONS.len() - 1].1 } else { LATEST_PRODUCTION_LEVEL }
            ))
        })?;
        verify(mv)?
    } else if let Some(v) = &opts.release_version {
        verify(MetadataVersion::from_version_string(v, unstable)?)?
    } else {
        MetadataVersion::latest_production()
    };

    // Formatter.calculateEffectiveFeatureLevels
    let mut levels: BTreeMap<String, i16> = BTreeMap::new();
    for (name, level) in &requested {
        if name != MetadataVersion::FEATURE_NAME && !FEATURES.iter().any(|f| f.name == name) {
            let names: Vec<&str> = FEATURES.iter().map(|f| f.name).collect();
            return Err(invalid(format!(
                "Unsupported feature: {name}. Supported features are: {}",
                names.join(", ")
            )));
        }
        levels.insert(name.clone(), *level);
    }
    levels.insert(
        MetadataVersion::FEATURE_NAME.to_string(),
        release_version.feature_level(),
    );
    for f in FEATURES {
        if f.name == KRAFT_VERSION {
            let level = match requested.get(KRAFT_VERSION) {
                Some(0) if has_dynamic_quorum => return Err(invalid(
                    "Cannot set kraft.version to 0 if controller.quorum.voters is empty and one of the flags --standalone, --initial-controllers, or --no-initial-controllers is used. For dynamic controllers support, try removing the --feature flag for kraft.version.",
                )),
                Some(l) if *l != 0 && !has_dynamic_quorum => return Err(invalid(format!(
                    "Cannot set kraft.version to {l} unless controller.quorum.voters is empty and one of the flags --standalone, --initial-controllers, or --no-initial-controllers is used. For dynamic controllers support, try using one of --standalone, --initial-controllers, or --no-initial-controllers and removing controller.quorum.voters."
                ))),
                Some(l) => *l,
                None => i16::from(has_dynamic_quorum),
            };
            levels.insert(KRAFT_VERSION.to_string(), level);
        } else if !levels.contains_key(f.name) {
            levels.insert(f.name.to_string(), f.default_level(release_version));
        }
    }
    for f in FEATURES {
        let level = levels.get(f.name).copied().unwrap_or(0);
        if level < 0 || level > f.max_level {
            return Err(invalid(format!(
                "No feature:{} with feature level {level}",
                f.name
            )));
        }
        for (dep_level, mv_level) in f.mv_dependencies {
            if level >= *dep_level && release_version.feature_level() < *mv_level {
                return Err(invalid(format!(
                    "{} could not be set to {level} because it depends on metadata.version level {mv_level}",
                    f.name
                )));
            }
        }
    }

    // BootstrapMetadata.fromVersions: metadata.version first, then the others at a level
    // above 0, by name; kraft.version is the quorum's, carried by control records instead.
    let record = |name: &str, level: i16| {
        ApiMessageAndVersion::new(
            FeatureLevelRecord {
                name: name.to_string(),
                feature_level: level,
                ..FeatureLevelRecord::default()
            },
            0,
        )
    };
    let mut bootstrap_records = vec![record(
        MetadataVersion::FEATURE_NAME,
        release_version.feature_level(),
    )];
    for (name, level) in &levels {
        if name != MetadataVersion::FEATURE_NAME && name != KRAFT_VERSION && *level > 0 {
            bootstrap_records.push(record(name, *level));
        }
    }
    if !scram_records.is_empty() {
        // Formatter: "SCRAM is only supported in metadata.version 3.5-IV2 or later."
        if release_version.feature_level() < 11 {
            return Err(invalid(
                "SCRAM is only supported in metadata.version 3.5-IV2 or later.",
            ));
        }
        bootstrap_records.extend(
            scram_records
                .into_iter()
                .map(|r| ApiMessageAndVersion::new(r, 0)),
        );
    }
    Ok(FormatPlan {
        release_version,
        feature_levels: levels,
        voters,
        bootstrap_records,
    })
}

/// One `--add-scram` argument, as Kafka's `ScramParser`:
/// `SCRAM-SHA-256=[name=alice,password=alice-secret]`, with optional `salt` (base64),
/// `iterations` (default 4096, within 4096..=16384) and `saltedpassword` (base64, with `salt`)
/// instead of `password`; values may be quoted.
fn parse_add_scram(
    input: &str,
) -> Result<gregor_protocol::metadata_records::UserScramCredentialRecord, StorageError> {
    use base64::Engine;
    use gregor_network::sasl::{ScramCredential, ScramMechanism};
    let b64 = base64::engine::general_purpose::STANDARD;
    let input = input.trim();
    let (mechanism, config) = input.split_once('=').ok_or_else(|| {
        invalid(format!(
            "Failed to find equals sign in SCRAM argument '{input}'"
        ))
    })?;
    let mechanism = ScramMechanism::from_mechanism_name(mechanism).ok_or_else(|| {
        invalid(format!(
            "The add-scram mechanism {mechanism} is not supported."
        ))
    })?;
    let config = config
        .strip_prefix('[')
        .ok_or_else(|| invalid("Expected configuration string to start with ["))?
        .strip_suffix(']')
        .ok_or_else(|| invalid("Expected configuration string to end with ]"))?;
    let mut components = BTreeMap::new();
    for c in config.split(',') {
        let (k, v) = c
            .split_once('=')
            .ok_or_else(|| invalid(format!("No equals sign found in SCRAM component: {c}")))?;
        let v = if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') {
            &v[1..v.len() - 1]
        } else {
            v
        };
        components.insert(k.to_string(), v.to_string());
    }
    let name = components
        .remove("name")
        .ok_or_else(|| invalid("You must supply 'name' to add-scram"))?;
    let salt = components
        .remove("salt")
        .map(|s| {
            b64.decode(&s)
                .map_err(|_| invalid(format!("Failed to decode given salt: {s}")))
        })
        .transpose()?;
    let iterations = match components.remove("iterations") {
        Some(i) => i
            .parse::<i32>()
            .map_err(|_| invalid(format!("Failed to parse iterations count: {i}")))?,
        None => 4096,
    };
    let password = components.remove("password");
    let salted = components.remove("saltedpassword");
    if !components.is_empty() {
        let keys: Vec<&str> = components.keys().map(String::as_str).collect();
        return Err(invalid(format!(
            "Unknown SCRAM configurations: {}",
            keys.join(", ")
        )));
    }
    if iterations < ScramMechanism::MIN_ITERATIONS {
        return Err(invalid(format!(
            "The 'iterations' value must be >= {} for add-scram",
            ScramMechanism::MIN_ITERATIONS
        )));
    }
    if iterations > ScramMechanism::MAX_ITERATIONS {
        return Err(invalid(format!(
            "The 'iterations' value must be <= {} for add-scram",
            ScramMechanism::MAX_ITERATIONS
        )));
    }
    let credential = match (password, salted) {
        (Some(p), _) => {
            let salt = salt.unwrap_or_else(ScramCredential::random_salt);
            ScramCredential::from_password(mechanism, p.as_bytes(), &salt, iterations)
        }
        (None, Some(sp)) => {
            let salt = salt.ok_or_else(|| {
                invalid("You must supply 'salt' with 'saltedpassword' to add-scram")
            })?;
            let sp = b64
                .decode(&sp)
                .map_err(|_| invalid(format!("Failed to decode given saltedPassword: {sp}")))?;
            ScramCredential::from_salted_password(mechanism, &sp, &salt, iterations)
        }
        (None, None) => {
            return Err(invalid(
                "You must supply one of 'password' or 'saltedpassword' to add-scram",
            ))
        }
    };
    Ok(
        gregor_protocol::metadata_records::UserScramCredentialRecord {
            name,
            mechanism: mechanism.type_code(),
            salt: credential.salt,
            stored_key: credential.stored_key,
            server_key: credential.server_key,
            iterations,
            ..Default::default()
        },
    )
}

/// The host as Kafka's voter set records it: Kafka goes through `InetSocketAddress`, whose
/// host string for an IP literal is Java's `getHostAddress` (IPv6 uncompressed,
/// `0:0:0:0:0:0:0:1`; IPv4-mapped IPv6 as IPv4); names are kept as given.
fn java_host_string(host: &str) -> String {
    match host.parse::<std::net::Ipv6Addr>() {
        Ok(ip) => match ip.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => ip
                .segments()
                .iter()
                .map(|s| format!("{s:x}"))
                .collect::<Vec<_>>()
                .join(":"),
        },
        Err(_) => host.to_string(),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The bytes of the bootstrap snapshot: a control batch (SnapshotHeader, and KRaftVersion
/// plus KRaftVoters when `kraft.version` is 1 and voters are given), one data batch of the
/// feature records, and a control batch with the SnapshotFooter; offsets contiguous from 0,
/// epoch 0, as Kafka's `RecordsSnapshotWriter` lays them out.
///
/// # Errors
/// [`StorageError::Invalid`] when a record cannot be encoded.
pub fn bootstrap_snapshot_bytes(
    plan: &FormatPlan,
    controller_listener_name: &str,
) -> Result<Vec<u8>, StorageError> {
    let now = now_ms();
    let kraft_version = plan.feature_levels.get(KRAFT_VERSION).copied().unwrap_or(0);
    let mut header = vec![ControlRecord::SnapshotHeader(
        SnapshotHeaderRecord::default()
            .with_version(0)
            .with_last_contained_log_timestamp(now),
    )];
    if kraft_version > 0 {
        header.push(ControlRecord::KRaftVersion(
            KRaftVersionRecord::default()
                .with_version(0)
                .with_k_raft_version(kraft_version),
        ));
        if let Some(voters) = &plan.voters {
            let voters = voters
                .iter()
                .map(|v| {
                    Voter::default()
                        .with_voter_id(v.node_id.into())
                        .with_voter_directory_id(v.directory_id)
                        .with_endpoints(vec![Endpoint::default()
                            .with_name(StrBytes::from_string(controller_listener_name.to_string()))
                            .with_host(StrBytes::from_string(java_host_string(&v.host)))
                            .with_port(v.port)])
                        .with_k_raft_version_feature(
                            KRaftVersionFeature::default()
                                .with_min_supported_version(0)
                                .with_max_supported_version(1),
                        )
                })
                .collect();
            header.push(ControlRecord::KRaftVoters(
                VotersRecord::default().with_version(0).with_voters(voters),
            ));
        }
    }
    let encode = |e: gregor_protocol::metadata_records::log::MetadataLogError| {
        invalid(format!("encoding the bootstrap snapshot: {e}"))
    };
    let mut out = build_control_batch(0, 0, now, &header).map_err(encode)?;
    let mut offset = header.len() as i64;
    out.extend(build_metadata_batch(offset, 0, now, &plan.bootstrap_records).map_err(encode)?);
    offset += plan.bootstrap_records.len() as i64;
    out.extend(
        build_control_batch(
            offset,
            0,
            now,
            &[ControlRecord::SnapshotFooter(
                SnapshotFooterRecord::default().with_version(0),
            )],
        )
        .map_err(encode)?,
    );
    Ok(out)
}

/// Writes the bootstrap snapshot into `<metadata_log_dir>/__cluster_metadata-0/` (a `.part`
/// file renamed into place, then made read-only as Kafka leaves a frozen snapshot).
///
/// # Errors
/// The I/O error naming the file.
pub fn write_bootstrap_snapshot(metadata_log_dir: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let dir = metadata_log_dir.join(CLUSTER_METADATA_DIR);
    std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
    let path = dir.join(BOOTSTRAP_SNAPSHOT);
    let part = dir.join(format!("{BOOTSTRAP_SNAPSHOT}.part"));
    write_synced(&part, bytes)?;
    std::fs::rename(&part, &path).map_err(io("renaming", &part))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400))
            .map_err(io("making read-only", &path))?;
    }
    sync_dir(&dir)
}

/// The metadata records of the bootstrap snapshot in `<metadata_log_dir>/__cluster_metadata-0/`
/// (the feature levels `storage format` chose), which the first active controller of a new
/// cluster commits before anything else (Kafka's `BootstrapDirectory.read` and the controller's
/// activation records). Without the file, only `metadata.version` at the latest production
/// level, as Kafka's `BootstrapMetadata.fromVersion(latestProduction)`.
///
/// # Errors
/// [`StorageError::Io`] when the file cannot be read; [`StorageError::Invalid`] when a batch of
/// it does not decode (named with the file).
pub fn read_bootstrap_records(
    metadata_log_dir: &Path,
) -> Result<Vec<gregor_protocol::metadata_records::MetadataRecord>, StorageError> {
    use gregor_protocol::metadata_records::log::{BatchRecords, MetadataLogBatches};
    let path = metadata_log_dir
        .join(CLUSTER_METADATA_DIR)
        .join(BOOTSTRAP_SNAPSHOT);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(vec![FeatureLevelRecord {
                name: MetadataVersion::FEATURE_NAME.to_string(),
                feature_level: LATEST_PRODUCTION_LEVEL,
                ..FeatureLevelRecord::default()
            }
            .into()])
        }
        Err(e) => return Err(io("reading", &path)(e)),
    };
    let mut records = Vec::new();
    for batch in MetadataLogBatches::new(&bytes) {
        let batch = batch.map_err(|e| invalid(format!("{}: {e}", path.display())))?;
        if let BatchRecords::Metadata(rs) = batch.records {
            records.extend(rs.into_iter().map(|r| r.record));
        }
    }
    Ok(records)
}

/// The voter set of a dynamic quorum (KIP-853) as the newest `.checkpoint` of
/// `<metadata_log_dir>/__cluster_metadata-0/` that holds a `KRaftVoters` control record gives
/// it (the bootstrap snapshot of `storage format --standalone` or `--initial-controllers`):
/// each voter's id and its endpoint on `listener` (or its first endpoint). `None` when no
/// snapshot names voters.
///
/// # Errors
/// [`StorageError::Io`] when the directory or a snapshot cannot be read;
/// [`StorageError::Invalid`] when a snapshot does not decode or a voter has no endpoint.
pub fn read_snapshot_voters(
    metadata_log_dir: &Path,
    listener: &str,
) -> Result<Option<gregor_raft::types::VoterEndpoints>, StorageError> {
    use gregor_protocol::metadata_records::log::{BatchRecords, MetadataLogBatches};
    let dir = metadata_log_dir.join(CLUSTER_METADATA_DIR);
    let mut snapshots: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "checkpoint"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("listing", &dir)(e)),
    };
    // `<20-digit offset>-<10-digit epoch>.checkpoint`: the name orders them; newest first.
    snapshots.sort();
    for path in snapshots.iter().rev() {
        let bytes = std::fs::read(path).map_err(io("reading", path))?;
        let mut voters = None;
        for batch in MetadataLogBatches::new(&bytes) {
            let batch = batch.map_err(|e| invalid(format!("{}: {e}", path.display())))?;
            if let BatchRecords::Control(records) = batch.records {
                for r in records {
                    if let ControlRecord::KRaftVoters(v) = r {
                        voters = Some(v);
                    }
                }
            }
        }
        let Some(v) = voters else { continue };
        let mut out = BTreeMap::new();
        for voter in &v.voters {
            let endpoint = voter
                .endpoints
                .iter()
                .find(|e| e.name.as_str().eq_ignore_ascii_case(listener))
                .or_else(|| voter.endpoints.first())
                .ok_or_else(|| {
                    invalid(format!(
                        "{}: voter {} has no endpoint",
                        path.display(),
                        voter.voter_id.0
                    ))
                })?;
            out.insert(
                voter.voter_id.0,
                (endpoint.host.as_str().to_string(), endpoint.port),
            );
        }
        return Ok(Some(out));
    }
    Ok(None)
}

/// Checks the `meta.properties` of `dirs` against each other and against `cluster_id` and
/// `node_id` (Kafka's `MetaPropertiesEnsemble.verify`); returns the formatted dirs.
///
/// # Errors
/// [`StorageError::Invalid`] naming the dir whose cluster id or node id differs.
pub fn verify_ensemble(
    dirs: &BTreeSet<PathBuf>,
    cluster_id: Option<&str>,
    node_id: i32,
) -> Result<BTreeMap<PathBuf, MetaProperties>, StorageError> {
    let (found, mut failed) = load_ensemble(dirs, cluster_id, node_id)?;
    match failed.pop_first() {
        Some((_, e)) => Err(e),
        None => Ok(found),
    }
}

/// As [`verify_ensemble`], except that a dir whose `meta.properties` cannot be read for an
/// I/O error (the dir is a file, EIO, ...) is returned apart, with the error, instead of
/// failing the whole check (Kafka's `MetaPropertiesEnsemble.Loader` `errorLogDirs`): the
/// broker starts with such a dir offline (KIP-112).
///
/// # Errors
/// As [`verify_ensemble`], for the dirs that could be read.
#[allow(clippy::type_complexity)]
pub fn load_ensemble(
    dirs: &BTreeSet<PathBuf>,
    cluster_id: Option<&str>,
    node_id: i32,
) -> Result<
    (
        BTreeMap<PathBuf, MetaProperties>,
        BTreeMap<PathBuf, StorageError>,
    ),
    StorageError,
> {
    let mut found = BTreeMap::new();
    let mut failed = BTreeMap::new();
    let mut expected_cluster = cluster_id.map(str::to_string);
    let mut seen_dir_ids: BTreeMap<Uuid, PathBuf> = BTreeMap::new();
    for dir in dirs {
        let props = match read_meta_properties(dir) {
            Ok(Some(props)) => props,
            Ok(None) => continue,
            Err(e @ StorageError::Io { .. }) => {
                failed.insert(dir.clone(), e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let path = dir.join(META_PROPERTIES);
        match &expected_cluster {
            Some(c) if *c != props.cluster_id => {
                return Err(invalid(format!(
                    "Invalid cluster.id in: {}. Expected {c}, but read {}",
                    path.display(),
                    props.cluster_id
                )))
            }
            Some(_) => {}
            None => expected_cluster = Some(props.cluster_id.clone()),
        }
        if props.node_id != node_id {
            return Err(invalid(format!(
                "Stored node id {} doesn't match previous node id {node_id} in {}. If you moved your data, make sure your configured node id matches. If you intend to create a new node, you should remove all data in your data directories.",
                props.node_id,
                path.display()
            )));
        }
        if let Some(d) = props.directory_id {
            if let Some(other) = seen_dir_ids.insert(d, dir.clone()) {
                return Err(invalid(format!(
                    "Duplicate directory ID {} found. It was the ID of {}, and also the ID of {}",
                    kafka_uuid_string(d),
                    other.display(),
                    dir.display()
                )));
            }
        }
        found.insert(dir.clone(), props);
    }
    Ok((found, failed))
}

fn new_directory_id(taken: &BTreeSet<Uuid>) -> Uuid {
    loop {
        let id = random_uuid();
        if !taken.contains(&id) {
            return id;
        }
    }
}

/// `kafka-storage format`: checks, then writes `meta.properties` in every unformatted dir and
/// the bootstrap snapshot in the metadata log dir of a controller.
///
/// # Errors
/// [`StorageError`] with Kafka's message (already formatted, cluster id mismatch, ...).
pub fn format(cfg: &StorageConfig, opts: &FormatOptions) -> Result<FormatReport, StorageError> {
    let plan = plan_format(cfg, opts)?;
    let dirs = cfg.directories();
    let formatted = verify_ensemble(&dirs, Some(&opts.cluster_id), cfg.node_id)?;
    if !opts.ignore_formatted {
        if let Some(first) = formatted.keys().next() {
            return Err(invalid(format!(
                "Log directory {} is already formatted. Use --ignore-formatted to ignore this directory and format the others.",
                first.display()
            )));
        }
    }
    let mut report = FormatReport {
        lines: Vec::new(),
        bootstrap_records: plan.bootstrap_records.clone(),
    };
    let empty: Vec<&PathBuf> = dirs
        .iter()
        .filter(|d| !formatted.contains_key(*d))
        .collect();
    if empty.is_empty() {
        report
            .lines
            .push("All of the log directories are already formatted.".into());
        return Ok(report);
    }
    let mut taken: BTreeSet<Uuid> = formatted.values().filter_map(|p| p.directory_id).collect();
    let listener = cfg
        .controller_listener_names
        .first()
        .cloned()
        .unwrap_or_default();
    let snapshot = if cfg.controller {
        Some(bootstrap_snapshot_bytes(&plan, &listener)?)
    } else {
        None
    };
    for dir in empty {
        let is_metadata = *dir == cfg.metadata_log_dir;
        let voter = plan
            .voters
            .as_ref()
            .and_then(|v| v.iter().find(|v| v.node_id == cfg.node_id));
        let (kind, directory_id) = match (is_metadata, &plan.voters, voter) {
            (false, _, _) => ("data directory", None),
            (true, None, _) => ("metadata directory", None),
            (true, Some(_), Some(v)) => ("dynamic metadata voter directory", Some(v.directory_id)),
            (true, Some(_), None) => ("dynamic metadata directory", None),
        };
        let directory_id = directory_id.unwrap_or_else(|| new_directory_id(&taken));
        taken.insert(directory_id);
        report.lines.push(format!(
            "Formatting {kind} {} with metadata.version {}.",
            dir.display(),
            plan.release_version
        ));
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
        if is_metadata {
            if let Some(bytes) = &snapshot {
                write_bootstrap_snapshot(dir, bytes)?;
            }
        }
        write_meta_properties(
            dir,
            &MetaProperties {
                cluster_id: opts.cluster_id.clone(),
                node_id: cfg.node_id,
                directory_id: Some(directory_id),
            },
        )?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    fn combined(extra: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut p = props(&[
            ("node.id", "1"),
            ("process.roles", "broker,controller"),
            (
                "listeners",
                "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
            ),
            ("controller.listener.names", "CONTROLLER"),
            ("log.dirs", "/tmp/a"),
        ]);
        p.extend(props(extra));
        p
    }

    fn static_cfg() -> StorageConfig {
        StorageConfig::from_properties(&combined(&[(
            "controller.quorum.voters",
            "1@127.0.0.1:9093",
        )]))
        .unwrap()
    }

    fn dynamic_cfg() -> StorageConfig {
        StorageConfig::from_properties(&combined(&[(
            "controller.quorum.bootstrap.servers",
            "127.0.0.1:9093",
        )]))
        .unwrap()
    }

    fn err(r: Result<impl fmt::Debug, StorageError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn uuids_round_trip_and_avoid_reserved_ones() {
        for _ in 0..1000 {
            let id = random_uuid();
            let s = kafka_uuid_string(id);
            assert_eq!(s.len(), 22);
            assert!(!s.starts_with('-'));
            assert_eq!(parse_kafka_uuid(&s), Some(id));
        }
        assert_eq!(kafka_uuid_string(Uuid::nil()), "AAAAAAAAAAAAAAAAAAAAAA");
        assert_eq!(
            parse_kafka_uuid("AAAAAAAAAAAAAAAAAAAAAQ"),
            Some(Uuid::from_u128(1))
        );
        assert_eq!(parse_kafka_uuid("AAAAAAAAAAAAAAAAAAAAAB"), None);
        assert_eq!(parse_kafka_uuid("short"), None);
        assert!(is_reserved(Uuid::nil()) && is_reserved(Uuid::from_u128(1)));
    }

    #[test]
    fn meta_properties_round_trip_and_reject_v0() {
        let m = MetaProperties {
            cluster_id: "abc".into(),
            node_id: 3,
            directory_id: Some(Uuid::from_u128(12345)),
        };
        assert_eq!(MetaProperties::parse(&m.to_file_text()).unwrap(), m);
        let kafka = "#\n#Tue Dec 01 19:47:53 UTC 2026\nnode.id=1\ndirectory.id=mVKo6Ev0fam4VFtwaJiKsQ\nversion=1\ncluster.id=AAAAAAAAAAAAAAAAAAAAAA\n";
        let k = MetaProperties::parse(kafka).unwrap();
        assert_eq!(
            (k.node_id, k.cluster_id.as_str()),
            (1, "AAAAAAAAAAAAAAAAAAAAAA")
        );
        assert!(err(MetaProperties::parse(
            "version=0\nbroker.id=1\ncluster.id=x\n"
        ))
        .contains("version 0"));
        assert!(err(MetaProperties::parse("version=1\nnode.id=1\n")).contains("cluster.id"));
    }

    #[test]
    fn release_versions_parse_as_kafka_does() {
        let v = |s| MetadataVersion::from_version_string(s, false).map(|m| m.feature_level());
        assert_eq!(v("4.4-IV2").unwrap(), 33);
        assert_eq!(v("4.4").unwrap(), 33);
        assert_eq!(v("4.4.0").unwrap(), 33);
        assert_eq!(v("3.3").unwrap(), 7);
        assert_eq!(v("3.9").unwrap(), 21);
        assert_eq!(v("4.0-IV1").unwrap(), 23);
        let e = err(v("3.0"));
        assert!(
            e.starts_with(
                "Unknown metadata.version '3.0'. Supported metadata.version are: 3.3-IV3, 3.4-IV0,"
            ),
            "{e}"
        );
        assert!(e.ends_with("4.4-IV2"), "{e}");
        assert!(v("4.5-IV0").is_err());
        assert_eq!(
            MetadataVersion::from_version_string("4.5-IV0", true)
                .unwrap()
                .feature_level(),
            34
        );
    }

    #[test]
    fn feature_defaults_follow_the_release_version() {
        let levels = |r: &str| {
            let opts = FormatOptions {
                release_version: Some(r.into()),
                initial_controllers: InitialControllers::Standalone,
                ..FormatOptions::default()
            };
            plan_format(&dynamic_cfg(), &opts).unwrap().feature_levels
        };
        let l = levels("4.4-IV2");
        assert_eq!(l["transaction.version"], 2);
        assert_eq!(l["share.version"], 2);
        assert_eq!(l["kraft.version"], 1);
        let l = levels("4.2-IV0");
        assert_eq!((l["share.version"], l["streams.version"]), (1, 0));
        let l = levels("3.9");
        assert_eq!(
            (l["group.version"], l["eligible.leader.replicas.version"]),
            (0, 0)
        );
    }

    #[test]
    fn the_bootstrap_records_are_kafkas() {
        let plan = plan_format(&static_cfg(), &FormatOptions::default()).unwrap();
        let names: Vec<(String, i16)> = plan
            .bootstrap_records
            .iter()
            .map(|r| match &r.record {
                gregor_protocol::metadata_records::MetadataRecord::FeatureLevel(f) => {
                    (f.name.clone(), f.feature_level)
                }
                other => panic!("{other:?}"),
            })
            .collect();
        let expected: Vec<(String, i16)> = [
            ("metadata.version", 33),
            ("eligible.leader.replicas.version", 1),
            ("group.version", 1),
            ("share.version", 2),
            ("streams.version", 1),
            ("transaction.version", 2),
        ]
        .iter()
        .map(|(n, l)| ((*n).to_string(), *l))
        .collect();
        assert_eq!(names, expected);
        assert_eq!(plan.feature_levels["kraft.version"], 0);
    }

    #[test]
    fn kafkas_format_rules() {
        let s = static_cfg();
        let d = dynamic_cfg();
        let with = |ic| FormatOptions {
            initial_controllers: ic,
            ..FormatOptions::default()
        };
        assert!(err(plan_format(&s, &with(InitialControllers::Standalone)))
            .starts_with("You cannot specify controller.quorum.voters"));
        assert!(err(plan_format(&d, &with(InitialControllers::Unspecified)))
            .starts_with("Because controller.quorum.voters is not set on this controller"));
        assert!(plan_format(&d, &with(InitialControllers::None)).is_ok());
        let feature = |f: &str, ic| FormatOptions {
            features: vec![parse_feature_arg(f).unwrap()],
            initial_controllers: ic,
            ..FormatOptions::default()
        };
        assert!(err(plan_format(
            &d,
            &feature("kraft.version=0", InitialControllers::Standalone)
        ))
        .starts_with("Cannot set kraft.version to 0 if controller.quorum.voters is empty"));
        assert!(err(plan_format(
            &s,
            &feature("kraft.version=1", InitialControllers::Unspecified)
        ))
        .starts_with("Cannot set kraft.version to 1 unless"));
        assert_eq!(
            err(plan_format(&s, &feature("foo.version=1", InitialControllers::Unspecified))),
            "Unsupported feature: foo.version. Supported features are: eligible.leader.replicas.version, group.version, kraft.version, share.version, streams.version, transaction.version"
        );
        assert_eq!(
            err(plan_format(
                &s,
                &feature("transaction.version=3", InitialControllers::Unspecified)
            )),
            "No feature:transaction.version with feature level 3"
        );
        let mut o = feature(
            "eligible.leader.replicas.version=1",
            InitialControllers::Unspecified,
        );
        o.release_version = Some("3.9".into());
        assert_eq!(
            err(plan_format(&s, &o)),
            "eligible.leader.replicas.version could not be set to 1 because it depends on metadata.version level 23"
        );
        let mut o = feature("metadata.version=20", InitialControllers::Unspecified);
        assert_eq!(
            plan_format(&s, &o).unwrap().release_version.version(),
            "3.8-IV0"
        );
        o.release_version = Some("3.9".into());
        assert_eq!(
            err(plan_format(&s, &o)),
            "Use --release-version instead of --feature metadata.version=X to avoid ambiguity."
        );
        // KIP-900: --add-scram puts a UserScramCredentialRecord in the bootstrap records.
        let o = FormatOptions {
            add_scram: vec!["SCRAM-SHA-256=[name=alice,password=x]".into()],
            ..FormatOptions::default()
        };
        let plan = plan_format(&s, &o).unwrap();
        let scram: Vec<_> = plan
            .bootstrap_records
            .iter()
            .filter_map(|r| match &r.record {
                gregor_protocol::metadata_records::MetadataRecord::UserScramCredential(c) => {
                    Some(c)
                }
                _ => None,
            })
            .collect();
        assert_eq!(scram.len(), 1);
        assert_eq!(
            (
                scram[0].name.as_str(),
                scram[0].mechanism,
                scram[0].iterations
            ),
            ("alice", 1, 4096)
        );
        let expected = gregor_network::sasl::ScramCredential::from_password(
            gregor_network::sasl::ScramMechanism::Sha256,
            b"x",
            &scram[0].salt,
            4096,
        );
        assert_eq!(scram[0].stored_key, expected.stored_key);
        for (arg, message) in [
            (
                "SCRAM-SHA-1=[name=a,password=x]",
                "The add-scram mechanism SCRAM-SHA-1 is not supported.",
            ),
            (
                "SCRAM-SHA-512=name=a,password=x]",
                "Expected configuration string to start with [",
            ),
            (
                "SCRAM-SHA-512=[password=x]",
                "You must supply 'name' to add-scram",
            ),
            (
                "SCRAM-SHA-512=[name=a]",
                "You must supply one of 'password' or 'saltedpassword' to add-scram",
            ),
            (
                "SCRAM-SHA-512=[name=a,password=x,iterations=100]",
                "The 'iterations' value must be >= 4096 for add-scram",
            ),
            (
                "SCRAM-SHA-512=[name=a,password=x,iterations=20000]",
                "The 'iterations' value must be <= 16384 for add-scram",
            ),
            (
                "SCRAM-SHA-512=[name=a,password=x,bogus=1]",
                "Unknown SCRAM configurations: bogus",
            ),
            (
                "SCRAM-SHA-512=[name=a,saltedpassword=AAAA]",
                "You must supply 'salt' with 'saltedpassword' to add-scram",
            ),
        ] {
            let o = FormatOptions {
                add_scram: vec![arg.into()],
                ..FormatOptions::default()
            };
            assert_eq!(err(plan_format(&s, &o)), message, "{arg}");
        }
        assert!(err(parse_feature_arg("transaction.version")).contains("equals sign not found"));
        assert!(err(parse_feature_arg("transaction.version=x"))
            .contains("unable to parse x as a short"));
    }

    #[test]
    fn configuration_rules() {
        let e = |p: BTreeMap<String, String>| err(StorageConfig::from_properties(&p));
        let mut p = combined(&[("controller.quorum.voters", "1@h:1")]);
        p.remove("node.id");
        assert_eq!(
            e(p),
            "Missing required configuration \"node.id\" which has no default value."
        );
        let mut p = combined(&[("controller.quorum.voters", "1@h:1")]);
        p.insert("process.roles".into(), String::new());
        assert!(e(p).starts_with("Configuration 'process.roles' must not be empty."));
        let p = combined(&[("controller.quorum.voters", "2@h:1")]);
        assert_eq!(
            e(p),
            "If process.roles contains the 'controller' role, the node id 1 must be included in the set of voters controller.quorum.voters=Set(2)"
        );
        let mut p = combined(&[("controller.quorum.voters", "1@h:1")]);
        p.insert("process.roles".into(), "broker".into());
        assert!(e(p).contains("must not be included in the set of voters"));
        assert!(e(combined(&[])).starts_with("If using process.roles, either"));
        let c = StorageConfig::from_properties(&combined(&[
            ("controller.quorum.voters", "1@h:1"),
            ("log.dirs", "/tmp/b,/tmp/a"),
            ("metadata.log.dir", "/tmp/m"),
        ]))
        .unwrap();
        assert_eq!(c.metadata_log_dir, PathBuf::from("/tmp/m"));
        assert_eq!(
            c.directories().into_iter().collect::<Vec<_>>(),
            ["/tmp/a", "/tmp/b", "/tmp/m"].map(PathBuf::from)
        );
    }

    #[test]
    fn ip_literals_are_written_as_java_prints_them() {
        assert_eq!(java_host_string("::1"), "0:0:0:0:0:0:0:1");
        assert_eq!(java_host_string("fe80::0abc:1"), "fe80:0:0:0:0:0:abc:1");
        assert_eq!(java_host_string("::ffff:10.0.0.1"), "10.0.0.1");
        assert_eq!(java_host_string("127.0.0.1"), "127.0.0.1");
        assert_eq!(java_host_string("c1.example.com"), "c1.example.com");
    }

    #[test]
    fn dynamic_voters_parse() {
        let v = parse_dynamic_voters(
            "2@[::1]:9094:AAAAAAAAAAAAAAAAAAAAAg,1@example.com:9093:AAAAAAAAAAAAAAAAAAAAAQ",
        )
        .unwrap();
        assert_eq!(v[0].node_id, 1);
        assert_eq!((v[1].host.as_str(), v[1].port), ("::1", 9094));
        assert_eq!(v[0].directory_id, Uuid::from_u128(1));
        assert_eq!(
            err(parse_dynamic_voters("1example")),
            "No @ found in dynamic voter string."
        );
        assert_eq!(
            err(parse_dynamic_voters(
                "1@h:1:AAAAAAAAAAAAAAAAAAAAAQ,1@h:2:AAAAAAAAAAAAAAAAAAAAAg"
            )),
            "Node id 1 was specified more than once."
        );
        assert_eq!(
            err(parse_dynamic_voters("1@h:x:AAAAAAAAAAAAAAAAAAAAAQ")),
            "Failed to parse port in dynamic voter string."
        );
        assert_eq!(
            err(parse_dynamic_voters("1@h:1:nope")),
            "Failed to parse directory ID in dynamic voter string."
        );
    }

    #[test]
    fn format_writes_and_then_refuses_or_skips() {
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a");
        let b = tmp.path().join("b");
        let mut cfg = static_cfg();
        cfg.log_dirs = vec![a.clone(), b.clone()];
        cfg.metadata_log_dir = a.clone();
        let opts = FormatOptions {
            cluster_id: "AAAAAAAAAAAAAAAAAAAAAA".into(),
            ..FormatOptions::default()
        };
        let r = format(&cfg, &opts).unwrap();
        assert_eq!(r.lines.len(), 2);
        assert!(a
            .join(CLUSTER_METADATA_DIR)
            .join(BOOTSTRAP_SNAPSHOT)
            .exists());
        assert!(!b.join(CLUSTER_METADATA_DIR).exists());
        let ma = read_meta_properties(&a).unwrap().unwrap();
        let mb = read_meta_properties(&b).unwrap().unwrap();
        assert_ne!(ma.directory_id, mb.directory_id);
        assert!(err(format(&cfg, &opts)).contains("is already formatted"));
        let mut o = opts.clone();
        o.ignore_formatted = true;
        assert_eq!(
            format(&cfg, &o).unwrap().lines,
            ["All of the log directories are already formatted."]
        );
        o.cluster_id = "BBBBBBBBBBBBBBBBBBBBBB".into();
        assert!(err(format(&cfg, &o)).starts_with("Invalid cluster.id in:"));
        let mut other = cfg.clone();
        other.node_id = 2;
        let mut o = opts.clone();
        o.ignore_formatted = true;
        assert!(err(format(&other, &o)).starts_with("Stored node id 1 doesn't match"));
    }
}
