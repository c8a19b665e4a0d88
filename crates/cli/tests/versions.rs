//! Every implemented API at every version gregor advertises gets a well-formed answer: a
//! response that decodes at that version with the right correlation id and no error where
//! none is due. Catches fields that a version cannot carry (the encoder refuses them) and
//! version-dependent behaviour (topic names vs ids).

use anyhow::{bail, ensure, Result};
use bytes::Bytes;
use gregor_protocol::batch::BatchBuilder;
use gregor_tests::wire::KafkaConn;
use gregor_tests::Gregor;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

const BIN: &str = env!("CARGO_BIN_EXE_gregor");

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

fn tn(s: &str) -> TopicName {
    TopicName(sb(s))
}

#[test]
fn every_api_at_every_version() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let mut c = KafkaConn::connect(g.bootstrap(), "versions-test")?;

    // ApiVersions: the advertised ranges lie within Kafka 4.1's for each API.
    let mut advertised = Vec::new();
    for v in 0..=4 {
        let req = ApiVersionsRequest::default()
            .with_client_software_name(sb("versions-test"))
            .with_client_software_version(sb("1.0"));
        let ResponseKind::ApiVersions(r) = c.call_kind(ApiKey::ApiVersions, v, &req.into())? else {
            bail!("wrong response kind");
        };
        ensure!(r.error_code == 0, "ApiVersions v{v}: {}", r.error_code);
        advertised = r.api_keys;
    }
    for k in &advertised {
        let key = ApiKey::try_from(k.api_key).map_err(|()| anyhow::anyhow!("unknown key"))?;
        let r = key.valid_versions();
        ensure!(
            r.min <= k.min_version && k.max_version <= r.max,
            "{key:?} range"
        );
    }
    let versions = |key: ApiKey| {
        advertised
            .iter()
            .find(|k| k.api_key == key as i16)
            .map(|k| k.min_version..=k.max_version)
            .into_iter()
            .flatten()
    };
    for key in [
        ApiKey::Produce,
        ApiKey::Fetch,
        ApiKey::ListOffsets,
        ApiKey::Metadata,
        ApiKey::CreateTopics,
        ApiKey::DeleteTopics,
        ApiKey::InitProducerId,
        ApiKey::DescribeConfigs,
        ApiKey::CreatePartitions,
        ApiKey::DescribeCluster,
        ApiKey::DescribeQuorum,
    ] {
        ensure!(versions(key).next().is_some(), "{key:?} not advertised");
    }

    for v in versions(ApiKey::CreateTopics) {
        let name = format!("vt-{v}");
        let req = CreateTopicsRequest::default()
            .with_timeout_ms(10_000)
            .with_topics(vec![CreatableTopic::default()
                .with_name(tn(&name))
                .with_num_partitions(1)
                .with_replication_factor(1)]);
        let ResponseKind::CreateTopics(r) = c.call_kind(ApiKey::CreateTopics, v, &req.into())?
        else {
            bail!("wrong response kind");
        };
        ensure!(
            r.topics[0].error_code == 0,
            "CreateTopics v{v}: {:?}",
            r.topics[0]
        );
    }

    for v in versions(ApiKey::Metadata) {
        let topics = if v == 0 {
            Some(vec![
                MetadataRequestTopic::default().with_name(Some(tn("vt-2")))
            ])
        } else {
            Some(vec![
                MetadataRequestTopic::default().with_name(Some(tn(&format!("auto-{v}"))))
            ])
        };
        let req = MetadataRequest::default()
            .with_topics(topics)
            .with_allow_auto_topic_creation(true);
        let ResponseKind::Metadata(r) = c.call_kind(ApiKey::Metadata, v, &req.into())? else {
            bail!("wrong response kind");
        };
        ensure!(
            r.topics.len() == 1 && r.topics[0].error_code == 0,
            "Metadata v{v}: {:?}",
            r.topics
        );
        ensure!(r.topics[0].partitions.len() == 1);
    }
    // The topic id of vt-2, for APIs that name topics by id.
    let ResponseKind::Metadata(m) = c.call_kind(
        ApiKey::Metadata,
        12,
        &MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(tn("vt-2")))
            ]))
            .into(),
    )?
    else {
        bail!("wrong response kind");
    };
    let topic_id: Uuid = m.topics[0].topic_id;
    ensure!(!topic_id.is_nil());

    for v in versions(ApiKey::Produce) {
        let batch = BatchBuilder::new(0, 1_000)
            .record(1_000, Some(b"k"), Some(format!("v{v}").as_bytes()), &[])
            .build();
        let td = if v >= 13 {
            TopicProduceData::default().with_topic_id(topic_id)
        } else {
            TopicProduceData::default().with_name(tn("vt-2"))
        };
        let req = ProduceRequest::default()
            .with_acks(1)
            .with_timeout_ms(10_000)
            .with_topic_data(vec![td.with_partition_data(vec![
                PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(Bytes::from(batch))),
            ])]);
        let ResponseKind::Produce(r) = c.call_kind(ApiKey::Produce, v, &req.into())? else {
            bail!("wrong response kind");
        };
        let p = &r.responses[0].partition_responses[0];
        ensure!(p.error_code == 0, "Produce v{v}: {p:?}");
        ensure!(
            p.base_offset == i64::from(v - 3),
            "Produce v{v}: offset {}",
            p.base_offset
        );
    }

    for v in versions(ApiKey::Fetch) {
        let ft = if v >= 13 {
            FetchTopic::default().with_topic_id(topic_id)
        } else {
            FetchTopic::default().with_topic(tn("vt-2"))
        };
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(1)
            .with_max_bytes(1 << 20)
            .with_session_epoch(-1)
            .with_topics(vec![ft.with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)])]);
        let ResponseKind::Fetch(r) = c.call_kind(ApiKey::Fetch, v, &req.into())? else {
            bail!("wrong response kind");
        };
        let p = &r.responses[0].partitions[0];
        ensure!(p.error_code == 0, "Fetch v{v}: {p:?}");
        ensure!(
            p.high_watermark == 11,
            "Fetch v{v}: HW {}",
            p.high_watermark
        );
        ensure!(
            p.records.as_ref().is_some_and(|r| !r.is_empty()),
            "Fetch v{v}: no records"
        );
    }

    for v in versions(ApiKey::ListOffsets) {
        for (ts, expected) in [(-2i64, 0i64), (-1, 11)] {
            let req = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(vec![ListOffsetsTopic::default()
                    .with_name(tn("vt-2"))
                    .with_partitions(vec![ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_timestamp(ts)])]);
            let ResponseKind::ListOffsets(r) = c.call_kind(ApiKey::ListOffsets, v, &req.into())?
            else {
                bail!("wrong response kind");
            };
            let p = &r.topics[0].partitions[0];
            ensure!(
                p.error_code == 0 && p.offset == expected,
                "ListOffsets v{v} {ts}: {p:?}"
            );
        }
    }

    for v in versions(ApiKey::DescribeConfigs) {
        let req = DescribeConfigsRequest::default()
            .with_include_synonyms(true)
            .with_resources(vec![
                DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(sb("vt-2"))
                    .with_configuration_keys(None),
                DescribeConfigsResource::default()
                    .with_resource_type(4)
                    .with_resource_name(sb("1"))
                    .with_configuration_keys(None),
            ]);
        let ResponseKind::DescribeConfigs(r) =
            c.call_kind(ApiKey::DescribeConfigs, v, &req.into())?
        else {
            bail!("wrong response kind");
        };
        for res in &r.results {
            ensure!(
                res.error_code == 0 && !res.configs.is_empty(),
                "DescribeConfigs v{v}"
            );
        }
    }

    for v in versions(ApiKey::DescribeCluster) {
        let ResponseKind::DescribeCluster(r) = c.call_kind(
            ApiKey::DescribeCluster,
            v,
            &DescribeClusterRequest::default().into(),
        )?
        else {
            bail!("wrong response kind");
        };
        ensure!(
            r.error_code == 0 && r.brokers.len() == 1,
            "DescribeCluster v{v}"
        );
    }

    // DescribeQuorum on the broker listener (Kafka's brokers forward it to the active
    // controller; this node is one): the one voter leads, at each version.
    for v in versions(ApiKey::DescribeQuorum) {
        let req = DescribeQuorumRequest::default().with_topics(vec![
            describe_quorum_request::TopicData::default()
                .with_topic_name(tn("__cluster_metadata"))
                .with_partitions(vec![describe_quorum_request::PartitionData::default()]),
        ]);
        let ResponseKind::DescribeQuorum(r) =
            c.call_kind(ApiKey::DescribeQuorum, v, &req.into())?
        else {
            bail!("wrong response kind");
        };
        let p = r.topics.first().and_then(|t| t.partitions.first());
        ensure!(
            r.error_code == 0
                && p.is_some_and(|p| p.error_code == 0
                    && p.leader_id.0 == 1
                    && p.current_voters.len() == 1),
            "DescribeQuorum v{v}: {r:?}"
        );
        ensure!(
            r.nodes.len() == usize::from(v >= 2),
            "DescribeQuorum v{v}: {r:?}"
        );
    }

    for v in versions(ApiKey::InitProducerId) {
        let req = InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        let ResponseKind::InitProducerId(r) =
            c.call_kind(ApiKey::InitProducerId, v, &req.into())?
        else {
            bail!("wrong response kind");
        };
        ensure!(
            r.error_code == 0 && r.producer_id.0 >= 0,
            "InitProducerId v{v}"
        );
    }

    for v in versions(ApiKey::CreatePartitions) {
        let req = CreatePartitionsRequest::default()
            .with_timeout_ms(10_000)
            .with_topics(vec![CreatePartitionsTopic::default()
                .with_name(tn(&format!("vt-{}", 2 + v)))
                .with_count(2)
                .with_assignments(None)]);
        let ResponseKind::CreatePartitions(r) =
            c.call_kind(ApiKey::CreatePartitions, v, &req.into())?
        else {
            bail!("wrong response kind");
        };
        ensure!(
            r.results[0].error_code == 0,
            "CreatePartitions v{v}: {:?}",
            r.results[0]
        );
    }

    for v in versions(ApiKey::DeleteTopics) {
        let name = format!("vt-{}", v + 1);
        let req = if v >= 6 {
            DeleteTopicsRequest::default()
                .with_topics(vec![DeleteTopicState::default().with_name(Some(tn(&name)))])
        } else {
            DeleteTopicsRequest::default().with_topic_names(vec![tn(&name)])
        }
        .with_timeout_ms(10_000);
        let ResponseKind::DeleteTopics(r) = c.call_kind(ApiKey::DeleteTopics, v, &req.into())?
        else {
            bail!("wrong response kind");
        };
        ensure!(
            r.responses[0].error_code == 0,
            "DeleteTopics v{v}: {:?}",
            r.responses[0]
        );
    }
    Ok(())
}
