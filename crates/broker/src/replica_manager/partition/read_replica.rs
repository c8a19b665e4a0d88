//! Consumer reads beyond the leader (KIP-392): which local replica may serve a read (Kafka's
//! `Partition.getLocalLog` with `requireLeader`), and the leader's choice of a preferred read
//! replica for a consumer (`ReplicaManager.findPreferredReadReplica`, decided in
//! [`crate::replication::replica_selector`]).

use super::{Partition, Role};
use crate::error_codes as ec;
use crate::replication::replica_selector::{
    preferred_read_replica, BrokerNodes, ClientMetadata, FollowerView, LeaderView, ReplicaSelector,
};

impl Partition {
    /// Kafka's `getLocalLog(currentLeaderEpoch, requireLeader)`: the request's
    /// `current_leader_epoch` (-1 = not given) against ours (KIP-320), then the role: with
    /// `require_leader` this broker must lead; without it (a consumer's Fetch v11+, KIP-392) a
    /// follower serves too. A partition without a leader or leaving this broker
    /// ([`Role::None`]) serves nobody.
    ///
    /// # Errors
    /// FENCED_LEADER_EPOCH (74) when the client's epoch is older, UNKNOWN_LEADER_EPOCH (76) when
    /// it is newer, NOT_LEADER_OR_FOLLOWER (6) when this replica may not serve the read.
    pub fn check_local_replica(
        &self,
        current_leader_epoch: i32,
        require_leader: bool,
    ) -> Result<(), i16> {
        if require_leader {
            return self.check_leader(current_leader_epoch);
        }
        let s = self.state.read();
        if current_leader_epoch >= 0 {
            if current_leader_epoch < s.leader_epoch {
                return Err(ec::FENCED_LEADER_EPOCH);
            }
            if current_leader_epoch > s.leader_epoch {
                return Err(ec::UNKNOWN_LEADER_EPOCH);
            }
        }
        match s.role {
            Role::Leader | Role::Follower => Ok(()),
            Role::None => Err(ec::NOT_LEADER_OR_FOLLOWER),
        }
    }

    /// Whether this replica still serves reads of the kind `require_leader` says (see
    /// [`Partition::check_local_replica`]); a delayed fetch completes when it stops.
    pub fn serves_reads(&self, require_leader: bool) -> bool {
        match self.role() {
            Role::Leader => true,
            Role::Follower => !require_leader,
            Role::None => false,
        }
    }

    /// Kafka's `findPreferredReadReplica` for a consumer fetching `fetch_offset`: `None`
    /// unless this broker leads and `selector` picks a follower (in the committed ISR, with a
    /// log holding the offset, registered, unfenced and on the client's listener in
    /// `brokers`); else that follower's id.
    pub fn preferred_read_replica(
        &self,
        selector: ReplicaSelector,
        client: &ClientMetadata,
        brokers: &BrokerNodes,
        fetch_offset: i64,
    ) -> Option<i32> {
        let now = self.clock.now_ms();
        let leader_log_end_offset = self.log.log_end_offset();
        let guard = self.leader.lock();
        let core = guard.as_ref()?;
        let followers = core
            .replicas()
            .iter()
            .filter(|id| **id != self.local_broker)
            .filter_map(|id| {
                core.follower(*id).map(|f| FollowerView {
                    broker_id: *id,
                    log_start_offset: f.log_start_offset,
                    log_end_offset: f.log_end_offset,
                    last_caught_up_time_ms: f.last_caught_up_time_ms,
                })
            })
            .collect();
        let view = LeaderView {
            leader_id: self.local_broker,
            log_end_offset: leader_log_end_offset,
            isr: core.isr(),
            followers,
        };
        let chosen = preferred_read_replica(selector, client, &view, brokers, fetch_offset, now);
        if let Some(id) = chosen {
            tracing::debug!(partition = %self.topic_partition, client_id = %client.client_id,
                rack = %client.rack_id, preferred_read_replica = id, "preferred read replica");
        }
        chosen
    }
}
