//! Group coordinator APIs over the raw protocol: the error codes Kafka returns for unknown
//! members, wrong generations, JoinGroup v3 vs v4 with an empty member id (KIP-394), static
//! member fencing (KIP-345), and a decodable response from every group API at every advertised
//! version.

use anyhow::{bail, ensure, Result};
use bytes::{BufMut, Bytes, BytesMut};
use gregor_tests::wire::KafkaConn;
use gregor_tests::Gregor;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const BIN: &str = env!("CARGO_BIN_EXE_gregor");

type Conn = KafkaConn;

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

fn connect(g: &Gregor) -> Result<Conn> {
    KafkaConn::connect(g.bootstrap(), "groups-test")
}

fn subscription() -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    b.put_i32(1);
    b.put_i16(1);
    b.put_slice(b"t");
    b.put_i32(-1);
    b.freeze()
}

fn join_req(group: &str, member: &str, instance: Option<&str>) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(GroupId(sb(group)))
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(10_000)
        .with_member_id(sb(member))
        .with_group_instance_id(instance.map(sb))
        .with_protocol_type(sb("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(sb("range"))
            .with_metadata(subscription())])
}

fn join(c: &mut Conn, v: i16, r: JoinGroupRequest) -> Result<JoinGroupResponse> {
    match c.call_kind(ApiKey::JoinGroup, v, &r.into())? {
        ResponseKind::JoinGroup(r) => Ok(r),
        o => bail!("{o:?}"),
    }
}

fn sync(
    c: &mut Conn,
    v: i16,
    group: &str,
    gen: i32,
    member: &str,
    instance: Option<&str>,
    assign: bool,
) -> Result<SyncGroupResponse> {
    let mut r = SyncGroupRequest::default()
        .with_group_id(GroupId(sb(group)))
        .with_generation_id(gen)
        .with_member_id(sb(member))
        .with_group_instance_id(instance.map(sb));
    if assign {
        r.assignments = vec![sync_group_request::SyncGroupRequestAssignment::default()
            .with_member_id(sb(member))
            .with_assignment(Bytes::from_static(b"assignment"))];
    }
    match c.call_kind(ApiKey::SyncGroup, v, &r.into())? {
        ResponseKind::SyncGroup(r) => Ok(r),
        o => bail!("{o:?}"),
    }
}

fn heartbeat(
    c: &mut Conn,
    group: &str,
    gen: i32,
    member: &str,
    instance: Option<&str>,
) -> Result<i16> {
    let r = HeartbeatRequest::default()
        .with_group_id(GroupId(sb(group)))
        .with_generation_id(gen)
        .with_member_id(sb(member))
        .with_group_instance_id(instance.map(sb));
    match c.call_kind(ApiKey::Heartbeat, 4, &r.into())? {
        ResponseKind::Heartbeat(r) => Ok(r.error_code),
        o => bail!("{o:?}"),
    }
}

fn commit(c: &mut Conn, v: i16, group: &str, gen: i32, member: &str, offset: i64) -> Result<i16> {
    let r = OffsetCommitRequest::default()
        .with_group_id(GroupId(sb(group)))
        .with_generation_id_or_member_epoch(gen)
        .with_member_id(sb(member))
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(sb("t")))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(offset)])]);
    match c.call_kind(ApiKey::OffsetCommit, v, &r.into())? {
        ResponseKind::OffsetCommit(r) => Ok(r.topics[0].partitions[0].error_code),
        o => bail!("{o:?}"),
    }
}

fn find(c: &mut Conn, group: &str) -> Result<()> {
    let r = FindCoordinatorRequest::default().with_key(sb(group));
    match c.call_kind(ApiKey::FindCoordinator, 3, &r.into())? {
        ResponseKind::FindCoordinator(r) => {
            ensure!(r.error_code == 0);
            Ok(())
        }
        o => bail!("{o:?}"),
    }
}

#[test]
fn classic_protocol_errors_are_kafkas() -> Result<()> {
    let g = Gregor::start(BIN, &["group.initial.rebalance.delay.ms=0"])?;
    let mut c = connect(&g)?;
    find(&mut c, "g")?;
    // Commits go to topic "t"; a topic that does not exist gets UNKNOWN_TOPIC_OR_PARTITION.
    ensure!(commit(&mut c, 8, "simple", -1, "", 1)? == 3);
    let create = kafka_protocol::messages::CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![
            kafka_protocol::messages::create_topics_request::CreatableTopic::default()
                .with_name(TopicName(sb("t")))
                .with_num_partitions(1)
                .with_replication_factor(1),
        ]);
    match c.call_kind(ApiKey::CreateTopics, 7, &create.into())? {
        ResponseKind::CreateTopics(r) => ensure!(r.topics[0].error_code == 0),
        o => bail!("{o:?}"),
    }
    // Unknown group, known member id: UNKNOWN_MEMBER_ID.
    ensure!(join(&mut c, 5, join_req("g", "nobody", None))?.error_code == 25);
    // v3: an empty member id joins at once.
    let r = join(&mut c, 3, join_req("g3", "", None))?;
    ensure!(r.error_code == 0 && r.generation_id == 1, "v3 join: {r:?}");
    ensure!(r.leader == r.member_id);
    // v4: MEMBER_ID_REQUIRED with the id to use, then the join succeeds.
    let r = join(&mut c, 4, join_req("g", "", None))?;
    ensure!(r.error_code == 79, "v4 join: {}", r.error_code);
    let member = r.member_id.to_string();
    ensure!(member.starts_with("groups-test-"));
    let r = join(&mut c, 4, join_req("g", &member, None))?;
    ensure!(r.error_code == 0 && r.generation_id == 1 && r.members.len() == 1);
    // Sync: unknown member, wrong generation, then the leader's assignment.
    ensure!(sync(&mut c, 3, "g", 1, "nobody", None, false)?.error_code == 25);
    ensure!(sync(&mut c, 3, "g", 7, &member, None, false)?.error_code == 22);
    let s = sync(&mut c, 3, "g", 1, &member, None, true)?;
    ensure!(s.error_code == 0 && &s.assignment[..] == b"assignment");
    // Heartbeat errors.
    ensure!(heartbeat(&mut c, "g", 1, &member, None)? == 0);
    ensure!(heartbeat(&mut c, "g", 2, &member, None)? == 22);
    ensure!(heartbeat(&mut c, "g", 1, "nobody", None)? == 25);
    ensure!(heartbeat(&mut c, "nogroup", 1, "x", None)? == 25);
    // OffsetCommit: generation checks; a simple commit only in an empty group.
    ensure!(commit(&mut c, 8, "g", 1, &member, 5)? == 0);
    ensure!(commit(&mut c, 8, "g", 2, &member, 5)? == 22);
    ensure!(commit(&mut c, 8, "g", 1, "nobody", 5)? == 25);
    ensure!(
        commit(&mut c, 8, "g", -1, "", 5)? == 25,
        "simple commit into a live group"
    );
    ensure!(commit(&mut c, 8, "simple", -1, "", 9)? == 0);
    ensure!(
        commit(&mut c, 8, "missing", 3, "m", 9)? == 22,
        "v8 unknown group"
    );
    ensure!(
        commit(&mut c, 9, "missing", 3, "m", 9)? == 69,
        "v9 unknown group"
    );
    // OffsetFetch: committed and missing partitions, several groups at v8.
    let f = OffsetFetchRequest::default().with_groups(vec![
        OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(sb("g")))
            .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                .with_name(TopicName(sb("t")))
                .with_partition_indexes(vec![0, 1])])),
        OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(sb("simple")))
            .with_topics(None),
    ]);
    let ResponseKind::OffsetFetch(f) = c.call_kind(ApiKey::OffsetFetch, 8, &f.into())? else {
        bail!("not an OffsetFetch response")
    };
    let p = &f.groups[0].topics[0].partitions;
    ensure!(
        p[0].committed_offset == 5 && p[1].committed_offset == -1,
        "{p:?}"
    );
    ensure!(f.groups[1].topics[0].partitions[0].committed_offset == 9);
    let f = OffsetFetchRequest::default()
        .with_group_id(GroupId(sb("g")))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(TopicName(sb("t")))
            .with_partition_indexes(vec![0])]));
    let ResponseKind::OffsetFetch(f) = c.call_kind(ApiKey::OffsetFetch, 5, &f.into())? else {
        bail!("not an OffsetFetch response")
    };
    ensure!(f.topics[0].partitions[0].committed_offset == 5);
    // DeleteGroups: live group is NON_EMPTY_GROUP, missing is GROUP_ID_NOT_FOUND.
    let d = DeleteGroupsRequest::default().with_groups_names(vec![
        GroupId(sb("g")),
        GroupId(sb("missing")),
        GroupId(sb("simple")),
    ]);
    let ResponseKind::DeleteGroups(d) = c.call_kind(ApiKey::DeleteGroups, 2, &d.into())? else {
        bail!("not a DeleteGroups response")
    };
    let codes: Vec<i16> = d.results.iter().map(|r| r.error_code).collect();
    ensure!(codes == vec![68, 69, 0], "{codes:?}");
    // LeaveGroup v3 batch: the member leaves; an unknown one is UNKNOWN_MEMBER_ID.
    let l = LeaveGroupRequest::default()
        .with_group_id(GroupId(sb("g")))
        .with_members(vec![
            leave_group_request::MemberIdentity::default().with_member_id(sb(&member)),
            leave_group_request::MemberIdentity::default().with_member_id(sb("nobody")),
        ]);
    let ResponseKind::LeaveGroup(l) = c.call_kind(ApiKey::LeaveGroup, 3, &l.into())? else {
        bail!("not a LeaveGroup response")
    };
    ensure!(l.error_code == 0 && l.members[0].error_code == 0 && l.members[1].error_code == 25);
    // The group is Empty now; ListGroups with a state filter finds it.
    let lg = ListGroupsRequest::default().with_states_filter(vec![sb("empty")]);
    let ResponseKind::ListGroups(lg) = c.call_kind(ApiKey::ListGroups, 4, &lg.into())? else {
        bail!("not a ListGroups response")
    };
    ensure!(lg
        .groups
        .iter()
        .any(|x| &*x.group_id == "g" && &*x.group_state == "Empty"));
    Ok(())
}

#[test]
fn static_member_fencing() -> Result<()> {
    let g = Gregor::start(BIN, &["group.initial.rebalance.delay.ms=0"])?;
    let mut c = connect(&g)?;
    find(&mut c, "s")?;
    let r = join(&mut c, 5, join_req("s", "", Some("i1")))?;
    ensure!(r.error_code == 0 && r.generation_id == 1, "{r:?}");
    let old = r.member_id.to_string();
    ensure!(sync(&mut c, 5, "s", 1, &old, Some("i1"), true)?.error_code == 0);
    // The same instance rejoins with an empty member id: new id, same generation, no
    // rebalance; the leader is told to skip the assignment (v9).
    let r = join(&mut c, 9, join_req("s", "", Some("i1")))?;
    ensure!(r.error_code == 0 && r.generation_id == 1, "{r:?}");
    ensure!(r.skip_assignment);
    let new = r.member_id.to_string();
    ensure!(new != old);
    // The old member id is fenced everywhere.
    ensure!(heartbeat(&mut c, "s", 1, &old, Some("i1"))? == 82);
    ensure!(sync(&mut c, 5, "s", 1, &old, Some("i1"), false)?.error_code == 82);
    ensure!(join(&mut c, 5, join_req("s", &old, Some("i1")))?.error_code == 82);
    ensure!(heartbeat(&mut c, "s", 1, &new, Some("i1"))? == 0);
    // Unknown instance id: UNKNOWN_MEMBER_ID.
    ensure!(heartbeat(&mut c, "s", 1, &new, Some("other"))? == 25);
    Ok(())
}

fn request_for(key: ApiKey, v: i16) -> RequestKind {
    let gid = GroupId(sb("vg"));
    match key {
        ApiKey::FindCoordinator => FindCoordinatorRequest::default()
            .with_key(if v < 4 { sb("vg") } else { sb("") })
            .with_coordinator_keys(if v >= 4 {
                vec![sb("vg"), sb("vg2")]
            } else {
                vec![]
            })
            .into(),
        ApiKey::JoinGroup => join_req(&format!("vg-join-{v}"), "", None)
            .with_group_instance_id(None)
            .into(),
        ApiKey::SyncGroup => SyncGroupRequest::default()
            .with_group_id(gid)
            .with_member_id(sb("m"))
            .into(),
        ApiKey::Heartbeat => HeartbeatRequest::default()
            .with_group_id(gid)
            .with_member_id(sb("m"))
            .into(),
        ApiKey::LeaveGroup => {
            let r = LeaveGroupRequest::default().with_group_id(gid);
            if v >= 3 {
                r.with_members(vec![
                    leave_group_request::MemberIdentity::default().with_member_id(sb("m"))
                ])
                .into()
            } else {
                r.with_member_id(sb("m")).into()
            }
        }
        ApiKey::OffsetCommit => OffsetCommitRequest::default()
            .with_group_id(gid)
            .with_generation_id_or_member_epoch(-1)
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(sb("t")))
                .with_partitions(vec![
                    OffsetCommitRequestPartition::default().with_committed_offset(1)
                ])])
            .into(),
        ApiKey::OffsetFetch => {
            if v >= 8 {
                OffsetFetchRequest::default()
                    .with_groups(vec![OffsetFetchRequestGroup::default().with_group_id(gid)])
                    .into()
            } else {
                OffsetFetchRequest::default()
                    .with_group_id(gid)
                    .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                        .with_name(TopicName(sb("t")))
                        .with_partition_indexes(vec![0])]))
                    .into()
            }
        }
        ApiKey::DescribeGroups => DescribeGroupsRequest::default()
            .with_groups(vec![gid, GroupId(sb("absent"))])
            .into(),
        ApiKey::ListGroups => ListGroupsRequest::default().into(),
        ApiKey::DeleteGroups => DeleteGroupsRequest::default()
            .with_groups_names(vec![GroupId(sb("absent"))])
            .into(),
        ApiKey::OffsetDelete => OffsetDeleteRequest::default()
            .with_group_id(gid)
            .with_topics(vec![
                offset_delete_request::OffsetDeleteRequestTopic::default()
                    .with_name(TopicName(sb("t")))
                    .with_partitions(vec![
                        offset_delete_request::OffsetDeleteRequestPartition::default(),
                    ]),
            ])
            .into(),
        ApiKey::ConsumerGroupHeartbeat => ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(sb("cg")))
            .with_member_id(sb("member-1"))
            .with_member_epoch(0)
            .with_rebalance_timeout_ms(30_000)
            .with_subscribed_topic_names(Some(vec![TopicName(sb("t"))]))
            .with_topic_partitions(Some(vec![]))
            .into(),
        ApiKey::ConsumerGroupDescribe => ConsumerGroupDescribeRequest::default()
            .with_group_ids(vec![GroupId(sb("cg")), gid])
            .into(),
        _ => unreachable!(),
    }
}

fn advertised(c: &mut Conn) -> Result<Vec<(ApiKey, i16, i16)>> {
    let ResponseKind::ApiVersions(r) = c.call_kind(
        ApiKey::ApiVersions,
        3,
        &ApiVersionsRequest::default()
            .with_client_software_name(sb("t"))
            .with_client_software_version(sb("1"))
            .into(),
    )?
    else {
        bail!("not ApiVersions")
    };
    Ok(r.api_keys
        .iter()
        .filter_map(|k| {
            ApiKey::try_from(k.api_key)
                .ok()
                .map(|a| (a, k.min_version, k.max_version))
        })
        .collect())
}

#[test]
fn every_group_api_at_every_advertised_version() -> Result<()> {
    let g = Gregor::start(BIN, &["group.initial.rebalance.delay.ms=0"])?;
    let mut c = connect(&g)?;
    let keys = [
        ApiKey::FindCoordinator,
        ApiKey::JoinGroup,
        ApiKey::SyncGroup,
        ApiKey::Heartbeat,
        ApiKey::LeaveGroup,
        ApiKey::OffsetCommit,
        ApiKey::OffsetFetch,
        ApiKey::DescribeGroups,
        ApiKey::ListGroups,
        ApiKey::DeleteGroups,
        ApiKey::OffsetDelete,
        ApiKey::ConsumerGroupHeartbeat,
        ApiKey::ConsumerGroupDescribe,
    ];
    let adv = advertised(&mut c)?;
    find(&mut c, "vg")?;
    for key in keys {
        let Some((_, min, max)) = adv.iter().find(|(k, _, _)| *k == key).copied() else {
            bail!("{key:?} not advertised");
        };
        for v in min..=max {
            // JoinGroup from v4 answers MEMBER_ID_REQUIRED first; v0-3 joins complete.
            let resp = c.call_kind(key, v, &request_for(key, v))?;
            if let ResponseKind::FindCoordinator(r) = &resp {
                if v >= 4 {
                    ensure!(
                        r.coordinators.len() == 2
                            && r.coordinators.iter().all(|x| x.error_code == 0),
                        "v{v}: {r:?}"
                    );
                } else {
                    ensure!(r.error_code == 0 && r.port > 0, "v{v}: {r:?}");
                }
            }
            if let ResponseKind::DescribeGroups(r) = &resp {
                let absent = &r.groups[1];
                ensure!(absent.group_state.as_str() == "Dead");
                ensure!(
                    absent.error_code == if v >= 6 { 69 } else { 0 },
                    "DescribeGroups v{v}: {absent:?}"
                );
            }
        }
    }
    // A transactional id's coordinator (key type 1): `__transaction_state` is created by the
    // first such request, so the answer may be COORDINATOR_NOT_AVAILABLE until its leader is
    // known, as Kafka's.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let r = FindCoordinatorRequest::default()
            .with_key(sb("tx"))
            .with_key_type(1);
        let ResponseKind::FindCoordinator(r) =
            c.call_kind(ApiKey::FindCoordinator, 3, &r.into())?
        else {
            bail!("not FindCoordinator")
        };
        if r.error_code == 0 {
            ensure!(r.port > 0 && r.node_id.0 >= 0, "{r:?}");
            break;
        }
        ensure!(
            r.error_code == 15 && std::time::Instant::now() < deadline,
            "FindCoordinator key type 1: {r:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // ListGroups v5 tells the classic and the consumer group apart.
    let ResponseKind::ListGroups(lg) = c.call_kind(
        ApiKey::ListGroups,
        5,
        &ListGroupsRequest::default()
            .with_types_filter(vec![sb("consumer")])
            .into(),
    )?
    else {
        bail!("not ListGroups")
    };
    ensure!(lg.groups.iter().all(|x| &*x.group_type == "consumer"));
    ensure!(lg.groups.iter().any(|x| &*x.group_id == "cg"), "{lg:?}");
    Ok(())
}

/// A producer cannot write `__consumer_offsets` (Kafka: INVALID_TOPIC_EXCEPTION, "Cannot append
/// to internal topic"); a batch there would be replayed as group state.
#[test]
fn producers_cannot_write_internal_topics() -> Result<()> {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    let g = Gregor::start(BIN, &["offsets.topic.num.partitions=1"])?;
    let mut c = connect(&g)?;
    find(&mut c, "g")?;
    let batch = gregor_protocol::batch::BatchBuilder::new(0, 1_700_000_000_000)
        .record(1_700_000_000_000, Some(b"garbage"), Some(b"garbage"), &[])
        .build();
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(sb("__consumer_offsets")))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(Bytes::from(batch)))])]);
    let ResponseKind::Produce(r) = c.call_kind(ApiKey::Produce, 9, &req.into())? else {
        bail!("wrong response kind");
    };
    let p = &r.responses[0].partition_responses[0];
    ensure!(p.error_code == 17, "produce to __consumer_offsets: {p:?}");
    ensure!(p
        .error_message
        .as_deref()
        .is_some_and(|m| m.contains("internal topic")));
    Ok(())
}

/// A Metadata request that auto-creates `__consumer_offsets` creates it as the group
/// coordinator's topic (`offsets.topic.num.partitions` partitions), so groups still find their
/// coordinator afterwards.
#[test]
fn metadata_auto_creation_of_consumer_offsets_keeps_groups_working() -> Result<()> {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    let g = Gregor::start(BIN, &["offsets.topic.num.partitions=5"])?;
    let mut c = connect(&g)?;
    let req = MetadataRequest::default()
        .with_allow_auto_topic_creation(true)
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(sb("__consumer_offsets"))))
        ]));
    let ResponseKind::Metadata(m) = c.call_kind(ApiKey::Metadata, 12, &req.into())? else {
        bail!("wrong response kind");
    };
    let t = &m.topics[0];
    ensure!(t.error_code == 0, "metadata: {t:?}");
    ensure!(t.partitions.len() == 5, "{} partitions", t.partitions.len());
    ensure!(t.is_internal, "__consumer_offsets is internal");
    for group in ["g1", "g2", "another-group"] {
        find(&mut c, group)?;
    }
    Ok(())
}
