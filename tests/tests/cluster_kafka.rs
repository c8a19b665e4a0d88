//! The fault scenarios of `gregor_tests::scenarios` on three combined Apache Kafka 4.4.0
//! nodes: they validate the cluster harness and the history checker against the reference
//! (the same scenarios run on gregor in `crates/cli/tests/cluster.rs` once gregor is a KRaft
//! cluster). Skipped with a message when the Kafka jars cannot be fetched.
//!
//! The tests take one lock, so at most one three-JVM cluster runs at a time whatever
//! `--test-threads` is; each takes well under a minute on a small machine.
//! `cargo test -p gregor-tests --test cluster_kafka -- --nocapture` shows what they measure.

use std::sync::Mutex;

use gregor_tests::cluster::Implementation;
use gregor_tests::reference;
use gregor_tests::scenarios::{self, FullRestart};

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
    scenarios::full_cluster_restart_keeps_topics(Implementation::Kafka, FullRestart::Graceful)
        .unwrap_or_else(|e| panic!("{e:#}"));
}

#[test]
fn kafka_full_cluster_crash_restart_keeps_topics() {
    if !reference::jars_or_skip() {
        return;
    }
    let _one = lock();
    scenarios::full_cluster_restart_keeps_topics(Implementation::Kafka, FullRestart::Kill9)
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

/// The harness on a split layout (three controllers, one broker): SIGSTOP of the active
/// controller, a new leader, SIGCONT, ready again; the tool and DescribeQuorum agree.
#[test]
fn kafka_split_layout_pause_and_resume_the_active_controller() {
    if !reference::jars_or_skip() {
        return;
    }
    let _one = lock();
    let m = scenarios::pause_and_resume_active_controller(Implementation::Kafka)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(m.to_new_leader_ms < 15_000, "{m:?}");
}

/// The proxies on real nodes: the active controller cut from the other two (a network
/// partition); they elect a new leader; after the heal the old one follows.
#[test]
fn kafka_isolate_the_active_controller_behind_proxies() {
    if !reference::jars_or_skip() {
        return;
    }
    let _one = lock();
    let m = scenarios::isolate_active_controller(Implementation::Kafka)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(m.to_new_leader_ms < 15_000, "{m:?}");
    assert_ne!(m.new_leader, m.isolated);
}
