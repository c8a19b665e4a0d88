//! KIP-848 consumer group APIs: ConsumerGroupHeartbeat (key 68) and ConsumerGroupDescribe
//! (key 69). <https://kafka.apache.org/protocol#The_Messages_ConsumerGroupHeartbeat>

use std::collections::BTreeSet;
use std::sync::Arc;

use gregor_protocol::kafka_protocol::messages::consumer_group_describe_response::{
    self as describe, DescribedGroup, Member,
};
use gregor_protocol::kafka_protocol::messages::consumer_group_heartbeat_response::{
    self as hb, Assignment,
};
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, TopicName,
};

use super::groups::deferred;
use super::sb;
use crate::authorizer::{AclOperation, ResourceType};
use crate::broker::Broker;
use crate::error_codes::{self as ec, ErrorCode};
use crate::group_coordinator::assignor;
use crate::group_coordinator::consumer::{HeartbeatRequest, HeartbeatResponse};
use gregor_network::{respond, Handled, RequestContext};

/// ConsumerGroupHeartbeat: deferred until the records of what it changed are committed.
pub fn heartbeat(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &ConsumerGroupHeartbeatRequest,
) -> Handled {
    let header = &ctx.header;
    if !broker.authorize(ctx, AclOperation::Read, ResourceType::Group, &req.group_id) {
        return Handled::Ready(respond(
            header,
            ApiKey::ConsumerGroupHeartbeat,
            ConsumerGroupHeartbeatResponse::default()
                .with_error_code(ec::GROUP_AUTHORIZATION_FAILED)
                .with_member_epoch(-1)
                .into(),
        ));
    }
    let wait = broker
        .group_coordinator
        .consumer_group_heartbeat(HeartbeatRequest {
            group_id: req.group_id.to_string(),
            member_id: req.member_id.to_string(),
            member_epoch: req.member_epoch,
            instance_id: req.instance_id.as_deref().map(str::to_string),
            rack_id: req.rack_id.as_deref().map(str::to_string),
            rebalance_timeout_ms: req.rebalance_timeout_ms,
            subscribed_topic_names: req
                .subscribed_topic_names
                .as_ref()
                .map(|v| v.iter().map(|t| t.to_string()).collect()),
            subscribed_topic_regex: req.subscribed_topic_regex.as_deref().map(str::to_string),
            server_assignor: req.server_assignor.as_deref().map(str::to_string),
            owned: req.topic_partitions.as_ref().map(|tps| {
                let mut a = assignor::Assignment::new();
                for tp in tps {
                    a.entry(tp.topic_id)
                        .or_default()
                        .extend(tp.partitions.iter().copied());
                }
                a.retain(|_, ps: &mut BTreeSet<i32>| !ps.is_empty());
                a
            }),
            client_id: header
                .client_id
                .as_deref()
                .map(str::to_string)
                .unwrap_or_default(),
            client_host: ctx.client_host(),
            version: header.request_api_version,
        });
    let cancelled = HeartbeatResponse {
        error_code: ErrorCode::CoordinatorNotAvailable.code(),
        error_message: None,
        member_id: None,
        member_epoch: -1,
        heartbeat_interval_ms: 0,
        assignment: None,
    };
    deferred(
        header,
        ApiKey::ConsumerGroupHeartbeat,
        wait,
        cancelled,
        |r| heartbeat_response(r).into(),
    )
}

fn heartbeat_response(r: HeartbeatResponse) -> ConsumerGroupHeartbeatResponse {
    ConsumerGroupHeartbeatResponse::default()
        .with_error_code(r.error_code)
        .with_error_message(r.error_message.as_deref().map(sb))
        .with_member_id(r.member_id.as_deref().map(sb))
        .with_member_epoch(r.member_epoch)
        .with_heartbeat_interval_ms(r.heartbeat_interval_ms)
        .with_assignment(r.assignment.map(|a| {
            Assignment::default().with_topic_partitions(
                a.into_iter()
                    .map(|(t, ps)| {
                        hb::TopicPartitions::default()
                            .with_topic_id(t)
                            .with_partitions(ps.into_iter().collect())
                    })
                    .collect(),
            )
        }))
}

fn describe_assignment(
    image: &gregor_metadata::MetadataImage,
    a: &assignor::Assignment,
) -> describe::Assignment {
    describe::Assignment::default().with_topic_partitions(
        a.iter()
            .map(|(t, ps)| {
                describe::TopicPartitions::default()
                    .with_topic_id(*t)
                    .with_topic_name(TopicName(sb(image
                        .topic_by_id(t)
                        .map_or("", |x| x.name.as_str()))))
                    .with_partitions(ps.iter().copied().collect())
            })
            .collect(),
    )
}

/// ConsumerGroupDescribe.
pub fn describe(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &ConsumerGroupDescribeRequest,
    version: i16,
) -> ConsumerGroupDescribeResponse {
    let image = broker.controller.image();
    ConsumerGroupDescribeResponse::default().with_groups(
        req.group_ids
            .iter()
            .map(|gid| {
                if !broker.authorize(ctx, AclOperation::Describe, ResourceType::Group, gid) {
                    return DescribedGroup::default()
                        .with_group_id(gid.clone())
                        .with_error_code(ec::GROUP_AUTHORIZATION_FAILED)
                        .with_authorized_operations(i32::MIN);
                }
                let d = broker.group_coordinator.describe_consumer_group(gid);
                DescribedGroup::default()
                    .with_group_id(gid.clone())
                    .with_error_code(d.error_code)
                    .with_error_message(d.error_message.as_deref().map(sb))
                    .with_group_state(sb(&d.state))
                    .with_group_epoch(d.group_epoch)
                    .with_assignment_epoch(d.assignment_epoch)
                    .with_assignor_name(sb(&d.assignor_name))
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
                                Member::default()
                                    .with_member_id(sb(&m.member_id))
                                    .with_instance_id(m.instance_id.as_deref().map(sb))
                                    .with_rack_id(m.rack_id.as_deref().map(sb))
                                    .with_member_epoch(m.member_epoch)
                                    .with_client_id(sb(&m.client_id))
                                    .with_client_host(sb(&m.client_host))
                                    .with_subscribed_topic_names(
                                        m.subscribed_topic_names
                                            .iter()
                                            .map(|t| TopicName(sb(t)))
                                            .collect(),
                                    )
                                    .with_subscribed_topic_regex(
                                        m.subscribed_topic_regex.as_deref().map(sb),
                                    )
                                    .with_assignment(describe_assignment(&image, &m.assignment))
                                    .with_target_assignment(describe_assignment(
                                        &image,
                                        &m.target_assignment,
                                    ))
                                    .with_member_type(if version >= 1 { 1 } else { -1 })
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}
