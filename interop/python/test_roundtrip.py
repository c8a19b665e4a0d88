"""Create a topic with the admin client, produce keyed records with headers, and consume them
all back in order from offset 0 via assign: with confluent-kafka (librdkafka) and with
kafka-python (a pure-Python implementation of the protocol), and across the two."""

import time

import pytest

from conftest import REPLICATION_FACTOR
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import NewTopic as KpNewTopic

from conftest import records

N = 250
PARTITIONS = 3
DEADLINE_S = 60


# --- confluent-kafka ------------------------------------------------------------------------


def ck_create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=REPLICATION_FACTOR)])
    futures[topic].result(timeout=30)
    # The topic must be visible in metadata with all partitions led.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=topic, timeout=10)
        t = md.topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) == partitions and all(
            p.leader >= 0 for p in t.partitions.values()
        ):
            return
    pytest.fail(f"topic {topic} never showed {partitions} led partitions in metadata")


def ck_produce(bootstrap: str, topic: str, recs, partition: int = 0, **config) -> None:
    failures = []
    delivered = []

    def on_delivery(err, msg):
        if err is not None:
            failures.append(err)
        else:
            delivered.append((msg.partition(), msg.offset()))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **config})
    for key, value, headers in recs:
        producer.produce(topic, key=key, value=value, headers=headers, partition=partition, on_delivery=on_delivery)
        producer.poll(0)
    remaining = producer.flush(DEADLINE_S)
    assert remaining == 0, f"{remaining} records not delivered"
    assert not failures, failures
    assert sorted(o for _, o in delivered) == list(range(len(recs)))


def ck_consume(bootstrap: str, topic: str, n: int, partition: int = 0):
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    consumer.assign([TopicPartition(topic, partition, 0)])
    got = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(got) < n and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.offset(), msg.key(), msg.value(), msg.headers() or []))
    finally:
        consumer.close()
    return got


# --- kafka-python ---------------------------------------------------------------------------


def kp_create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="interop-kafka-python")
    try:
        admin.create_topics([KpNewTopic(name=topic, num_partitions=partitions, replication_factor=REPLICATION_FACTOR)])
        described = admin.describe_topics([topic])
        assert len(described) == 1, described
        t = described[0]
        # kafka-python 3 names the field "name" (older releases "topic").
        assert t.get("name", t.get("topic")) == topic, described
        assert t.get("error_code", 0) == 0, described
        assert len(t["partitions"]) == partitions, described
    finally:
        admin.close()


def kp_produce(bootstrap: str, topic: str, recs, partition: int = 0) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    futures = [
        producer.send(topic, key=key, value=value, headers=list(headers), partition=partition)
        for key, value, headers in recs
    ]
    producer.flush(timeout=DEADLINE_S)
    offsets = [f.get(timeout=DEADLINE_S).offset for f in futures]
    producer.close()
    assert offsets == list(range(len(recs))), offsets[:10]


def kp_consume(bootstrap: str, topic: str, n: int, partition: int = 0):
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    tp = KpTopicPartition(topic, partition)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    got = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(got) < n and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=1000).values():
                for msg in batch:
                    got.append((msg.offset, msg.key, msg.value, [(k, v) for k, v in msg.headers]))
    finally:
        consumer.close()
    return got


# --- checks ---------------------------------------------------------------------------------


def assert_same(got, recs) -> None:
    assert len(got) == len(recs), f"consumed {len(got)} of {len(recs)} records"
    for i, ((offset, key, value, headers), (want_key, want_value, want_headers)) in enumerate(zip(got, recs)):
        assert offset == i, f"record {i} has offset {offset}"
        assert key == want_key, f"offset {i}: key {key!r} != {want_key!r}"
        assert value == want_value, f"offset {i}: value {value!r} != {want_value!r}"
        assert list(headers) == want_headers, f"offset {i}: headers {headers!r} != {want_headers!r}"


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_roundtrip(bootstrap, topic_name, compression):
    recs = records(N)
    ck_create_topic(bootstrap, topic_name)
    ck_produce(bootstrap, topic_name, recs, partition=0, **{"compression.type": compression})
    assert_same(ck_consume(bootstrap, topic_name, N), recs)


def test_kafka_python_roundtrip(bootstrap, topic_name):
    recs = records(N)
    kp_create_topic(bootstrap, topic_name)
    kp_produce(bootstrap, topic_name, recs, partition=1)
    assert_same(kp_consume(bootstrap, topic_name, N, partition=1), recs)


def test_confluent_kafka_to_kafka_python(bootstrap, topic_name):
    recs = records(N)
    ck_create_topic(bootstrap, topic_name)
    ck_produce(bootstrap, topic_name, recs, partition=2)
    assert_same(kp_consume(bootstrap, topic_name, N, partition=2), recs)


def test_kafka_python_to_confluent_kafka(bootstrap, topic_name):
    recs = records(N)
    kp_create_topic(bootstrap, topic_name)
    kp_produce(bootstrap, topic_name, recs, partition=0)
    assert_same(ck_consume(bootstrap, topic_name, N, partition=0), recs)
