//! The fault scenarios of `gregor_tests::scenarios` on three combined gregor nodes: the
//! same scenarios that `tests/tests/cluster_kafka.rs` runs on Apache Kafka 4.4.0 (which
//! validates them). Ignored until gregor is a KRaft cluster; run them with
//! `cargo test -p gregor --test cluster -- --include-ignored --test-threads=1 --nocapture`.

use gregor_tests::cluster::Implementation;
use gregor_tests::scenarios;

fn gregor() -> Implementation {
    Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into())
}

#[test]
#[ignore = "needs the KRaft cluster (issue 10), enabled at integration"]
fn gregor_kill_active_controller_while_creating_topics() {
    let m = scenarios::kill_active_controller_while_creating_topics(gregor())
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(m.to_new_leader_ms < 15_000, "{m:?}");
    assert!(m.to_first_create_ms < 30_000, "{m:?}");
}

#[test]
#[ignore = "needs the KRaft cluster (issue 10), enabled at integration"]
fn gregor_full_cluster_restart_keeps_topics() {
    scenarios::full_cluster_restart_keeps_topics(gregor()).unwrap_or_else(|e| panic!("{e:#}"));
}

#[test]
#[ignore = "needs the KRaft cluster (issue 10), enabled at integration"]
fn gregor_produce_acks_all_while_killing_a_broker() {
    let m = scenarios::produce_while_killing_a_broker(gregor()).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(m.acknowledged >= 500, "{m:?}");
}
