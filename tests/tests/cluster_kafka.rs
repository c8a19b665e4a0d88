//! The fault scenarios of `gregor_tests::scenarios` on three combined Apache Kafka 4.4.0
//! nodes: they validate the cluster harness and the history checker against the reference
//! (the same scenarios run on gregor in `crates/cli/tests/cluster.rs` once gregor is a KRaft
//! cluster). Skipped with a message when the Kafka jars cannot be fetched.
//!
//! The tests take one lock, so at most one three-JVM cluster runs at a time whatever
//! `--test-threads` is; each takes well under a minute on a small machine.
//! `cargo test -p gregor-tests --test cluster_kafka -- --nocapture` shows what they measure.

use std::sync::Mutex;

use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation, Layout};
use gregor_tests::reference;
use gregor_tests::scenarios;

static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn kafka_kill_active_controller_while_creating_topics() {
    if !reference::jars_or_skip() {
        return;
    }
    let _one = lock();
    let m = scenarios::kill_active_controller_while_creating_topics(Implementation::Kafka)
        .unwrap_or_else(|e| panic!("{e:#}"));
    // Kafka's election timeout is 1 s and its fetch timeout 2 s: a new leader within seconds.
    assert!(m.to_new_leader_ms < 15_000, "{m:?}");
    assert!(m.to_first_create_ms < 30_000, "{m:?}");
}

#[test]
fn kafka_full_cluster_restart_keeps_topics() {
    if !reference::jars_or_skip() {
        return;
    }
    let _one = lock();
    scenarios::full_cluster_restart_keeps_topics(Implementation::Kafka)
        .unwrap_or_else(|e| panic!("{e:#}"));
}

#[test]
fn kafka_produce_acks_all_while_killing_a_broker() {
    if !reference::jars_or_skip() {
        return;
    }
    let _one = lock();
    let m = scenarios::produce_while_killing_a_broker(Implementation::Kafka)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(m.acknowledged >= 500, "{m:?}");
}

/// The harness itself on a split layout: SIGSTOP of the active controller makes the others
/// elect a new one; SIGCONT brings the old one back as a follower; the tool and
/// DescribeQuorum agree; a broker-only node is an observer.
#[test]
fn kafka_split_layout_pause_and_resume_the_active_controller() {
    if !reference::jars_or_skip() {
        return;
    }
    let _one = lock();
    let mut cluster = Cluster::start(&ClusterConfig {
        implementation: Implementation::Kafka,
        layout: Layout::Split {
            controllers: 3,
            brokers: 1,
        },
        properties: vec![],
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    let run = |cluster: &mut Cluster| -> anyhow::Result<()> {
        let before = cluster.describe_quorum_tool()?;
        anyhow::ensure!(before.voters.len() == 3, "{before:?}");
        anyhow::ensure!(
            before.observers.contains(&4),
            "the broker observes: {before:?}"
        );
        let old = cluster.active_controller()?;
        anyhow::ensure!(
            old == before.leader_id,
            "tool {before:?}, DescribeQuorum {old}"
        );
        let pid = cluster.node(old).pid();
        cluster.node_mut(old).pause()?;
        let after = cluster.wait_for_quorum(std::time::Duration::from_secs(20), |s| {
            s.leader_id != old && s.leader_epoch > before.leader_epoch
        })?;
        cluster.node_mut(old).resume()?;
        anyhow::ensure!(cluster.node(old).pid() == pid, "resume keeps the process");
        cluster.wait_ready(std::time::Duration::from_secs(60))?;
        let tool = cluster.describe_quorum_tool()?;
        anyhow::ensure!(
            tool.leader_epoch >= after.leader_epoch,
            "{tool:?} {after:?}"
        );
        eprintln!("paused {old}: new leader {after:?}; after resume {tool:?}");
        Ok(())
    };
    run(&mut cluster).unwrap_or_else(|e| panic!("{e:#}{}", cluster.logs(30)));
}
