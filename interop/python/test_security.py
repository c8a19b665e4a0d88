"""kafka-python against the secured broker that `cargo xtask test` starts beside the plaintext one
(issue 13; its endpoints, CA and users come in GREGOR_SASL_PLAINTEXT_BOOTSTRAP, GREGOR_SSL_BOOTSTRAP,
GREGOR_CA, ... see interop/README.md): SASL_PLAINTEXT with PLAIN and SCRAM-SHA-256 (admin, produce,
consume), a wrong password failing with kafka-python's authentication error, SSL with a CA file,
mTLS with a client certificate, and an untrusted CA refused. Runs without a secured broker (the
3-node cluster run) skip these tests."""

import os
import ssl
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, KafkaTimeoutError, SaslAuthenticationFailedError

DEADLINE_S = 60


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.skip(f"{name} is not set: no secured broker in this run")
    return value


def sasl(mechanism: str, password: str | None = None) -> dict:
    """kafka-python's settings for the SASL_PLAINTEXT listener with `mechanism`."""
    prefix = "GREGOR_PLAIN" if mechanism == "PLAIN" else "GREGOR_SCRAM256"
    return {
        "bootstrap_servers": env("GREGOR_SASL_PLAINTEXT_BOOTSTRAP"),
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": env(f"{prefix}_USER"),
        "sasl_plain_password": password if password is not None else env(f"{prefix}_PASSWORD"),
    }


def tls(listener: str, ca: str = "GREGOR_CA", client_cert: bool = False) -> dict:
    config = {
        "bootstrap_servers": env(listener),
        "security_protocol": "SSL",
        "ssl_cafile": env(ca),
    }
    if client_cert:
        config["ssl_certfile"] = env("GREGOR_CLIENT_CERT")
        config["ssl_keyfile"] = env("GREGOR_CLIENT_KEY")
    return config


def round_trip(config: dict, topic: str, create: bool = True) -> None:
    """Creates `topic` with the admin client (unless told not to), produces 10 keyed records and
    reads them back from offset 0, all with `config`."""
    if create:
        admin = KafkaAdminClient(**config, request_timeout_ms=30000)
        try:
            admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
            deadline = time.monotonic() + DEADLINE_S
            while topic not in admin.list_topics():
                assert time.monotonic() < deadline, f"{topic} not listed"
                time.sleep(0.1)
            [described] = admin.describe_topics([topic])
            assert described["error_code"] == 0, described
            assert len(described["partitions"]) == 1, described
        finally:
            admin.close()
    producer = KafkaProducer(**config, acks="all")
    try:
        for i in range(10):
            producer.send(topic, key=f"k-{i}".encode(), value=f"v-{i}".encode(), partition=0).get(timeout=DEADLINE_S)
    finally:
        producer.close()
    consumer = KafkaConsumer(**config, enable_auto_commit=False, consumer_timeout_ms=1000)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got = []
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < 10 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((r.offset, r.key, r.value) for r in records)
        assert got == [(i, f"k-{i}".encode(), f"v-{i}".encode()) for i in range(10)]
    finally:
        consumer.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_sasl_plaintext_admin_produce_consume(mechanism, topic_name):
    round_trip(sasl(mechanism), topic_name)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_sasl_wrong_password_fails(mechanism):
    """No admin client with a wrong password. kafka-python 3.0.12 retries a failed login until its
    bootstrap deadline and then raises KafkaTimeoutError ("Unable to bootstrap"), against Kafka 4.4
    as against gregor; older releases raised SaslAuthenticationFailedError at once. The same
    settings with the right password work (the test above)."""
    start = time.monotonic()
    with pytest.raises((SaslAuthenticationFailedError, KafkaTimeoutError)) as failure:
        admin = KafkaAdminClient(**sasl(mechanism, password="not-the-password"), request_timeout_ms=10000)
        admin.close()
    assert time.monotonic() - start < DEADLINE_S, "the failure took too long"
    if isinstance(failure.value, KafkaTimeoutError):
        assert "Unable to bootstrap" in str(failure.value), failure.value


def test_ssl_with_a_ca_file(topic_name):
    round_trip(tls("GREGOR_SSL_BOOTSTRAP"), topic_name)


def test_mtls_with_a_client_certificate(topic_name):
    round_trip(tls("GREGOR_MTLS_BOOTSTRAP", client_cert=True), topic_name)


def test_untrusted_ca_fails():
    """A CA that did not sign the broker's certificate: the handshake fails, no broker is usable."""
    with pytest.raises((KafkaError, ssl.SSLError)) as failure:
        admin = KafkaAdminClient(**tls("GREGOR_SSL_BOOTSTRAP", ca="GREGOR_UNTRUSTED_CA"), request_timeout_ms=10000)
        admin.close()
    print(f"refused: {failure.value!r}")
