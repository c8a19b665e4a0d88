"""Shared fixtures: the broker under test comes from GREGOR_BOOTSTRAP (set by `cargo xtask test`)."""

import os
import re
import uuid

import pytest

# Replication factor of the topics the tests create: 3 against a 3-node cluster
# (`cargo xtask test --cluster`), 1 against one broker.
REPLICATION_FACTOR = int(os.environ.get("GREGOR_REPLICATION_FACTOR", "1"))
# Brokers in the cluster under test.
BROKERS = int(os.environ.get("GREGOR_BROKERS", "1"))


@pytest.fixture(scope="session")
def bootstrap() -> str:
    value = os.environ.get("GREGOR_BOOTSTRAP")
    if not value:
        pytest.fail("GREGOR_BOOTSTRAP is not set: run the suite through `cargo xtask test`")
    return value


@pytest.fixture
def topic_name(request) -> str:
    """A fresh topic name per test, so tests never see each other's records."""
    name = re.sub(r"[^A-Za-z0-9.-]+", "-", request.node.name).strip("-")[:60]
    return f"interop-py-{name}-{uuid.uuid4().hex[:8]}"


def records(n: int):
    """The records every scenario produces: keyed, valued and with two headers each."""
    return [
        (
            f"key-{i}".encode(),
            f"value-{i}-{'x' * (i % 17)}".encode(),
            [("seq", str(i).encode()), ("origin", b"interop-python")],
        )
        for i in range(n)
    ]
