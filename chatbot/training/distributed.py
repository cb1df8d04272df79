"""Training across machines: reading `TF_CONFIG`, this worker's role, and where it writes.

Owns: `ClusterRole` (this process's place in the cluster `TF_CONFIG` describes, checked once so a bad value
is one clear error), `multi_worker_strategy` (made before any TensorFlow op runs in the process, as
collective ops require), and `worker_out_dir` (only the chief writes the model directory; every other worker
trains into a hidden sibling of its own that the CLI removes once done, as in TensorFlow's multi-worker
tutorial, so a shared filesystem is safe).
Must not import TensorFlow at module level: the CLI reads TF_CONFIG before TensorFlow loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ClusterRole:
    task_type: str
    index: int
    workers: int  # chief included
    has_chief: bool = False

    @property
    def is_chief(self) -> bool:
        """The chief, or worker 0 of a cluster without one (TensorFlow's rule)."""
        return self.task_type == "chief" or (self.task_type == "worker" and self.index == 0 and not self.has_chief)


def read_tf_config(environ) -> ClusterRole:
    """This process's role from `environ["TF_CONFIG"]`. Raises ValueError saying what is wrong."""
    raw = environ.get("TF_CONFIG", "")
    if not raw.strip():
        raise ValueError("--strategy multi-worker needs TF_CONFIG: "
                         '{"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": "worker", "index": 0}}')
    try:
        config = json.loads(raw)
        cluster, task = config["cluster"], config["task"]
        task_type, index = task["type"], task["index"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"TF_CONFIG is not a cluster description ({type(error).__name__}: {error}); expected "
                         '{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": 0}}') from None
    if not isinstance(cluster, dict) or task_type not in ("chief", "worker") or task_type not in cluster:
        raise ValueError(f"TF_CONFIG: task type {task_type!r} must be chief or worker and listed in its cluster")
    hosts = cluster[task_type]
    if not isinstance(index, int) or isinstance(index, bool) or not isinstance(hosts, list) or \
            not 0 <= index < len(hosts):
        raise ValueError(f"TF_CONFIG: task index {index!r} is not one of the {task_type} addresses listed")
    for address in [*cluster.get("chief", []), *cluster.get("worker", [])]:
        host, _, port = str(address).rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"TF_CONFIG: {address!r} is not a host:port address")
    workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    return ClusterRole(task_type, index, workers, has_chief=bool(cluster.get("chief")))


def multi_worker_strategy():
    """`MultiWorkerMirroredStrategy` over TF_CONFIG's cluster: call it before anything else uses TensorFlow."""
    import tensorflow as tf

    return tf.distribute.MultiWorkerMirroredStrategy()


def worker_out_dir(out: Path, role: ClusterRole | None) -> Path:
    """Where this worker writes: `out` for the chief (or a single process), else a hidden sibling of its own."""
    if role is None or role.is_chief:
        return out
    return out.parent / f".{out.name}.{role.task_type}-{role.index}"
