//! Config round trips: rdkafka's AdminClient (AlterConfigs, DescribeConfigs) and raw
//! IncrementalAlterConfigs (SET, DELETE, APPEND, SUBTRACT), topic and dynamic broker configs,
//! sources, validation, persistence across kill -9, and `compression.type` applied on append.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use gregor_protocol::batch::{BatchHeader, Compression};
use gregor_tests::wire::KafkaConn;
use gregor_tests::{clients, Gregor};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ConfigSource, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const TIMEOUT: Duration = Duration::from_secs(30);
const TOPIC: i8 = 2;
const BROKER: i8 = 4;

fn runtime() -> tokio::runtime::Runtime {
    clients::runtime().expect("tokio runtime")
}

fn admin(bootstrap: &str) -> Result<AdminClient<DefaultClientContext>> {
    clients::admin(bootstrap)
}

fn create_topic(bootstrap: &str, name: &str) -> Result<()> {
    clients::create_topic(bootstrap, name, 1)
}

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

struct Conn(KafkaConn);

impl Conn {
    fn new(g: &Gregor) -> Result<Self> {
        Ok(Self(KafkaConn::connect(g.bootstrap(), "configs-test")?))
    }

    fn call(&mut self, key: ApiKey, version: i16, req: RequestKind) -> Result<ResponseKind> {
        self.0.call_kind(key, version, &req)
    }

    /// IncrementalAlterConfigs of one resource; returns (error code, message).
    fn incremental(
        &mut self,
        version: i16,
        resource_type: i8,
        name: &str,
        ops: &[(&str, i8, Option<&str>)],
        validate_only: bool,
    ) -> Result<(i16, Option<String>)> {
        use kafka_protocol::messages::incremental_alter_configs_request::{
            AlterConfigsResource, AlterableConfig,
        };
        let req = IncrementalAlterConfigsRequest::default()
            .with_validate_only(validate_only)
            .with_resources(vec![AlterConfigsResource::default()
                .with_resource_type(resource_type)
                .with_resource_name(sb(name))
                .with_configs(
                    ops.iter()
                        .map(|(k, op, v)| {
                            AlterableConfig::default()
                                .with_name(sb(k))
                                .with_config_operation(*op)
                                .with_value(v.map(sb))
                        })
                        .collect(),
                )]);
        let ResponseKind::IncrementalAlterConfigs(r) =
            self.call(ApiKey::IncrementalAlterConfigs, version, req.into())?
        else {
            bail!("wrong response kind");
        };
        let r = &r.responses[0];
        Ok((
            r.error_code,
            r.error_message.as_ref().map(ToString::to_string),
        ))
    }

    /// DescribeConfigs of one key: (value, source).
    fn describe(
        &mut self,
        resource_type: i8,
        name: &str,
        key: &str,
    ) -> Result<(Option<String>, i8)> {
        let req = DescribeConfigsRequest::default()
            .with_include_synonyms(true)
            .with_resources(vec![DescribeConfigsResource::default()
                .with_resource_type(resource_type)
                .with_resource_name(sb(name))
                .with_configuration_keys(Some(vec![sb(key)]))]);
        let ResponseKind::DescribeConfigs(r) = self.call(ApiKey::DescribeConfigs, 4, req.into())?
        else {
            bail!("wrong response kind");
        };
        let res = &r.results[0];
        ensure!(res.error_code == 0, "describe {name}: {}", res.error_code);
        let Some(c) = res.configs.iter().find(|c| &*c.name == key) else {
            return Ok((None, -1));
        };
        Ok((c.value.as_ref().map(ToString::to_string), c.config_source))
    }
}

#[test]
fn admin_client_round_trips_topic_and_broker_configs() -> Result<()> {
    let mut g = Gregor::start(BIN, &[])?;
    let b = g.bootstrap();
    create_topic(&b, "cfg")?;
    let a = admin(&b)?;
    let rt = runtime();
    let set = AlterConfig::new(ResourceSpecifier::Topic("cfg"))
        .set("retention.ms", "12345")
        .set("cleanup.policy", "compact,delete");
    let res = rt.block_on(a.alter_configs(&[set], &AdminOptions::new()))?;
    ensure!(res.iter().all(Result::is_ok), "{res:?}");
    let described =
        rt.block_on(a.describe_configs(&[ResourceSpecifier::Topic("cfg")], &AdminOptions::new()))?;
    let r = described[0]
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let e = r.get("retention.ms").context("retention.ms")?;
    ensure!(e.value.as_deref() == Some("12345"));
    ensure!(
        matches!(e.source, ConfigSource::DynamicTopic),
        "{:?}",
        e.source
    );
    ensure!(r
        .get("segment.bytes")
        .is_some_and(|e| matches!(e.source, ConfigSource::Default)));
    // A bad value is refused (INVALID_CONFIG; rdkafka's binding drops per-resource errors of
    // AlterConfigs, so the raw test below checks the code) and changes nothing.
    let bad = AlterConfig::new(ResourceSpecifier::Topic("cfg")).set("retention.ms", "soon");
    rt.block_on(a.alter_configs(&[bad], &AdminOptions::new()))?;
    let mut c = Conn::new(&g)?;
    ensure!(c.describe(TOPIC, "cfg", "retention.ms")? == (Some("12345".into()), 1));
    // Dynamic broker config: the topic default follows it.
    let set = AlterConfig::new(ResourceSpecifier::Broker(1)).set("log.segment.bytes", "2097152");
    let res = rt.block_on(a.alter_configs(&[set], &AdminOptions::new()))?;
    ensure!(res.iter().all(Result::is_ok), "{res:?}");
    ensure!(c.describe(TOPIC, "cfg", "segment.bytes")? == (Some("2097152".into()), 2));
    ensure!(c.describe(BROKER, "1", "log.segment.bytes")? == (Some("2097152".into()), 2));
    // Read-only broker configs cannot change at run time.
    let ro = AlterConfig::new(ResourceSpecifier::Broker(1)).set("num.partitions", "3");
    rt.block_on(a.alter_configs(&[ro], &AdminOptions::new()))?;
    ensure!(c.describe(BROKER, "1", "num.partitions")?.1 == 5);
    // Everything is a metadata record: it survives kill -9.
    drop(c);
    g.kill9()?;
    g.restart()?;
    let mut c = Conn::new(&g)?;
    ensure!(c.describe(TOPIC, "cfg", "retention.ms")? == (Some("12345".into()), 1));
    ensure!(c.describe(TOPIC, "cfg", "segment.bytes")? == (Some("2097152".into()), 2));
    Ok(())
}

#[test]
fn incremental_alter_configs_set_delete_append_subtract() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    create_topic(&g.bootstrap(), "inc")?;
    let mut c = Conn::new(&g)?;
    let max = 1;
    for v in 0..=max {
        ensure!(
            c.incremental(v, TOPIC, "inc", &[("retention.ms", 0, Some("1000"))], false)?
                .0
                == 0
        );
    }
    ensure!(c.describe(TOPIC, "inc", "retention.ms")? == (Some("1000".into()), 1));
    // APPEND and SUBTRACT work on lists, starting from the default.
    ensure!(
        c.incremental(
            1,
            TOPIC,
            "inc",
            &[("cleanup.policy", 2, Some("compact"))],
            false
        )?
        .0 == 0
    );
    ensure!(c.describe(TOPIC, "inc", "cleanup.policy")? == (Some("delete,compact".into()), 1));
    ensure!(
        c.incremental(
            1,
            TOPIC,
            "inc",
            &[("cleanup.policy", 3, Some("delete"))],
            false
        )?
        .0 == 0
    );
    ensure!(c.describe(TOPIC, "inc", "cleanup.policy")? == (Some("compact".into()), 1));
    let (code, msg) = c.incremental(1, TOPIC, "inc", &[("retention.ms", 2, Some("5"))], false)?;
    ensure!(code == 40, "{code}");
    ensure!(
        msg.as_deref() == Some("Can't APPEND to key retention.ms because its type is not LIST."),
        "{msg:?}"
    );
    // DELETE goes back to the default.
    ensure!(
        c.incremental(1, TOPIC, "inc", &[("cleanup.policy", 1, None)], false)?
            .0
            == 0
    );
    ensure!(c.describe(TOPIC, "inc", "cleanup.policy")? == (Some("delete".into()), 5));
    // validate_only changes nothing; errors are still reported.
    ensure!(
        c.incremental(1, TOPIC, "inc", &[("retention.ms", 0, Some("7"))], true)?
            .0
            == 0
    );
    ensure!(c.describe(TOPIC, "inc", "retention.ms")? == (Some("1000".into()), 1));
    ensure!(
        c.incremental(1, TOPIC, "inc", &[("segment.bytes", 0, Some("10"))], true)?
            .0
            == 40
    );
    ensure!(
        c.incremental(1, TOPIC, "inc", &[("no.such.config", 0, Some("1"))], false)?
            .0
            == 40
    );
    ensure!(
        c.incremental(
            1,
            TOPIC,
            "missing",
            &[("retention.ms", 0, Some("1"))],
            false
        )?
        .0 == 3
    );
    // Cluster-wide dynamic default ("") feeds topics, below a per-broker value.
    ensure!(
        c.incremental(
            1,
            BROKER,
            "",
            &[("log.retention.bytes", 0, Some("999999"))],
            false
        )?
        .0 == 0
    );
    ensure!(c.describe(TOPIC, "inc", "retention.bytes")? == (Some("999999".into()), 3));
    ensure!(c.describe(BROKER, "", "log.retention.bytes")? == (Some("999999".into()), 3));
    ensure!(
        c.incremental(
            1,
            BROKER,
            "1",
            &[("log.retention.bytes", 0, Some("5555555"))],
            false
        )?
        .0 == 0
    );
    ensure!(c.describe(TOPIC, "inc", "retention.bytes")? == (Some("5555555".into()), 2));
    ensure!(
        c.incremental(1, BROKER, "1", &[("log.retention.bytes", 1, None)], false)?
            .0
            == 0
    );
    ensure!(c.describe(TOPIC, "inc", "retention.bytes")? == (Some("999999".into()), 3));
    // A read-only broker config: INVALID_REQUEST, as Kafka's ConfigAdminManager answers
    // every broker config that fails validation (KAFKA-13609).
    ensure!(
        c.incremental(1, BROKER, "1", &[("node.id", 0, Some("2"))], false)?
            .0
            == 42
    );
    // Legacy AlterConfigs at every version: replaces the whole set.
    for v in 0..=2 {
        use kafka_protocol::messages::alter_configs_request::{
            AlterConfigsResource, AlterableConfig,
        };
        let req =
            AlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
                .with_resource_type(TOPIC)
                .with_resource_name(sb("inc"))
                .with_configs(vec![AlterableConfig::default()
                    .with_name(sb("segment.ms"))
                    .with_value(Some(sb("60000")))])]);
        let ResponseKind::AlterConfigs(r) = c.call(ApiKey::AlterConfigs, v, req.into())? else {
            bail!("wrong response kind");
        };
        ensure!(
            r.responses[0].error_code == 0,
            "AlterConfigs v{v}: {:?}",
            r.responses[0]
        );
        let req =
            AlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
                .with_resource_type(TOPIC)
                .with_resource_name(sb("inc"))
                .with_configs(vec![AlterableConfig::default()
                    .with_name(sb("retention.ms"))
                    .with_value(Some(sb("soon")))])]);
        let ResponseKind::AlterConfigs(r) = c.call(ApiKey::AlterConfigs, v, req.into())? else {
            bail!("wrong response kind");
        };
        ensure!(r.responses[0].error_code == 40, "{:?}", r.responses[0]);
        ensure!(
            r.responses[0].error_message.as_deref()
                == Some(
                    "Invalid value soon for configuration retention.ms: Not a number of type LONG"
                ),
            "{:?}",
            r.responses[0]
        );
    }
    ensure!(c.describe(TOPIC, "inc", "segment.ms")? == (Some("60000".into()), 1));
    ensure!(c.describe(TOPIC, "inc", "retention.ms")?.1 == 5);
    Ok(())
}

#[test]
fn compression_type_recompresses_on_append() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let b = g.bootstrap();
    create_topic(&b, "gz")?;
    let mut c = Conn::new(&g)?;
    ensure!(
        c.incremental(
            1,
            TOPIC,
            "gz",
            &[("compression.type", 0, Some("gzip"))],
            false
        )?
        .0 == 0
    );
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &b)
        .set("compression.codec", "none")
        .create()?;
    for i in 0..10 {
        let k = format!("k{i}");
        p.send(BaseRecord::to("gz").key(&k).payload("some value"))
            .map_err(|(e, _)| e)?;
    }
    p.flush(TIMEOUT)?;
    let req = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(sb("gz")))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)])]);
    let ResponseKind::Fetch(r) = c.call(ApiKey::Fetch, 12, req.into())? else {
        bail!("wrong response kind");
    };
    let records = r.responses[0].partitions[0]
        .records
        .clone()
        .context("records")?;
    let mut pos = 0;
    let mut count = 0;
    while pos < records.len() {
        let h = BatchHeader::parse(&records[pos..])?;
        ensure!(
            h.compression() == Some(Compression::Gzip),
            "{:?}",
            h.compression()
        );
        let recs = gregor_protocol::records::decode_records(&records[pos..pos + h.total_size()])?;
        count += recs.len();
        pos += h.total_size();
    }
    ensure!(count == 10);
    Ok(())
}
