"""Consumer groups from other clients: confluent-kafka with the classic protocol (three members
sharing a 6-partition topic, commits, a member leaving hands its partitions over) and with
KIP-848's `group.protocol=consumer`, and kafka-python's group consumer (commits, committed
offsets read back through the consumer and the admin client)."""

import time

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, ConsumerGroupType, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, KafkaConsumer
from kafka import TopicPartition as KpTopicPartition

from test_roundtrip import ck_create_topic, kp_create_topic, kp_produce

PARTITIONS = 6
PER_PARTITION = 50
DEADLINE_S = 90


def keyed(partition: int, start: int, n: int):
    return [(f"k{partition}-{i}".encode(), f"v{partition}-{i}".encode(), []) for i in range(start, start + n)]


def produce_all(bootstrap: str, topic: str, start: int, n: int) -> None:
    """n records into each partition; partition p's i-th record is (k{p}-{i}, v{p}-{i})."""
    for p in range(PARTITIONS):
        recs = keyed(p, start, n)
        failures = []
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
        for key, value, _ in recs:
            producer.produce(
                topic, key=key, value=value, partition=p, on_delivery=lambda err, _m: err and failures.append(err)
            )
        assert producer.flush(DEADLINE_S) == 0
        assert not failures, failures


def ck_group_consumer(bootstrap: str, group: str, client_id: str, **extra) -> Consumer:
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": client_id,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        **extra,
    }
    return Consumer(config)


def poll_all(consumers, seen, until, what: str, deadline_s: float = DEADLINE_S) -> None:
    """Polls every consumer in turn (each needs its own poll calls for rebalances), recording
    (consumer index, partition, offset, key, value) in `seen`, until `until()` holds."""
    deadline = time.monotonic() + deadline_s
    while not until():
        if time.monotonic() > deadline:
            assignments = [sorted(tp.partition for tp in c.assignment()) for c in consumers]
            pytest.fail(f"timed out waiting for {what}; assignments {assignments}, {len(seen)} records seen")
        for i, c in enumerate(consumers):
            msg = c.poll(0.1)
            if msg is None:
                continue
            if msg.error() is not None:
                # In a cluster a consumer may ask a broker that has not applied the new topic
                # yet: librdkafka reports it once and retries (as against Kafka).
                if msg.error().code() == KafkaError.UNKNOWN_TOPIC_OR_PART and not msg.error().fatal():
                    continue
                pytest.fail(f"consumer {i}: {msg.error()}")
            seen.append((i, msg.partition(), msg.offset(), msg.key(), msg.value()))


def assignments(consumers):
    return [sorted(tp.partition for tp in c.assignment()) for c in consumers]


def balanced(consumers, partitions: int = PARTITIONS) -> bool:
    """Every partition assigned to exactly one consumer, and the split as even as it can be."""
    parts = assignments(consumers)
    flat = sorted(p for ps in parts for p in ps)
    sizes = [len(ps) for ps in parts]
    return flat == list(range(partitions)) and max(sizes) - min(sizes) <= 1


def check_once(seen, start: int, n: int) -> None:
    """Every record start..start+n of every partition was consumed exactly once, in order."""
    by_partition = {}
    for _, p, offset, key, value in seen:
        by_partition.setdefault(p, []).append((offset, key, value))
    assert sorted(by_partition) == list(range(PARTITIONS)), sorted(by_partition)
    for p, got in sorted(by_partition.items()):
        want = [(start + i, k, v) for i, (k, v, _) in enumerate(keyed(p, start, n))]
        assert got == want, f"partition {p}: consumed {[o for o, _, _ in got][:20]}..., expected {start}..{start + n - 1}"


def committed(consumer: Consumer, topic: str):
    tps = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
    return {tp.partition: tp.offset for tp in tps}


def test_confluent_kafka_classic_group(bootstrap, topic_name):
    ck_create_topic(bootstrap, topic_name, partitions=PARTITIONS)
    group = f"{topic_name}-group"
    consumers = [
        ck_group_consumer(bootstrap, group, f"member-{i}", **{"partition.assignment.strategy": "range"})
        for i in range(3)
    ]
    closed = []
    try:
        for c in consumers:
            c.subscribe([topic_name])
        seen = []
        poll_all(consumers, seen, lambda: balanced(consumers), "three members to share six partitions")
        assert all(len(ps) == 2 for ps in assignments(consumers)), assignments(consumers)
        assert not seen, "records consumed from an empty topic"

        produce_all(bootstrap, topic_name, 0, PER_PARTITION)
        poll_all(consumers, seen, lambda: len(seen) >= PARTITIONS * PER_PARTITION, "every record")
        check_once(seen, 0, PER_PARTITION)
        # Each member consumed exactly the partitions it was assigned.
        parts = assignments(consumers)
        for i, _p, _o, _k, _v in seen:
            assert _p in parts[i], f"member {i} consumed partition {_p} but holds {parts[i]}"
        for c in consumers:
            c.commit(asynchronous=False)
        assert committed(consumers[0], topic_name) == {p: PER_PARTITION for p in range(PARTITIONS)}

        # One member leaves (LeaveGroup): the other two take over its partitions and resume from
        # the committed offsets, so the next records are consumed once and nothing is re-read.
        leaver = consumers.pop(1)
        leaver.close()
        closed.append(leaver)
        seen = []
        poll_all(consumers, seen, lambda: balanced(consumers), "two members to share six partitions")
        assert sorted(len(ps) for ps in assignments(consumers)) == [3, 3], assignments(consumers)
        produce_all(bootstrap, topic_name, PER_PARTITION, PER_PARTITION)
        poll_all(consumers, seen, lambda: len(seen) >= PARTITIONS * PER_PARTITION, "the second round")
        check_once(seen, PER_PARTITION, PER_PARTITION)
        for c in consumers:
            c.commit(asynchronous=False)
        assert committed(consumers[0], topic_name) == {p: 2 * PER_PARTITION for p in range(PARTITIONS)}
    finally:
        for c in consumers:
            c.close()


def test_confluent_kafka_consumer_protocol_group(bootstrap, topic_name):
    """KIP-848: the broker assigns; members heartbeat with ConsumerGroupHeartbeat."""
    ck_create_topic(bootstrap, topic_name, partitions=PARTITIONS)
    group = f"{topic_name}-group"
    consumers = [ck_group_consumer(bootstrap, group, f"member-{i}", **{"group.protocol": "consumer"}) for i in range(2)]
    try:
        for c in consumers:
            c.subscribe([topic_name])
        seen = []
        poll_all(consumers, seen, lambda: balanced(consumers), "two KIP-848 members to share six partitions")
        assert sorted(len(ps) for ps in assignments(consumers)) == [3, 3], assignments(consumers)

        produce_all(bootstrap, topic_name, 0, PER_PARTITION)
        poll_all(consumers, seen, lambda: len(seen) >= PARTITIONS * PER_PARTITION, "every record")
        check_once(seen, 0, PER_PARTITION)
        for c in consumers:
            c.commit(asynchronous=False)
        assert committed(consumers[0], topic_name) == {p: PER_PARTITION for p in range(PARTITIONS)}

        # A third member joins: the broker moves partitions to it (revoked first, then handed over).
        consumers.append(ck_group_consumer(bootstrap, group, "member-2", **{"group.protocol": "consumer"}))
        consumers[-1].subscribe([topic_name])
        seen = []
        poll_all(consumers, seen, lambda: balanced(consumers), "three KIP-848 members to share six partitions")
        assert [len(ps) for ps in assignments(consumers)] == [2, 2, 2], assignments(consumers)
        # The admin view (ConsumerGroupDescribe): a `consumer` group, Stable, the server-side
        # assignor, and each member's current and target assignment equal to what it holds.
        admin = AdminClient({"bootstrap.servers": bootstrap})
        desc = admin.describe_consumer_groups([group])[group].result(timeout=30)
        assert (desc.type, desc.state, desc.partition_assignor) == (
            ConsumerGroupType.CONSUMER,
            ConsumerGroupState.STABLE,
            "uniform",
        ), (desc.type, desc.state, desc.partition_assignor)
        held = {c.memberid(): sorted(tp.partition for tp in c.assignment()) for c in consumers}
        described = {
            m.member_id: (
                m.client_id,
                sorted(tp.partition for tp in m.assignment.topic_partitions),
                sorted(tp.partition for tp in m.target_assignment.topic_partitions),
            )
            for m in desc.members
        }
        assert described == {
            c.memberid(): (f"member-{i}", held[c.memberid()], held[c.memberid()]) for i, c in enumerate(consumers)
        }, described
        listed = [g for g in admin.list_consumer_groups().result(timeout=30).valid if g.group_id == group]
        assert [(g.type, g.state) for g in listed] == [(ConsumerGroupType.CONSUMER, ConsumerGroupState.STABLE)]
        produce_all(bootstrap, topic_name, PER_PARTITION, PER_PARTITION)
        poll_all(consumers, seen, lambda: len(seen) >= PARTITIONS * PER_PARTITION, "the second round")
        check_once(seen, PER_PARTITION, PER_PARTITION)
    finally:
        for c in consumers:
            c.close()


def test_kafka_python_group_commits(bootstrap, topic_name):
    partitions = 3
    n = 40
    kp_create_topic(bootstrap, topic_name, partitions=partitions)
    for p in range(partitions):
        kp_produce(bootstrap, topic_name, keyed(p, 0, n), partition=p)
    group = f"{topic_name}-group"
    consumer = KafkaConsumer(
        topic_name,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    got = {}
    try:
        deadline = time.monotonic() + DEADLINE_S
        while sum(len(v) for v in got.values()) < partitions * n and time.monotonic() < deadline:
            for tp, batch in consumer.poll(timeout_ms=500).items():
                got.setdefault(tp.partition, []).extend((m.offset, m.key, m.value) for m in batch)
        assert sorted(got) == list(range(partitions)), sorted(got)
        for p in range(partitions):
            assert got[p] == [(i, k, v) for i, (k, v, _) in enumerate(keyed(p, 0, n))], f"partition {p}"
        assert consumer.assignment() == {KpTopicPartition(topic_name, p) for p in range(partitions)}
        consumer.commit()
        for p in range(partitions):
            assert consumer.committed(KpTopicPartition(topic_name, p)) == n, p
    finally:
        consumer.close()

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets({group: None})
        assert {tp.partition: om.offset for tp, om in offsets[group].items()} == {p: n for p in range(partitions)}
        groups = {g[0] if isinstance(g, tuple) else g.get("group_id", g.get("group")) for g in admin.list_groups()}
        assert group in groups, groups
    finally:
        admin.close()

    # A new member of the same group starts at the committed offsets: nothing more to read.
    consumer = KafkaConsumer(topic_name, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(consumer.assignment()) < partitions and time.monotonic() < deadline:
            assert not consumer.poll(timeout_ms=500), "re-read records below the committed offsets"
        assert len(consumer.assignment()) == partitions
        for p in range(partitions):
            assert consumer.position(KpTopicPartition(topic_name, p)) == n
    finally:
        consumer.close()


def test_confluent_kafka_commit_then_rejoin(bootstrap, topic_name):
    """Offsets committed by one member are where a later member of the group starts."""
    ck_create_topic(bootstrap, topic_name, partitions=PARTITIONS)
    produce_all(bootstrap, topic_name, 0, 10)
    group = f"{topic_name}-group"
    c = ck_group_consumer(bootstrap, group, "first")
    try:
        c.subscribe([topic_name])
        seen = []
        poll_all([c], seen, lambda: len(seen) >= PARTITIONS * 10, "every record")
        # Commit explicit offsets (not the position): 7 for each partition.
        c.commit(offsets=[TopicPartition(topic_name, p, 7) for p in range(PARTITIONS)], asynchronous=False)
        assert committed(c, topic_name) == {p: 7 for p in range(PARTITIONS)}
    finally:
        c.close()
    c = ck_group_consumer(bootstrap, group, "second")
    try:
        c.subscribe([topic_name])
        seen = []
        poll_all([c], seen, lambda: len(seen) >= PARTITIONS * 3, "the records after the commit")
        assert sorted((p, o) for _, p, o, _, _ in seen) == [(p, o) for p in range(PARTITIONS) for o in (7, 8, 9)]
    finally:
        c.close()
