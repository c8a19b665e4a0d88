//! The group coordinator against a real broker in this process, restarted on the same data
//! directory to check what `__consumer_offsets` keeps:
//! - KIP-211 offset expiry with a synthetic clock ([`GroupCoordinator::expire_offsets`] is
//!   called with chosen `now` values);
//! - KIP-848 consumer groups: members, target and current assignments survive a restart.
//!
//! [`GroupCoordinator::expire_offsets`]: gregor_coordinator::group::GroupCoordinator::expire_offsets

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::broker::Broker;
use crate::config::BrokerConfig;
use crate::error_codes as ec;
use crate::replica_manager::now_ms;
use crate::server::{self, RunningBroker};
use gregor_coordinator::group::assignor::Assignment;
use gregor_coordinator::group::consumer::{HeartbeatRequest, HeartbeatResponse};
use gregor_coordinator::group::offsets::{CommitRequest, OffsetToCommit};
use gregor_coordinator::group::records::{self, GroupMetadataValue, OffsetCommitValue};
use gregor_coordinator::group::Wait;

const RETENTION_MS: i64 = 60_000;

async fn start(dir: &Path) -> RunningBroker {
    let props: BTreeMap<String, String> = [
        ("log.dirs", dir.display().to_string()),
        ("listeners", "PLAINTEXT://127.0.0.1:0".into()),
        ("admin.listener", String::new()),
        ("offsets.topic.num.partitions", "1".into()),
        ("offsets.topic.replication.factor", "1".into()),
        ("offsets.retention.minutes", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let (config, _) = BrokerConfig::from_properties(props).expect("config");
    let running = server::start(config).await.expect("start");
    assert_eq!(
        running.broker.group_coordinator.config.offsets_retention_ms,
        RETENTION_MS
    );
    running
}

fn commit(b: &Arc<Broker>, group: &str, member: &str, epoch: i32, offset: i64) {
    let errors = b.group_coordinator.commit_offsets(CommitRequest {
        group_id: group.into(),
        generation_id_or_member_epoch: epoch,
        member_id: member.into(),
        group_instance_id: None,
        retention_time_ms: -1,
        api_version: 9,
        offsets: vec![OffsetToCommit {
            topic: "t".into(),
            partition: 0,
            offset,
            leader_epoch: -1,
            metadata: None,
        }],
    });
    let errors = ready(errors);
    assert_eq!(errors, vec![ec::NONE], "commit to {group}");
}

fn fetched(b: &Arc<Broker>, group: &str) -> i64 {
    let out = b
        .group_coordinator
        .fetch_offsets(group, Some(vec![("t".into(), vec![0])]), None)
        .expect("fetch");
    out[0].offset
}

fn group_ids(b: &Broker) -> Vec<String> {
    b.group_coordinator
        .list_groups(&[], &[])
        .into_iter()
        .map(|g| g.group_id)
        .collect()
}

/// A KIP-848 member joins with epoch 0 and subscribes to `t`; returns (member id, epoch).
fn join(b: &Arc<Broker>, group: &str) -> (String, i32) {
    let r = b
        .group_coordinator
        .consumer_group_heartbeat(HeartbeatRequest {
            group_id: group.into(),
            member_id: String::new(),
            member_epoch: 0,
            instance_id: None,
            rack_id: None,
            rebalance_timeout_ms: 30_000,
            subscribed_topic_names: Some(vec!["t".into()]),
            subscribed_topic_regex: None,
            server_assignor: None,
            owned: Some(BTreeMap::new()),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            version: 0,
        });
    let r = ready(r);
    assert_eq!(r.error_code, ec::NONE);
    (r.member_id.expect("member id"), r.member_epoch)
}

fn leave(b: &Arc<Broker>, group: &str, member: &str) {
    let r = heartbeat(b, group, member, -1, None);
    assert_eq!(r.error_code, ec::NONE);
}

fn heartbeat(
    b: &Arc<Broker>,
    group: &str,
    member: &str,
    epoch: i32,
    owned: Option<Assignment>,
) -> HeartbeatResponse {
    let r = b
        .group_coordinator
        .consumer_group_heartbeat(HeartbeatRequest {
            group_id: group.into(),
            member_id: member.into(),
            member_epoch: epoch,
            instance_id: None,
            rack_id: None,
            rebalance_timeout_ms: -1,
            subscribed_topic_names: None,
            subscribed_topic_regex: None,
            server_assignor: None,
            owned,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            version: 0,
        });
    ready(r)
}

/// A wait on one replica: the high watermark passed every write when it returned.
fn ready<T>(w: Wait<T>) -> T {
    match w {
        Wait::Ready(t) => t,
        Wait::Pending(mut rx) => rx.try_recv().expect("committed at once on one replica"),
    }
}

#[tokio::test]
async fn offsets_of_empty_groups_expire_and_stay_expired_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let running = start(dir.path()).await;
    let b = &running.broker;
    crate::coordinator_writer::ensure_offsets_topic(b)
        .await
        .expect("topic");

    // An empty classic group that became empty at `emptied`, with an offset committed long
    // before: KIP-211 counts from the moment the group became empty, not from the commit.
    let t0 = now_ms();
    let emptied = t0 + 10 * RETENTION_MS;
    let part = b.group_coordinator.partition_for("classic");
    b.group_coordinator
        .runtime()
        .append(
            part,
            &[
                (
                    records::offset_commit_key("classic", "t", 0),
                    Some(records::offset_commit_value(&OffsetCommitValue {
                        offset: 5,
                        leader_epoch: -1,
                        metadata: String::new(),
                        commit_timestamp_ms: t0,
                        expire_timestamp_ms: -1,
                    })),
                ),
                (
                    records::group_metadata_key("classic"),
                    Some(records::group_metadata_value(&GroupMetadataValue {
                        protocol_type: "consumer".into(),
                        generation: 3,
                        protocol: None,
                        leader: None,
                        current_state_timestamp_ms: emptied,
                        members: vec![],
                    })),
                ),
            ],
        )
        .expect("append");
    // A simple group (no group management): its offsets expire after the commit.
    commit(b, "simple", "", -1, 7);
    // A KIP-848 group whose only member committed and left.
    let (m, epoch) = join(b, "emptied");
    commit(b, "emptied", &m, epoch, 9);
    leave(b, "emptied", &m);
    // A KIP-848 group with a member: its offsets never expire.
    let (live, live_epoch) = join(b, "live");
    commit(b, "live", &live, live_epoch, 11);
    running.shutdown().await.expect("shutdown");

    // Restarted, so the classic group comes from its records.
    let running = start(dir.path()).await;
    let b = &running.broker;
    let (live, live_epoch) = join(b, "live");
    commit(b, "live", &live, live_epoch, 11);
    assert_eq!(fetched(b, "classic"), 5);
    assert_eq!(fetched(b, "simple"), 7);
    assert_eq!(fetched(b, "emptied"), 9);

    // Not yet: less than the retention since the commits.
    b.group_coordinator.expire_offsets(t0 + RETENTION_MS - 1);
    assert_eq!(fetched(b, "simple"), 7);
    assert_eq!(fetched(b, "emptied"), 9);
    assert_eq!(fetched(b, "classic"), 5);

    // The retention has passed since the commits, but not since the classic group became empty.
    let after_commits = now_ms() + RETENTION_MS;
    b.group_coordinator.expire_offsets(after_commits);
    assert_eq!(fetched(b, "simple"), -1);
    assert_eq!(fetched(b, "emptied"), -1);
    assert_eq!(fetched(b, "classic"), 5);
    assert_eq!(fetched(b, "live"), 11);

    b.group_coordinator
        .expire_offsets(emptied + RETENTION_MS - 1);
    assert_eq!(fetched(b, "classic"), 5);
    b.group_coordinator.expire_offsets(emptied + RETENTION_MS);
    assert_eq!(fetched(b, "classic"), -1);

    // Far in the future the group with a member still has its offset.
    b.group_coordinator
        .expire_offsets(emptied + 1000 * RETENTION_MS);
    assert_eq!(fetched(b, "live"), 11);
    let mut ids = group_ids(b);
    ids.sort();
    assert_eq!(ids, vec!["live".to_string()], "expired groups are deleted");
    running.shutdown().await.expect("shutdown");

    // The tombstones keep them gone after a restart.
    let running = start(dir.path()).await;
    let b = &running.broker;
    assert_eq!(fetched(b, "classic"), -1);
    assert_eq!(fetched(b, "simple"), -1);
    assert_eq!(fetched(b, "emptied"), -1);
    assert_eq!(fetched(b, "live"), 11);
    assert_eq!(group_ids(b), vec!["live".to_string()]);
    running.shutdown().await.expect("shutdown");
}

/// Heartbeats every member (reporting what it was last given) until the group is Stable.
fn reconcile(b: &Arc<Broker>, group: &str, members: &mut [(String, i32, Assignment)]) {
    for _ in 0..20 {
        for (id, epoch, owned) in members.iter_mut() {
            let r = heartbeat(b, group, id, *epoch, Some(owned.clone()));
            assert_eq!(r.error_code, ec::NONE, "{:?}", r.error_message);
            *epoch = r.member_epoch;
            if let Some(a) = r.assignment {
                *owned = a;
            }
        }
        let d = b.group_coordinator.describe_consumer_group(group);
        if d.state == "Stable" {
            return;
        }
    }
    panic!("group {group} did not become Stable");
}

type Described = (
    String,
    i32,
    i32,
    Vec<(String, i32, Assignment, Assignment, Vec<String>)>,
);

fn describe(b: &Arc<Broker>, group: &str) -> Described {
    let d = b.group_coordinator.describe_consumer_group(group);
    assert_eq!(d.error_code, ec::NONE, "{:?}", d.error_message);
    (
        d.state,
        d.group_epoch,
        d.assignment_epoch,
        d.members
            .into_iter()
            .map(|m| {
                (
                    m.member_id,
                    m.member_epoch,
                    m.assignment,
                    m.target_assignment,
                    m.subscribed_topic_names,
                )
            })
            .collect(),
    )
}

#[tokio::test]
async fn kip848_members_and_assignments_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let running = start(dir.path()).await;
    let b = &running.broker;
    crate::coordinator_writer::ensure_offsets_topic(b)
        .await
        .expect("topic");
    let created = b
        .controller
        .create_topics(
            vec![gregor_metadata::controller::NewTopic {
                name: "t".into(),
                num_partitions: 4,
                replication_factor: 1,
                assignments: vec![],
                configs: BTreeMap::new(),
            }],
            false,
        )
        .await
        .expect("create t");
    created[0].as_ref().expect("create t");

    let (a, ea) = join(b, "cg");
    let mut members = vec![(a.clone(), ea, Assignment::new())];
    reconcile(b, "cg", &mut members);
    let (m2, e2) = join(b, "cg");
    members.push((m2.clone(), e2, Assignment::new()));
    reconcile(b, "cg", &mut members);
    let before = describe(b, "cg");
    assert_eq!(before.0, "Stable");
    assert_eq!(before.3.len(), 2);
    assert!(before
        .3
        .iter()
        .all(|m| m.2.values().map(|p| p.len()).sum::<usize>() == 2));
    running.shutdown().await.expect("shutdown");

    let running = start(dir.path()).await;
    let b = &running.broker;
    assert_eq!(
        describe(b, "cg"),
        before,
        "the group as it was before the restart"
    );
    // The members carry on with their epochs; nothing is rebalanced.
    for (id, epoch, owned) in &members {
        let r = heartbeat(b, "cg", id, *epoch, Some(owned.clone()));
        assert_eq!(r.error_code, ec::NONE, "{:?}", r.error_message);
        assert_eq!(r.member_epoch, *epoch);
        assert_eq!(r.assignment.as_ref(), Some(owned));
    }
    assert_eq!(describe(b, "cg"), before);
    // One leaves: its records are tombstoned, the other takes over its partitions.
    leave(b, "cg", &m2);
    members.truncate(1);
    reconcile(b, "cg", &mut members);
    let after_leave = describe(b, "cg");
    assert_eq!(after_leave.3.len(), 1);
    assert_eq!(
        after_leave.3[0].2.values().map(|p| p.len()).sum::<usize>(),
        4
    );
    running.shutdown().await.expect("shutdown");

    let running = start(dir.path()).await;
    let b = &running.broker;
    assert_eq!(describe(b, "cg"), after_leave);
    leave(b, "cg", &a);
    assert_eq!(b.group_coordinator.delete_group("cg"), ec::NONE);
    running.shutdown().await.expect("shutdown");

    // Deleted groups stay deleted.
    let running = start(dir.path()).await;
    let b = &running.broker;
    assert!(group_ids(b).is_empty());
    running.shutdown().await.expect("shutdown");
}
