"""Admin APIs from other clients: topic and broker configs round trips (DescribeConfigs,
IncrementalAlterConfigs SET/DELETE, AlterConfigs) with confluent-kafka and kafka-python,
DeleteRecords, and the consumer-group admin calls (list, describe, list/alter offsets, delete)."""

import time

import pytest

from conftest import BROKERS, REPLICATION_FACTOR
from confluent_kafka import ConsumerGroupState, ConsumerGroupType, KafkaError, KafkaException, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType as KpConfigResourceType

from test_groups import PARTITIONS, ck_group_consumer, poll_all, produce_all
from test_roundtrip import ck_consume, ck_create_topic, ck_produce, records

TIMEOUT = 30
RETENTION_DEFAULT = "604800000"


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def describe_topic(a: AdminClient, topic: str):
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return a.describe_configs([resource])[resource].result(timeout=TIMEOUT)


def describe_until(a: AdminClient, resource: ConfigResource, name: str, want) -> None:
    """Config changes reach DescribeConfigs through the metadata log: Kafka may answer with the
    previous value for a moment, so poll (bounded) until (value, source) is `want`."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        e = a.describe_configs([resource])[resource].result(timeout=TIMEOUT)[name]
        if (e.value, e.source) == want:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{resource} {name}: (value, source) is {(e.value, e.source)}, expected {want}")
        time.sleep(0.1)


def broker_ids(a: AdminClient) -> list:
    """The brokers in Metadata: one, or three against a cluster (`cargo xtask test --cluster`)."""
    brokers = a.list_topics(timeout=TIMEOUT).brokers
    assert len(brokers) == BROKERS, brokers
    return sorted(brokers)


def broker_id(a: AdminClient) -> int:
    """One broker's id (the lowest)."""
    return broker_ids(a)[0]


# --- configs --------------------------------------------------------------------------------


def test_confluent_kafka_topic_config_round_trip(bootstrap, topic_name):
    a = admin(bootstrap)
    fs = a.create_topics([NewTopic(topic_name, 1, REPLICATION_FACTOR, config={"retention.ms": "86400000"})])
    fs[topic_name].result(timeout=TIMEOUT)

    topic = ConfigResource(ResourceType.TOPIC, topic_name)
    describe_until(a, topic, "retention.ms", ("86400000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value))
    configs = describe_topic(a, topic_name)
    assert not configs["retention.ms"].is_default and not configs["retention.ms"].is_read_only
    e = configs["cleanup.policy"]
    assert e.value == "delete" and e.source == ConfigSource.DEFAULT_CONFIG.value, (e.value, e.source)
    assert configs["segment.ms"].value == RETENTION_DEFAULT
    assert configs["max.message.bytes"].value == "1048588"

    # IncrementalAlterConfigs: SET one, DELETE another (back to the default).
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic_name,
        incremental_configs=[
            ConfigEntry("segment.ms", "3600000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ],
    )
    a.incremental_alter_configs([resource])[resource].result(timeout=TIMEOUT)
    describe_until(a, topic, "segment.ms", ("3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value))
    describe_until(a, topic, "retention.ms", (RETENTION_DEFAULT, ConfigSource.DEFAULT_CONFIG.value))

    # AlterConfigs replaces the whole set: segment.ms reverts to its default.
    resource = ConfigResource(ResourceType.TOPIC, topic_name, set_config={"max.message.bytes": "2000000"})
    a.alter_configs([resource])[resource].result(timeout=TIMEOUT)
    describe_until(a, topic, "max.message.bytes", ("2000000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value))
    describe_until(a, topic, "segment.ms", (RETENTION_DEFAULT, ConfigSource.DEFAULT_CONFIG.value))

    # An invalid value is refused with INVALID_CONFIG and changes nothing.
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic_name,
        incremental_configs=[ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)],
    )
    with pytest.raises(Exception) as info:
        a.incremental_alter_configs([resource])[resource].result(timeout=TIMEOUT)
    assert "INVALID_CONFIG" in str(info.value) or "Invalid value" in str(info.value), info.value
    assert describe_topic(a, topic_name)["retention.ms"].value == RETENTION_DEFAULT


def test_confluent_kafka_broker_config(bootstrap):
    a = admin(bootstrap)
    node = str(broker_id(a))
    resource = ConfigResource(ResourceType.BROKER, node)
    configs = a.describe_configs([resource])[resource].result(timeout=TIMEOUT)
    assert configs["node.id"].value == node, configs["node.id"]
    assert "log.retention.check.interval.ms" in configs
    # A dynamic per-broker change, then its removal.
    set_ = ConfigResource(
        ResourceType.BROKER,
        node,
        incremental_configs=[
            ConfigEntry("log.cleaner.backoff.ms", "12345", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    a.incremental_alter_configs([set_])[set_].result(timeout=TIMEOUT)
    describe_until(a, resource, "log.cleaner.backoff.ms", ("12345", ConfigSource.DYNAMIC_BROKER_CONFIG.value))
    delete = ConfigResource(
        ResourceType.BROKER,
        node,
        incremental_configs=[ConfigEntry("log.cleaner.backoff.ms", None, incremental_operation=AlterConfigOpType.DELETE)],
    )
    a.incremental_alter_configs([delete])[delete].result(timeout=TIMEOUT)
    describe_until(a, resource, "log.cleaner.backoff.ms", ("15000", ConfigSource.DEFAULT_CONFIG.value))


def test_kafka_python_describe_configs(bootstrap, topic_name):
    a = admin(bootstrap)
    fs = a.create_topics([NewTopic(topic_name, 1, REPLICATION_FACTOR, config={"retention.ms": "86400000", "cleanup.policy": "compact"})])
    fs[topic_name].result(timeout=TIMEOUT)
    kp = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        result = kp.describe_configs([KpConfigResource(KpConfigResourceType.TOPIC, topic_name)], config_filter="all")
        configs = find_configs(result, topic_name)
        assert value_of(configs["retention.ms"]) == "86400000"
        assert value_of(configs["cleanup.policy"]) == "compact"
        assert value_of(configs["max.message.bytes"]) == "1048588"
        # Only the two overrides when asked for the modified ones.
        result = kp.describe_configs([KpConfigResource(KpConfigResourceType.TOPIC, topic_name)])
        assert sorted(find_configs(result, topic_name)) == ["cleanup.policy", "retention.ms"]
    finally:
        kp.close()


def find_configs(result, name: str):
    """kafka-python 3 returns {resource_type: {resource_name: {config: data}}}."""
    assert isinstance(result, dict), result
    for by_name in result.values():
        if name in by_name:
            return by_name[name]
    pytest.fail(f"{name} missing from {result}")


def value_of(entry):
    return entry["value"] if isinstance(entry, dict) else entry


# --- DeleteRecords --------------------------------------------------------------------------


def test_confluent_kafka_delete_records(bootstrap, topic_name):
    a = admin(bootstrap)
    ck_create_topic(bootstrap, topic_name, partitions=1)
    recs = records(20)
    ck_produce(bootstrap, topic_name, recs, partition=0)
    tp = TopicPartition(topic_name, 0, 12)
    deleted = a.delete_records([tp])[tp].result(timeout=TIMEOUT)
    assert deleted.low_watermark == 12
    earliest = a.list_offsets({TopicPartition(topic_name, 0): OffsetSpec.earliest()})
    assert next(iter(earliest.values())).result(timeout=TIMEOUT).offset == 12
    latest = a.list_offsets({TopicPartition(topic_name, 0): OffsetSpec.latest()})
    assert next(iter(latest.values())).result(timeout=TIMEOUT).offset == 20
    # A reader from the beginning starts at the new log start offset.
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic_name}-r", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic_name, 0, -2)])  # OFFSET_BEGINNING
    got = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < 8 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(m.offset())
    finally:
        c.close()
    assert got == list(range(12, 20)), got
    # Deleting beyond the high watermark is OFFSET_OUT_OF_RANGE.
    tp = TopicPartition(topic_name, 0, 21)
    with pytest.raises(Exception) as info:
        a.delete_records([tp])[tp].result(timeout=TIMEOUT)
    assert "OFFSET_OUT_OF_RANGE" in str(info.value) or "out of range" in str(info.value).lower(), info.value
    # -1 means "up to the high watermark".
    tp = TopicPartition(topic_name, 0, -1)
    assert a.delete_records([tp])[tp].result(timeout=TIMEOUT).low_watermark == 20
    assert ck_consume(bootstrap, topic_name, 0) == []


# --- consumer-group admin -------------------------------------------------------------------


def test_confluent_kafka_group_admin(bootstrap, topic_name):
    a = admin(bootstrap)
    ck_create_topic(bootstrap, topic_name, partitions=PARTITIONS)
    produce_all(bootstrap, topic_name, 0, 10)
    group = f"{topic_name}-group"
    c = ck_group_consumer(bootstrap, group, "admin-test-member")
    try:
        c.subscribe([topic_name])
        seen = []
        poll_all([c], seen, lambda: len(seen) >= PARTITIONS * 10, "every record")
        c.commit(asynchronous=False)

        # A live group: Stable, one member holding all six partitions.
        listed = a.list_consumer_groups().result(timeout=TIMEOUT)
        mine = [g for g in listed.valid if g.group_id == group]
        assert len(mine) == 1, [g.group_id for g in listed.valid]
        assert mine[0].state == ConsumerGroupState.STABLE and not mine[0].is_simple_consumer_group
        assert mine[0].type == ConsumerGroupType.CLASSIC, mine[0].type
        desc = a.describe_consumer_groups([group])[group].result(timeout=TIMEOUT)
        assert (desc.state, desc.type) == (ConsumerGroupState.STABLE, ConsumerGroupType.CLASSIC), (desc.state, desc.type)
        assert len(desc.members) == 1, desc.members
        m = desc.members[0]
        assert m.client_id == "admin-test-member"
        assert sorted(tp.partition for tp in m.assignment.topic_partitions) == list(range(PARTITIONS))
        assert desc.partition_assignor in ("range", "roundrobin"), desc.partition_assignor
        assert desc.coordinator.id in broker_ids(a)
    finally:
        c.close()

    # Empty after the member left; offsets stay.
    desc = a.describe_consumer_groups([group])[group].result(timeout=TIMEOUT)
    assert desc.state == ConsumerGroupState.EMPTY and desc.members == [], (desc.state, desc.members)
    listed = a.list_consumer_groups(states={ConsumerGroupState.EMPTY}).result(timeout=TIMEOUT)
    assert group in [g.group_id for g in listed.valid]
    listed = a.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(timeout=TIMEOUT)
    assert group not in [g.group_id for g in listed.valid]

    offsets = list_offsets(a, group)
    assert offsets == {(topic_name, p): 10 for p in range(PARTITIONS)}, offsets

    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic_name, p, p) for p in range(PARTITIONS)])
    altered = a.alter_consumer_group_offsets([request])[group].result(timeout=TIMEOUT)
    assert sorted((tp.partition, tp.offset) for tp in altered.topic_partitions) == [(p, p) for p in range(PARTITIONS)]
    for tp in altered.topic_partitions:
        assert tp.error is None, tp.error
    assert list_offsets(a, group) == {(topic_name, p): p for p in range(PARTITIONS)}
    # Only some partitions asked for.
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic_name, 4)])
    got = a.list_consumer_group_offsets([request])[group].result(timeout=TIMEOUT)
    assert [(tp.partition, tp.offset) for tp in got.topic_partitions] == [(4, 4)]

    a.delete_consumer_groups([group])[group].result(timeout=TIMEOUT)
    listed = a.list_consumer_groups().result(timeout=TIMEOUT)
    assert group not in [g.group_id for g in listed.valid]
    assert list_offsets(a, group) == {}
    # Deleting it again: GROUP_ID_NOT_FOUND.
    with pytest.raises(Exception) as info:
        a.delete_consumer_groups([group])[group].result(timeout=TIMEOUT)
    assert "GROUP_ID_NOT_FOUND" in str(info.value) or "does not exist" in str(info.value), info.value


def test_confluent_kafka_delete_live_group_refused(bootstrap, topic_name):
    a = admin(bootstrap)
    ck_create_topic(bootstrap, topic_name, partitions=1)
    group = f"{topic_name}-group"
    c = ck_group_consumer(bootstrap, group, "live-member")
    try:
        c.subscribe([topic_name])
        poll_all([c], [], lambda: len(c.assignment()) == 1, "an assignment")
        with pytest.raises(Exception) as info:
            a.delete_consumer_groups([group])[group].result(timeout=TIMEOUT)
        assert "NON_EMPTY_GROUP" in str(info.value) or "not empty" in str(info.value), info.value
        # Offsets of a group with members can only be committed by its members: the admin
        # client's commit (generation -1, no member id) gets UNKNOWN_MEMBER_ID per partition.
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic_name, 0, 0)])
        try:
            result = a.alter_consumer_group_offsets([request])[group].result(timeout=TIMEOUT)
            errors = [tp.error for tp in result.topic_partitions]
        except KafkaException as e:
            errors = [e.args[0]]
        assert len(errors) == 1 and errors[0] is not None, errors
        assert errors[0].code() == KafkaError.UNKNOWN_MEMBER_ID, errors[0]
    finally:
        c.close()


def list_offsets(a: AdminClient, group: str):
    got = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=TIMEOUT)
    out = {}
    for tp in got.topic_partitions:
        assert tp.error is None, tp.error
        out[(tp.topic, tp.partition)] = tp.offset
    return out
