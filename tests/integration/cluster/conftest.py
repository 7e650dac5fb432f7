"""One local Ray cluster of two simulated nodes (``ray.cluster_utils.Cluster``) for every Ray test of this package.

Node A (custom resource ``node_a``: 2): the trainer ranks and a rollout worker; node B (``node_b``: 1): the engine
and a rollout worker. The CPU counts make Ray spread the two rollout workers over both nodes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests._require import missing


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[Any]:
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError as e:
        missing("ray", f"import failed ({e}); run `bash scripts/setup.sh`")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    mem = 100 * 2**20
    cluster = Cluster(
        initialize_head=True,
        head_node_args=dict(num_cpus=3, resources={"node_a": 2}, include_dashboard=False, object_store_memory=mem),
    )
    cluster.add_node(num_cpus=2, resources={"node_b": 1}, object_store_memory=mem)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="sao")
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
