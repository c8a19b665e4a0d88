//! Group coordinator APIs (classic protocol and offsets):
//! FindCoordinator (key 10, batched keys from v4, KIP-699), JoinGroup (11), SyncGroup (14),
//! Heartbeat (12), LeaveGroup (13, batched members from v3, KIP-345), OffsetCommit (8),
//! OffsetFetch (9, several groups from v8, KIP-709), DescribeGroups (15), ListGroups (16,
//! states filter from v4 KIP-518, types filter from v5 KIP-848), DeleteGroups (42) and
//! OffsetDelete (47, KIP-496). <https://kafka.apache.org/protocol#The_Messages_JoinGroup>
//!
//! The handlers translate between wire versions and [`crate::group_coordinator`], which owns
//! the state.

use std::sync::Arc;

use gregor_protocol::kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use gregor_protocol::kafka_protocol::messages::describe_groups_response::{
    DescribedGroup, DescribedGroupMember,
};
use gregor_protocol::kafka_protocol::messages::find_coordinator_response::Coordinator;
use gregor_protocol::kafka_protocol::messages::leave_group_response::MemberResponse;
use gregor_protocol::kafka_protocol::messages::list_groups_response::ListedGroup;
use gregor_protocol::kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use gregor_protocol::kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use gregor_protocol::kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, BrokerId, DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, FindCoordinatorRequest, FindCoordinatorResponse, GroupId,
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchRequest,
    OffsetFetchResponse, RequestHeader, ResponseKind, SyncGroupRequest, SyncGroupResponse,
    TopicName,
};
use indexmap::IndexMap;

use super::sb;
use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use crate::error_codes as ec;
use crate::group_coordinator::classic::{JoinRequest, LeavingMember};
use crate::group_coordinator::offsets::{CommitRequest, FetchedOffset, OffsetToCommit};
use crate::group_coordinator::Wait;
use gregor_network::{respond, Handled, RequestContext};

/// Whether `ctx`'s principal may perform `operation` on `group`.
fn group_allowed(
    broker: &Broker,
    ctx: &RequestContext,
    operation: AclOperation,
    group: &str,
) -> bool {
    broker.authorize(ctx, operation, ResourceType::Group, group)
}

fn client_id(header: &RequestHeader) -> String {
    header
        .client_id
        .as_deref()
        .map(str::to_string)
        .unwrap_or_default()
}

/// Turns a coordinator wait into a handler result: deferred until the rebalance completes.
pub(crate) fn deferred<T: Send + 'static>(
    header: &RequestHeader,
    api_key: ApiKey,
    wait: Wait<T>,
    on_cancel: T,
    finish: impl FnOnce(T) -> ResponseKind + Send + 'static,
) -> Handled {
    match wait {
        Wait::Ready(r) => Handled::Ready(respond(header, api_key, finish(r))),
        Wait::Pending(rx) => {
            let header = header.clone();
            Handled::Deferred(Box::pin(async move {
                let r = rx.await.unwrap_or(on_cancel);
                respond(&header, api_key, finish(r))
            }))
        }
    }
}

/// FindCoordinator: the leader of the key's partition of `__consumer_offsets` (key type 0,
/// a group) or of `__transaction_state` (key type 1, a transactional id); each topic is
/// created on first use.
pub async fn find_coordinator(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let keys: Vec<String> = if version >= 4 {
        req.coordinator_keys.iter().map(|k| k.to_string()).collect()
    } else {
        vec![req.key.to_string()]
    };
    let internal_topic = match req.key_type {
        0 => crate::coordinator_writer::ensure_offsets_topic(broker).await,
        1 => crate::coordinator_writer::ensure_transaction_state_topic(broker).await,
        _ => Ok(()),
    };
    let image = broker.controller.image();
    // Kafka's `KafkaApis.getCoordinator`: the coordinator is the leader of the key's partition of
    // the internal topic, at its endpoint on the listener the request came in on; whether
    // that broker has loaded the partition yet is for it to answer (COORDINATOR_LOAD_IN_PROGRESS).
    let answer = |key: &str| -> (i16, Option<String>, i32, String, i32) {
        let unavailable = |code: i16, msg: Option<String>| (code, msg, -1, String::new(), -1);
        let (topic, partition) = match req.key_type {
            0 if !group_allowed(broker, ctx, AclOperation::Describe, key) => {
                return unavailable(ec::GROUP_AUTHORIZATION_FAILED, None)
            }
            0 => (
                gregor_coordinator::group::GROUP_METADATA_TOPIC_NAME,
                broker.group_coordinator.partition_for(key),
            ),
            1 if !broker.authorize(
                ctx,
                AclOperation::Describe,
                ResourceType::TransactionalId,
                key,
            ) =>
            {
                return unavailable(ec::TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None)
            }
            1 => (
                gregor_coordinator::transaction::TRANSACTION_STATE_TOPIC_NAME,
                broker.transaction_coordinator.partition_for(key),
            ),
            _ => {
                return unavailable(
                    ec::INVALID_REQUEST,
                    Some(format!("Unsupported key type {}", req.key_type)),
                )
            }
        };
        if let Err(e) = internal_topic {
            return unavailable(e, None);
        }
        let leader = image
            .topic(topic)
            .and_then(|t| t.partitions.get(&partition))
            .map_or(-1, |p| p.leader);
        let endpoint = image
            .brokers
            .get(&leader)
            .filter(|b| !b.fenced)
            .and_then(|b| b.endpoint(&ctx.listener_name));
        match endpoint {
            Some(e) => (ec::NONE, None, leader, e.host.clone(), i32::from(e.port)),
            None => unavailable(ec::COORDINATOR_NOT_AVAILABLE, None),
        }
    };
    let mut resp = FindCoordinatorResponse::default();
    if version >= 4 {
        resp.coordinators = keys
            .iter()
            .map(|k| {
                let (code, msg, node, host, port) = answer(k);
                Coordinator::default()
                    .with_key(sb(k))
                    .with_node_id(BrokerId(node))
                    .with_host(sb(&host))
                    .with_port(port)
                    .with_error_code(code)
                    .with_error_message(msg.as_deref().map(sb))
            })
            .collect();
    } else {
        let (code, msg, node, host, port) = answer(&keys[0]);
        resp = resp
            .with_error_code(code)
            .with_error_message(if version >= 1 {
                msg.as_deref().map(sb)
            } else {
                None
            })
            .with_node_id(BrokerId(node))
            .with_host(sb(&host))
            .with_port(port);
    }
    resp
}

fn fix_join(mut r: JoinGroupResponse, version: i16) -> JoinGroupResponse {
    if version < 7 && r.protocol_name.is_none() {
        r.protocol_name = Some(sb(""));
    }
    if version < 7 {
        r.protocol_type = None;
    }
    if version < 9 {
        r.skip_assignment = false;
    }
    if version < 5 {
        for m in &mut r.members {
            m.group_instance_id = None;
        }
    }
    r
}

/// JoinGroup: deferred until the join phase of the rebalance completes.
pub fn join_group(broker: &Arc<Broker>, ctx: &RequestContext, req: JoinGroupRequest) -> Handled {
    let header = &ctx.header;
    let version = header.request_api_version;
    if !group_allowed(broker, ctx, AclOperation::Read, &req.group_id) {
        let r = JoinGroupResponse::default()
            .with_error_code(ec::GROUP_AUTHORIZATION_FAILED)
            .with_generation_id(-1)
            .with_member_id(req.member_id.clone());
        return Handled::Ready(respond(header, ApiKey::JoinGroup, r.into()));
    }
    let join = JoinRequest {
        group_id: req.group_id.to_string(),
        member_id: req.member_id.to_string(),
        group_instance_id: if version >= 5 {
            req.group_instance_id.as_deref().map(str::to_string)
        } else {
            None
        },
        session_timeout_ms: req.session_timeout_ms,
        rebalance_timeout_ms: if version >= 1 {
            req.rebalance_timeout_ms
        } else {
            req.session_timeout_ms
        },
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .iter()
            .map(|p| (p.name.to_string(), p.metadata.clone()))
            .collect(),
        client_id: client_id(header),
        client_host: ctx.client_host(),
        require_known_member_id: version >= 4,
        reason: req.reason.as_deref().map(str::to_string),
    };
    let member_id = join.member_id.clone();
    let wait = broker.group_coordinator.join_group(join);
    let cancelled = JoinGroupResponse::default()
        .with_error_code(ec::UNKNOWN_MEMBER_ID)
        .with_member_id(sb(&member_id));
    deferred(header, ApiKey::JoinGroup, wait, cancelled, move |r| {
        fix_join(r, version).into()
    })
}

/// SyncGroup: deferred until the leader's assignment arrives.
pub fn sync_group(broker: &Arc<Broker>, ctx: &RequestContext, req: SyncGroupRequest) -> Handled {
    let header = &ctx.header;
    let version = header.request_api_version;
    if !group_allowed(broker, ctx, AclOperation::Read, &req.group_id) {
        let r = SyncGroupResponse::default().with_error_code(ec::GROUP_AUTHORIZATION_FAILED);
        return Handled::Ready(respond(header, ApiKey::SyncGroup, r.into()));
    }
    let wait = broker.group_coordinator.sync_group(
        &req.group_id,
        req.generation_id,
        &req.member_id,
        if version >= 3 {
            req.group_instance_id.as_deref()
        } else {
            None
        },
        if version >= 5 {
            req.protocol_type.as_deref()
        } else {
            None
        },
        if version >= 5 {
            req.protocol_name.as_deref()
        } else {
            None
        },
        req.assignments
            .iter()
            .map(|a| (a.member_id.to_string(), a.assignment.clone()))
            .collect(),
    );
    let cancelled = SyncGroupResponse::default().with_error_code(ec::UNKNOWN_MEMBER_ID);
    deferred(header, ApiKey::SyncGroup, wait, cancelled, move |mut r| {
        if version < 5 {
            r.protocol_type = None;
            r.protocol_name = None;
        }
        r.into()
    })
}

/// Heartbeat.
pub fn heartbeat(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &HeartbeatRequest,
    version: i16,
) -> HeartbeatResponse {
    if !group_allowed(broker, ctx, AclOperation::Read, &req.group_id) {
        return HeartbeatResponse::default().with_error_code(ec::GROUP_AUTHORIZATION_FAILED);
    }
    let code = broker.group_coordinator.heartbeat(
        &req.group_id,
        req.generation_id,
        &req.member_id,
        if version >= 3 {
            req.group_instance_id.as_deref()
        } else {
            None
        },
    );
    HeartbeatResponse::default().with_error_code(code)
}

/// LeaveGroup: one member (v0-2) or a batch (v3+, KIP-345).
pub fn leave_group(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    if !group_allowed(broker, ctx, AclOperation::Read, &req.group_id) {
        return LeaveGroupResponse::default().with_error_code(ec::GROUP_AUTHORIZATION_FAILED);
    }
    let members: Vec<LeavingMember> = if version >= 3 {
        req.members
            .iter()
            .map(|m| LeavingMember {
                member_id: m.member_id.to_string(),
                group_instance_id: m.group_instance_id.as_deref().map(str::to_string),
            })
            .collect()
    } else {
        vec![LeavingMember {
            member_id: req.member_id.to_string(),
            group_instance_id: None,
        }]
    };
    let (code, errors) = broker
        .group_coordinator
        .leave_group(&req.group_id, &members);
    if version >= 3 {
        LeaveGroupResponse::default()
            .with_error_code(code)
            .with_members(
                req.members
                    .iter()
                    .zip(errors.iter().chain(std::iter::repeat(&code)))
                    .map(|(m, e)| {
                        MemberResponse::default()
                            .with_member_id(m.member_id.clone())
                            .with_group_instance_id(m.group_instance_id.clone())
                            .with_error_code(*e)
                    })
                    .collect(),
            )
    } else {
        let e = if code != ec::NONE {
            code
        } else {
            errors.first().copied().unwrap_or(ec::NONE)
        };
        LeaveGroupResponse::default().with_error_code(e)
    }
}

/// OffsetCommit (versions 2-9). Partitions of topics that do not exist get
/// UNKNOWN_TOPIC_OR_PARTITION without reaching the coordinator, as Kafka's `KafkaApis` does.
/// Deferred until the commit's records are committed (the high watermark passes them).
pub fn offset_commit(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &OffsetCommitRequest,
) -> Handled {
    let header = &ctx.header;
    let version = header.request_api_version;
    if !group_allowed(broker, ctx, AclOperation::Read, &req.group_id) {
        // As Kafka: every partition carries the group's error.
        let r = OffsetCommitResponse::default().with_topics(
            req.topics
                .iter()
                .map(|t| {
                    OffsetCommitResponseTopic::default()
                        .with_name(t.name.clone())
                        .with_partitions(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    OffsetCommitResponsePartition::default()
                                        .with_partition_index(p.partition_index)
                                        .with_error_code(ec::GROUP_AUTHORIZATION_FAILED)
                                })
                                .collect(),
                        )
                })
                .collect(),
        );
        return Handled::Ready(respond(header, ApiKey::OffsetCommit, r.into()));
    }
    let image = broker.controller.image();
    // As Kafka's `handleOffsetCommitRequest`: a topic the principal may not Read is
    // TOPIC_AUTHORIZATION_FAILED, then an unknown one UNKNOWN_TOPIC_OR_PARTITION; 0: committed.
    let skip_code = |name: &str| {
        if !broker.authorize(ctx, AclOperation::Read, ResourceType::Topic, name) {
            ec::TOPIC_AUTHORIZATION_FAILED
        } else if image.topic(name).is_none() {
            ec::UNKNOWN_TOPIC_OR_PARTITION
        } else {
            ec::NONE
        }
    };
    let skips: Vec<i16> = req.topics.iter().map(|t| skip_code(&t.name)).collect();
    let known = |i: usize| skips.get(i).is_some_and(|c| *c == ec::NONE);
    let mut offsets = Vec::new();
    for (_, t) in req.topics.iter().enumerate().filter(|(i, _)| known(*i)) {
        for p in &t.partitions {
            offsets.push(OffsetToCommit {
                topic: t.name.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: if version >= 6 {
                    p.committed_leader_epoch
                } else {
                    -1
                },
                metadata: p.committed_metadata.as_deref().map(str::to_string),
            });
        }
    }
    let wait = if offsets.is_empty() && !req.topics.is_empty() {
        Wait::Ready(Vec::new())
    } else {
        broker.group_coordinator.commit_offsets(CommitRequest {
            group_id: req.group_id.to_string(),
            generation_id_or_member_epoch: req.generation_id_or_member_epoch,
            member_id: req.member_id.to_string(),
            group_instance_id: if version >= 7 {
                req.group_instance_id.as_deref().map(str::to_string)
            } else {
                None
            },
            retention_time_ms: if (2..=4).contains(&version) {
                req.retention_time_ms
            } else {
                -1
            },
            api_version: version,
            offsets,
        })
    };
    let topics: Vec<(TopicName, i16, Vec<i32>)> = req
        .topics
        .iter()
        .zip(&skips)
        .map(|(t, skip)| {
            let partitions = t.partitions.iter().map(|p| p.partition_index).collect();
            (t.name.clone(), *skip, partitions)
        })
        .collect();
    deferred(
        header,
        ApiKey::OffsetCommit,
        wait,
        Vec::new(),
        move |errors| offset_commit_response(topics, errors).into(),
    )
}

fn offset_commit_response(
    topics: Vec<(TopicName, i16, Vec<i32>)>,
    errors: Vec<i16>,
) -> OffsetCommitResponse {
    let mut it = errors.into_iter();
    OffsetCommitResponse::default().with_topics(
        topics
            .into_iter()
            .map(|(name, skip, partitions)| {
                OffsetCommitResponseTopic::default()
                    .with_name(name)
                    .with_partitions(
                        partitions
                            .into_iter()
                            .map(|partition_index| {
                                let code = if skip == ec::NONE {
                                    it.next().unwrap_or(ec::UNKNOWN_SERVER_ERROR)
                                } else {
                                    skip
                                };
                                OffsetCommitResponsePartition::default()
                                    .with_partition_index(partition_index)
                                    .with_error_code(code)
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}

fn group_topics(fetched: Vec<FetchedOffset>) -> IndexMap<String, Vec<FetchedOffset>> {
    let mut by_topic: IndexMap<String, Vec<FetchedOffset>> = IndexMap::new();
    for f in fetched {
        by_topic.entry(f.topic.clone()).or_default().push(f);
    }
    by_topic
}

/// OffsetFetch: one group (v1-7) or several (v8+, KIP-709). Without offsets a partition
/// reports -1; `topics` null means every committed offset of the group.
pub fn offset_fetch(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let c = &broker.group_coordinator;
    if version < 8 {
        let topics = req.topics.as_ref().map(|ts| {
            ts.iter()
                .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
                .collect()
        });
        let fetched = if group_allowed(broker, ctx, AclOperation::Describe, &req.group_id) {
            c.fetch_offsets_stable(
                &req.group_id,
                topics,
                None,
                version >= 7 && req.require_stable,
            )
        } else {
            Err(ec::GROUP_AUTHORIZATION_FAILED)
        };
        return match fetched {
            Ok(fetched) => OffsetFetchResponse::default().with_topics(
                group_topics(fetched)
                    .into_iter()
                    .map(|(t, ps)| {
                        OffsetFetchResponseTopic::default()
                            .with_name(TopicName(sb(&t)))
                            .with_partitions(
                                ps.into_iter()
                                    .map(|p| {
                                        OffsetFetchResponsePartition::default()
                                            .with_partition_index(p.partition)
                                            .with_committed_offset(p.offset)
                                            .with_committed_leader_epoch(if version >= 5 {
                                                p.leader_epoch
                                            } else {
                                                -1
                                            })
                                            .with_metadata(Some(sb(&p.metadata)))
                                            .with_error_code(p.error_code)
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            ),
            Err(e) => {
                let mut r = OffsetFetchResponse::default();
                if version >= 2 {
                    r.error_code = e;
                } else {
                    // v0-1 have no top-level error: every requested partition carries it.
                    r.topics = req
                        .topics
                        .iter()
                        .flatten()
                        .map(|t| {
                            OffsetFetchResponseTopic::default()
                                .with_name(t.name.clone())
                                .with_partitions(
                                    t.partition_indexes
                                        .iter()
                                        .map(|p| {
                                            OffsetFetchResponsePartition::default()
                                                .with_partition_index(*p)
                                                .with_committed_offset(-1)
                                                .with_error_code(e)
                                        })
                                        .collect(),
                                )
                        })
                        .collect();
                }
                r
            }
        };
    }
    let groups = req
        .groups
        .iter()
        .map(|g| {
            let topics = g.topics.as_ref().map(|ts| {
                ts.iter()
                    .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
                    .collect()
            });
            let member = if version >= 9 {
                g.member_id.as_deref().map(|m| (m, g.member_epoch))
            } else {
                None
            };
            let fetched = if group_allowed(broker, ctx, AclOperation::Describe, &g.group_id) {
                c.fetch_offsets_stable(&g.group_id, topics, member, req.require_stable)
            } else {
                Err(ec::GROUP_AUTHORIZATION_FAILED)
            };
            match fetched {
                Ok(fetched) => OffsetFetchResponseGroup::default()
                    .with_group_id(g.group_id.clone())
                    .with_topics(
                        group_topics(fetched)
                            .into_iter()
                            .map(|(t, ps)| {
                                OffsetFetchResponseTopics::default()
                                    .with_name(TopicName(sb(&t)))
                                    .with_partitions(
                                        ps.into_iter()
                                            .map(|p| {
                                                OffsetFetchResponsePartitions::default()
                                                    .with_partition_index(p.partition)
                                                    .with_committed_offset(p.offset)
                                                    .with_committed_leader_epoch(p.leader_epoch)
                                                    .with_metadata(Some(sb(&p.metadata)))
                                                    .with_error_code(p.error_code)
                                            })
                                            .collect(),
                                    )
                            })
                            .collect(),
                    ),
                Err(e) => OffsetFetchResponseGroup::default()
                    .with_group_id(g.group_id.clone())
                    .with_error_code(e),
            }
        })
        .collect();
    OffsetFetchResponse::default().with_groups(groups)
}

/// DescribeGroups.
pub fn describe_groups(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let groups = req
        .groups
        .iter()
        .map(|gid| {
            if !group_allowed(broker, ctx, AclOperation::Describe, gid) {
                return DescribedGroup::default()
                    .with_group_id(gid.clone())
                    .with_error_code(ec::GROUP_AUTHORIZATION_FAILED)
                    .with_authorized_operations(i32::MIN);
            }
            let d = broker
                .group_coordinator
                .describe_classic_group(gid, version);
            DescribedGroup::default()
                .with_group_id(gid.clone())
                .with_error_code(d.error_code)
                .with_error_message(if version >= 6 {
                    d.error_message.as_deref().map(sb)
                } else {
                    None
                })
                .with_group_state(sb(&d.state))
                .with_protocol_type(sb(&d.protocol_type))
                .with_protocol_data(sb(&d.protocol))
                // KIP-430, as Kafka: only for a group described without error.
                .with_authorized_operations(
                    if req.include_authorized_operations && d.error_code == ec::NONE {
                        broker.authorized_operations(ctx, ResourceType::Group, gid)
                    } else {
                        i32::MIN
                    },
                )
                .with_members(
                    d.members
                        .into_iter()
                        .map(|m| {
                            DescribedGroupMember::default()
                                .with_member_id(sb(&m.member_id))
                                .with_group_instance_id(if version >= 4 {
                                    m.group_instance_id.as_deref().map(sb)
                                } else {
                                    None
                                })
                                .with_client_id(sb(&m.client_id))
                                .with_client_host(sb(&m.client_host))
                                .with_member_metadata(m.metadata)
                                .with_member_assignment(m.assignment)
                        })
                        .collect(),
                )
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

/// ListGroups.
pub fn list_groups(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &ListGroupsRequest,
    version: i16,
) -> ListGroupsResponse {
    let states: Vec<String> = if version >= 4 {
        req.states_filter.iter().map(|s| s.to_string()).collect()
    } else {
        vec![]
    };
    let types: Vec<String> = if version >= 5 {
        req.types_filter.iter().map(|s| s.to_string()).collect()
    } else {
        vec![]
    };
    // As Kafka: everything with Describe on the Cluster, else only the groups it may describe.
    let cluster = broker.authorize(
        ctx,
        AclOperation::Describe,
        ResourceType::Cluster,
        CLUSTER_NAME,
    );
    ListGroupsResponse::default().with_groups(
        broker
            .group_coordinator
            .list_groups(&states, &types)
            .into_iter()
            .filter(|g| cluster || group_allowed(broker, ctx, AclOperation::Describe, &g.group_id))
            .map(|g| {
                ListedGroup::default()
                    .with_group_id(GroupId(sb(&g.group_id)))
                    .with_protocol_type(sb(&g.protocol_type))
                    .with_group_state(sb(if version >= 4 { &g.state } else { "" }))
                    .with_group_type(sb(if version >= 5 { &g.group_type } else { "" }))
            })
            .collect(),
    )
}

/// DeleteGroups.
pub fn delete_groups(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &DeleteGroupsRequest,
    _version: i16,
) -> DeleteGroupsResponse {
    DeleteGroupsResponse::default().with_results(
        req.groups_names
            .iter()
            .map(|g| {
                DeletableGroupResult::default()
                    .with_group_id(g.clone())
                    .with_error_code(if group_allowed(broker, ctx, AclOperation::Delete, g) {
                        broker.group_coordinator.delete_group(g)
                    } else {
                        ec::GROUP_AUTHORIZATION_FAILED
                    })
            })
            .collect(),
    )
}

/// OffsetDelete (KIP-496).
pub fn offset_delete(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &OffsetDeleteRequest,
    _version: i16,
) -> OffsetDeleteResponse {
    if !group_allowed(broker, ctx, AclOperation::Delete, &req.group_id) {
        return OffsetDeleteResponse::default().with_error_code(ec::GROUP_AUTHORIZATION_FAILED);
    }
    let parts: Vec<(String, i32)> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.name.to_string(), p.partition_index))
        })
        .collect();
    match broker
        .group_coordinator
        .delete_offsets(&req.group_id, &parts)
    {
        Err(e) => OffsetDeleteResponse::default().with_error_code(e),
        Ok(errors) => {
            let mut it = errors.into_iter();
            OffsetDeleteResponse::default().with_topics(
                req.topics
                    .iter()
                    .map(|t| {
                        OffsetDeleteResponseTopic::default()
                            .with_name(t.name.clone())
                            .with_partitions(
                                t.partitions
                                    .iter()
                                    .map(|p| {
                                        OffsetDeleteResponsePartition::default()
                                            .with_partition_index(p.partition_index)
                                            .with_error_code(it.next().unwrap_or(ec::NONE))
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            )
        }
    }
}
