//! Three `RaftManager`s on loopback sockets (the socket transport outbound, a small accept loop
//! inbound that frames requests as a controller listener does): elect, commit, crash the
//! leader, a new leader within seconds, proposals go on, the crashed node restarts from its
//! directory and catches up.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use gregor_protocol::frame::{decode_request, encode_response, DecodedRequest};
use gregor_raft::driver::transport::{SocketTransport, TransportConfig};
use gregor_raft::driver::{DriverError, LeaderAndEpoch, RaftManager, RaftManagerConfig};
use gregor_raft::{MetadataLogConfig, NodeId, QuorumConfig, VoterSet};
use kafka_protocol::messages::ApiKey;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Serves KRaft requests on `listener` for `manager`, one request at a time per connection.
async fn accept_loop(listener: TcpListener, manager: Arc<RaftManager>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(serve(stream, manager.clone()));
    }
}

async fn serve(mut stream: TcpStream, manager: Arc<RaftManager>) {
    let supported = |k: ApiKey| match k {
        ApiKey::Vote => Some((0, 2)),
        ApiKey::BeginQuorumEpoch | ApiKey::EndQuorumEpoch => Some((0, 1)),
        ApiKey::Fetch => Some((13, 18)),
        ApiKey::DescribeQuorum => Some((0, 2)),
        _ => None,
    };
    loop {
        let mut size = [0u8; 4];
        if stream.read_exact(&mut size).await.is_err() {
            return;
        }
        let size = i32::from_be_bytes(size);
        if !(0..=16 * 1024 * 1024).contains(&size) {
            return;
        }
        let mut frame = BytesMut::zeroed(size as usize);
        if stream.read_exact(&mut frame).await.is_err() {
            return;
        }
        let Ok(DecodedRequest::Request {
            header,
            api_key,
            body,
        }) = decode_request(frame.freeze(), &supported)
        else {
            return;
        };
        let version = header.request_api_version;
        let Some(response) = manager.handle_kafka_request(&body, version).await else {
            return;
        };
        let Ok(bytes) = encode_response(api_key, version, header.correlation_id, &response) else {
            return;
        };
        if stream.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

struct Node {
    manager: Arc<RaftManager>,
    server: tokio::task::JoinHandle<()>,
}

async fn start_node(
    id: NodeId,
    dir: &std::path::Path,
    listener: TcpListener,
    endpoints: &BTreeMap<NodeId, (String, u16)>,
) -> Node {
    let mut quorum = QuorumConfig::new(id, VoterSet::new(endpoints.keys().copied()).unwrap());
    quorum.election_timeout_ms = 300;
    quorum.fetch_timeout_ms = 600;
    quorum.election_backoff_max_ms = 300;
    quorum.request_timeout_ms = 1000;
    let config = RaftManagerConfig {
        quorum,
        metadata_log_dir: dir.to_path_buf(),
        log: MetadataLogConfig::default(),
        voter_endpoints: endpoints.clone(),
        controller_listener_name: "CONTROLLER".into(),
    };
    let transport = TransportConfig {
        node_id: id,
        endpoints: endpoints.clone(),
        request_timeout_ms: 1000,
        retry_backoff_ms: 20,
    };
    let manager =
        RaftManager::start(config, |inbound| SocketTransport::new(transport, inbound)).unwrap();
    let server = tokio::spawn(accept_loop(listener, manager.clone()));
    Node { manager, server }
}

/// The node every live node agrees leads, with its epoch.
async fn agreed_leader(nodes: &BTreeMap<NodeId, Node>, above_epoch: i32) -> LeaderAndEpoch {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let views: Vec<LeaderAndEpoch> = nodes
            .values()
            .map(|n| *n.manager.leader_and_epoch().borrow())
            .collect();
        if let Some(first) = views.first() {
            if first.leader_id.is_some()
                && first.epoch > above_epoch
                && views.iter().all(|v| v == first)
            {
                return *first;
            }
        }
        assert!(Instant::now() < deadline, "no agreed leader: {views:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Proposes on whichever node leads, retrying NotLeader until committed.
async fn propose(nodes: &BTreeMap<NodeId, Node>, value: &str) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for n in nodes.values() {
            match n
                .manager
                .propose(vec![Bytes::copy_from_slice(value.as_bytes())])
                .await
            {
                Ok(offset) => return offset,
                Err(DriverError::NotLeader { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert!(Instant::now() < deadline, "{value} not committed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn committed_values(manager: &Arc<RaftManager>, count: usize) -> Vec<String> {
    let mut stream = manager.committed(0);
    let mut out = Vec::new();
    while out.len() < count {
        let b = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("caught up in time")
            .unwrap()
            .into_batch()
            .expect("no snapshot is written in this test");
        out.extend(
            b.values
                .iter()
                .map(|v| String::from_utf8_lossy(v).into_owned()),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_voters_elect_commit_fail_over_and_catch_up() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut listeners = BTreeMap::new();
    let mut endpoints = BTreeMap::new();
    for id in 1..=3 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        endpoints.insert(
            id,
            ("127.0.0.1".to_string(), l.local_addr().unwrap().port()),
        );
        listeners.insert(id, l);
    }
    let mut nodes = BTreeMap::new();
    for (id, l) in listeners {
        let dir = dirs[(id - 1) as usize].path();
        nodes.insert(id, start_node(id, dir, l, &endpoints).await);
    }
    let started = Instant::now();
    let first = agreed_leader(&nodes, 0).await;
    println!(
        "first leader {:?} in epoch {} after {} ms",
        first.leader_id,
        first.epoch,
        started.elapsed().as_millis()
    );
    let mut expected = Vec::new();
    for i in 0..5 {
        let v = format!("before-{i}");
        propose(&nodes, &v).await;
        expected.push(v);
    }
    for n in nodes.values() {
        assert_eq!(committed_values(&n.manager, 5).await, expected);
    }

    // Crash the leader: no resignation, its socket server gone.
    let old = first.leader_id.unwrap();
    let crashed = nodes.remove(&old).unwrap();
    crashed.server.abort();
    crashed.manager.halt().await;
    let crash_at = Instant::now();
    let second = agreed_leader(&nodes, first.epoch).await;
    let failover_ms = crash_at.elapsed().as_millis();
    println!(
        "after the crash of leader {old}: leader {:?} in epoch {} after {failover_ms} ms",
        second.leader_id, second.epoch
    );
    assert_ne!(second.leader_id, Some(old));
    assert!(failover_ms < 10_000, "failover took {failover_ms} ms");
    for i in 0..5 {
        let v = format!("after-{i}");
        propose(&nodes, &v).await;
        expected.push(v);
    }
    for n in nodes.values() {
        assert_eq!(committed_values(&n.manager, 10).await, expected);
    }

    // Restart the crashed node from its directory on its port: it follows and catches up.
    let (_, (host, port)) = endpoints.iter().find(|(&id, _)| id == old).unwrap();
    let listener = TcpListener::bind((host.as_str(), *port)).await.unwrap();
    let restarted = start_node(old, dirs[(old - 1) as usize].path(), listener, &endpoints).await;
    assert_eq!(committed_values(&restarted.manager, 10).await, expected);
    nodes.insert(old, restarted);
    let last = agreed_leader(&nodes, first.epoch).await;
    assert!(last.epoch >= second.epoch);
    propose(&nodes, "last").await;
    expected.push("last".into());
    for n in nodes.values() {
        assert_eq!(committed_values(&n.manager, 11).await, expected);
    }
    for n in nodes.values() {
        n.server.abort();
        n.manager.shutdown().await;
    }
}
