//! The fault scenarios of `gregor_tests::scenarios` on three combined gregor nodes: the
//! same scenarios that `tests/tests/cluster_kafka.rs` runs on Apache Kafka 4.4.0 (which
//! validates them). Run them all with
//! `cargo test -p gregor --test cluster -- --test-threads=1 --nocapture`.

use gregor_tests::cluster::Implementation;
use gregor_tests::scenarios::{self, FullRestart};

fn gregor() -> Implementation {
    Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into())
}

#[test]
fn gregor_kill_active_controller_while_creating_topics() {
    let m = scenarios::kill_active_controller_while_creating_topics(gregor())
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(m.to_new_leader_ms < 15_000, "{m:?}");
    assert!(m.to_first_create_ms < 30_000, "{m:?}");
}

#[test]
fn gregor_full_cluster_restart_keeps_topics() {
    scenarios::full_cluster_restart_keeps_topics(gregor(), FullRestart::Graceful)
        .unwrap_or_else(|e| panic!("{e:#}"));
}

#[test]
fn gregor_full_cluster_crash_restart_keeps_topics() {
    scenarios::full_cluster_restart_keeps_topics(gregor(), FullRestart::Kill9)
        .unwrap_or_else(|e| panic!("{e:#}"));
}

#[test]
fn gregor_produce_acks_all_while_killing_a_broker() {
    let m = scenarios::produce_while_killing_a_broker(gregor()).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(m.acknowledged >= 500, "{m:?}");
}

/// The proxies on gregor nodes: the active controller cut from the other two; they elect a
/// new leader; after the heal the old one follows (as on Kafka in `cluster_kafka.rs`).
#[test]
fn gregor_isolate_the_active_controller_behind_proxies() {
    let m = scenarios::isolate_active_controller(gregor()).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(m.to_new_leader_ms < 15_000, "{m:?}");
    assert_ne!(m.new_leader, m.isolated);
}

#[test]
fn gregor_split_layout_pause_and_resume_the_active_controller() {
    let m =
        scenarios::pause_and_resume_active_controller(gregor()).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(m.to_new_leader_ms < 15_000, "{m:?}");
}

/// The harness's process control on gregor processes, which works before gregor is a KRaft
/// cluster (each node then runs alone): `gregor storage format` of three voters with one
/// cluster id, start, SIGSTOP/SIGCONT, graceful stop (exit 0), restart on the same
/// directories, kill -9, and no process left when the cluster is dropped during a panic.
#[test]
fn harness_controls_gregor_processes() {
    use gregor_tests::cluster::{Cluster, ClusterConfig};
    use gregor_tests::process::pid_alive;
    use std::time::Duration;

    fn state(pid: u32) -> char {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, r)| r.trim_start().chars().next())
            })
            .unwrap_or('?')
    }

    let t = Duration::from_secs(60);
    let mut cluster = Cluster::prepare(&ClusterConfig::combined(gregor(), 3)).unwrap();
    cluster.format().unwrap();
    for n in cluster.nodes() {
        let meta = std::fs::read_to_string(n.data_dir().join("meta.properties")).unwrap();
        assert!(
            meta.contains(&format!("cluster.id={}", cluster.cluster_id)),
            "{meta}"
        );
        assert!(meta.contains(&format!("node.id={}", n.node_id)), "{meta}");
    }
    let mut pids = Vec::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        // The three voters must all run before any of them elects a leader and serves its
        // broker listener.
        for id in 1..=3 {
            cluster.node_mut(id).spawn().unwrap();
        }
        for id in 1..=3 {
            cluster.node_mut(id).wait_listening(t).unwrap();
        }
        let n = cluster.node_mut(2);
        let pid = n.pid().unwrap();
        // A signal is delivered asynchronously: wait for the state to show it.
        let wait_state = |stopped: bool| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while (state(pid) == 'T') != stopped {
                assert!(
                    std::time::Instant::now() < deadline,
                    "process state {} (want stopped: {stopped})",
                    state(pid)
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        n.pause().unwrap();
        wait_state(true);
        n.resume().unwrap();
        wait_state(false);
        n.stop().unwrap();
        assert!(!pid_alive(pid) && n.pid().is_none());
        assert!(
            n.log_tail(5).contains("shut down cleanly"),
            "{}",
            n.log_tail(20)
        );
        n.spawn().unwrap();
        n.wait_listening(t).unwrap();
        assert_ne!(n.pid(), Some(pid));
        let pid = n.pid().unwrap();
        n.kill9().unwrap();
        assert!(!pid_alive(pid));
        n.spawn().unwrap();
        n.wait_listening(t).unwrap();
        let running: Vec<u32> = cluster.nodes().iter().filter_map(|n| n.pid()).collect();
        assert_eq!(running.len(), 3);
        // A test that fails with the cluster running: unwinding drops the cluster.
        std::panic::panic_any(running);
    }));
    let payload = result.expect_err("the closure panics");
    pids.extend(payload.downcast_ref::<Vec<u32>>().expect("the pids").iter());
    for pid in pids {
        assert!(!pid_alive(pid), "node pid {pid} outlived its cluster");
    }
}

/// The replication fault test (`gregor_tests::chaos`, 90 s of seeded faults with librdkafka
/// and Java acks=all producers, RF 3, min.insync.replicas=2) on three gregor nodes: the run
/// `tests/tests/chaos.rs` does on Apache Kafka. `GREGOR_CHAOS_SEED` replays a seed; a failed
/// run leaves the history and every node's `server.log` in `target/chaos/`.
#[test]
fn gregor_chaos_bounded() {
    use gregor_tests::chaos::{self, ChaosConfig};
    let seed = std::env::var("GREGOR_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs())
        });
    eprintln!("chaos seed {seed} (replay: GREGOR_CHAOS_SEED={seed})");
    let mut config = ChaosConfig::new(gregor(), std::time::Duration::from_secs(90), seed);
    // `GREGOR_CHAOS_FAULTS=isolate-node,cut-link` narrows the faults to a subset.
    if let Ok(list) = std::env::var("GREGOR_CHAOS_FAULTS") {
        config.faults = chaos::Fault::parse_list(&list).expect("GREGOR_CHAOS_FAULTS");
    }
    let out = chaos::run(&config).unwrap_or_else(|e| panic!("seed {seed}: {e:#}"));
    eprintln!("{out}");
    assert!(
        out.is_valid(),
        "seed {seed}: the history check failed:\n{out}"
    );
    assert!(!out.events.is_empty(), "no fault was injected:\n{out}");
    assert!(
        out.acknowledged_rdkafka > 0 && out.acknowledged_java > 0,
        "both clients must have written:\n{out}"
    );
}
