// Valid request bodies for every request type kafka-protocol 0.18 knows: the seeds from which
// the allocation tests (crates/protocol/tests/bounded_alloc.rs) and the fuzz corpus
// (`cargo xtask fuzz --seed-corpus`) are built. Shared through `include!`, hence no `use`
// items: every path is absolute.
//
// `default_request` is generated from the match in kafka-protocol's `RequestKind::decode`, one
// line per API key; on an upgrade that adds API keys, add their lines.

/// The `Default` body of `api_key`'s request.
#[allow(dead_code)]
fn default_request(
    api_key: kafka_protocol::messages::ApiKey,
) -> kafka_protocol::messages::RequestKind {
    use kafka_protocol::messages::{ApiKey as K, RequestKind as R};
    match api_key {
        K::Produce => R::Produce(Default::default()),
        K::Fetch => R::Fetch(Default::default()),
        K::ListOffsets => R::ListOffsets(Default::default()),
        K::Metadata => R::Metadata(Default::default()),
        K::OffsetCommit => R::OffsetCommit(Default::default()),
        K::OffsetFetch => R::OffsetFetch(Default::default()),
        K::FindCoordinator => R::FindCoordinator(Default::default()),
        K::JoinGroup => R::JoinGroup(Default::default()),
        K::Heartbeat => R::Heartbeat(Default::default()),
        K::LeaveGroup => R::LeaveGroup(Default::default()),
        K::SyncGroup => R::SyncGroup(Default::default()),
        K::DescribeGroups => R::DescribeGroups(Default::default()),
        K::ListGroups => R::ListGroups(Default::default()),
        K::SaslHandshake => R::SaslHandshake(Default::default()),
        K::ApiVersions => R::ApiVersions(Default::default()),
        K::CreateTopics => R::CreateTopics(Default::default()),
        K::DeleteTopics => R::DeleteTopics(Default::default()),
        K::DeleteRecords => R::DeleteRecords(Default::default()),
        K::InitProducerId => R::InitProducerId(Default::default()),
        K::OffsetForLeaderEpoch => R::OffsetForLeaderEpoch(Default::default()),
        K::AddPartitionsToTxn => R::AddPartitionsToTxn(Default::default()),
        K::AddOffsetsToTxn => R::AddOffsetsToTxn(Default::default()),
        K::EndTxn => R::EndTxn(Default::default()),
        K::WriteTxnMarkers => R::WriteTxnMarkers(Default::default()),
        K::TxnOffsetCommit => R::TxnOffsetCommit(Default::default()),
        K::DescribeAcls => R::DescribeAcls(Default::default()),
        K::CreateAcls => R::CreateAcls(Default::default()),
        K::DeleteAcls => R::DeleteAcls(Default::default()),
        K::DescribeConfigs => R::DescribeConfigs(Default::default()),
        K::AlterConfigs => R::AlterConfigs(Default::default()),
        K::AlterReplicaLogDirs => R::AlterReplicaLogDirs(Default::default()),
        K::DescribeLogDirs => R::DescribeLogDirs(Default::default()),
        K::SaslAuthenticate => R::SaslAuthenticate(Default::default()),
        K::CreatePartitions => R::CreatePartitions(Default::default()),
        K::CreateDelegationToken => R::CreateDelegationToken(Default::default()),
        K::RenewDelegationToken => R::RenewDelegationToken(Default::default()),
        K::ExpireDelegationToken => R::ExpireDelegationToken(Default::default()),
        K::DescribeDelegationToken => R::DescribeDelegationToken(Default::default()),
        K::DeleteGroups => R::DeleteGroups(Default::default()),
        K::ElectLeaders => R::ElectLeaders(Default::default()),
        K::IncrementalAlterConfigs => R::IncrementalAlterConfigs(Default::default()),
        K::AlterPartitionReassignments => R::AlterPartitionReassignments(Default::default()),
        K::ListPartitionReassignments => R::ListPartitionReassignments(Default::default()),
        K::OffsetDelete => R::OffsetDelete(Default::default()),
        K::DescribeClientQuotas => R::DescribeClientQuotas(Default::default()),
        K::AlterClientQuotas => R::AlterClientQuotas(Default::default()),
        K::DescribeUserScramCredentials => R::DescribeUserScramCredentials(Default::default()),
        K::AlterUserScramCredentials => R::AlterUserScramCredentials(Default::default()),
        K::Vote => R::Vote(Default::default()),
        K::BeginQuorumEpoch => R::BeginQuorumEpoch(Default::default()),
        K::EndQuorumEpoch => R::EndQuorumEpoch(Default::default()),
        K::DescribeQuorum => R::DescribeQuorum(Default::default()),
        K::AlterPartition => R::AlterPartition(Default::default()),
        K::UpdateFeatures => R::UpdateFeatures(Default::default()),
        K::Envelope => R::Envelope(Default::default()),
        K::FetchSnapshot => R::FetchSnapshot(Default::default()),
        K::DescribeCluster => R::DescribeCluster(Default::default()),
        K::DescribeProducers => R::DescribeProducers(Default::default()),
        K::BrokerRegistration => R::BrokerRegistration(Default::default()),
        K::BrokerHeartbeat => R::BrokerHeartbeat(Default::default()),
        K::UnregisterBroker => R::UnregisterBroker(Default::default()),
        K::DescribeTransactions => R::DescribeTransactions(Default::default()),
        K::ListTransactions => R::ListTransactions(Default::default()),
        K::AllocateProducerIds => R::AllocateProducerIds(Default::default()),
        K::ConsumerGroupHeartbeat => R::ConsumerGroupHeartbeat(Default::default()),
        K::ConsumerGroupDescribe => R::ConsumerGroupDescribe(Default::default()),
        K::ControllerRegistration => R::ControllerRegistration(Default::default()),
        K::GetTelemetrySubscriptions => R::GetTelemetrySubscriptions(Default::default()),
        K::PushTelemetry => R::PushTelemetry(Default::default()),
        K::AssignReplicasToDirs => R::AssignReplicasToDirs(Default::default()),
        K::ListConfigResources => R::ListConfigResources(Default::default()),
        K::DescribeTopicPartitions => R::DescribeTopicPartitions(Default::default()),
        K::ShareGroupHeartbeat => R::ShareGroupHeartbeat(Default::default()),
        K::ShareGroupDescribe => R::ShareGroupDescribe(Default::default()),
        K::ShareFetch => R::ShareFetch(Default::default()),
        K::ShareAcknowledge => R::ShareAcknowledge(Default::default()),
        K::AddRaftVoter => R::AddRaftVoter(Default::default()),
        K::RemoveRaftVoter => R::RemoveRaftVoter(Default::default()),
        K::UpdateRaftVoter => R::UpdateRaftVoter(Default::default()),
        K::InitializeShareGroupState => R::InitializeShareGroupState(Default::default()),
        K::ReadShareGroupState => R::ReadShareGroupState(Default::default()),
        K::WriteShareGroupState => R::WriteShareGroupState(Default::default()),
        K::DeleteShareGroupState => R::DeleteShareGroupState(Default::default()),
        K::ReadShareGroupStateSummary => R::ReadShareGroupStateSummary(Default::default()),
        K::DescribeShareGroupOffsets => R::DescribeShareGroupOffsets(Default::default()),
        K::AlterShareGroupOffsets => R::AlterShareGroupOffsets(Default::default()),
        K::DeleteShareGroupOffsets => R::DeleteShareGroupOffsets(Default::default()),
    }
}

/// True when `body` decodes as `api_key` v`version` and nothing is left over.
#[allow(dead_code)]
fn decodes_exactly(
    api_key: kafka_protocol::messages::ApiKey,
    version: i16,
    body: &[u8],
) -> bool {
    let mut b = bytes::Bytes::copy_from_slice(body);
    kafka_protocol::messages::RequestKind::decode(api_key, &mut b, version).is_ok() && b.is_empty()
}

/// Valid encodings of `api_key` v`version`: the default request, then the same with one
/// element added to each array found (up to three levels deep). An element is found by
/// turning a zero count (int32 `0` or compact `1`) into one and appending filler bytes until
/// the body decodes again, exactly.
#[allow(dead_code)]
fn grown_bodies(api_key: kafka_protocol::messages::ApiKey, version: i16) -> Vec<Vec<u8>> {
    let mut body = bytes::BytesMut::new();
    if default_request(api_key).encode(&mut body, version).is_err() {
        return Vec::new();
    }
    let mut out = vec![body.to_vec()];
    let mut frontier = out.clone();
    for _depth in 0..3 {
        let mut next = Vec::new();
        for b in &frontier {
            for at in 0..b.len() {
                let counts: [(&[u8], &[u8]); 2] = [(&[0, 0, 0, 0], &[0, 0, 0, 1]), (&[1], &[2])];
                for (zero, one) in counts {
                    if !b[at..].starts_with(zero) {
                        continue;
                    }
                    'filler: for fill in [0u8, 1] {
                        for extra in 1..=48 {
                            let mut g = b[..at].to_vec();
                            g.extend_from_slice(one);
                            g.extend(std::iter::repeat_n(fill, extra));
                            g.extend_from_slice(&b[at + zero.len()..]);
                            if decodes_exactly(api_key, version, &g) {
                                if !out.contains(&g) {
                                    out.push(g.clone());
                                    next.push(g);
                                }
                                break 'filler;
                            }
                        }
                    }
                }
            }
            if out.len() > 40 {
                return out;
            }
        }
        frontier = next;
    }
    out
}

