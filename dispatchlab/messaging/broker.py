"""The broker configuration both sides derive from DISPATCHLAB_BROKER_URL and DISPATCHLAB_DATA_DIR.

The default is kombu's filesystem transport in `<data dir>/broker`, so a GPU worker started on the
same machine as the devserver (or given the same DISPATCHLAB_DATA_DIR) finds the dashboard's queues
without a broker server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kombu.transport import redis as kombu_redis

DEFAULT_BROKER_URL = "filesystem://localhost/"
FILESYSTEM_TRANSPORT = "dispatchlab.messaging.transport:Transport"
REDIS_TRANSPORT = "dispatchlab.messaging.broker:RedisTransport"


def default_data_dir() -> Path:
    # The checkout's var/ (an editable install), as the dashboard's settings use it.
    return Path(__file__).resolve().parent.parent.parent / "var"


def data_dir_from_env() -> Path:
    return Path(os.environ.get("DISPATCHLAB_DATA_DIR") or default_data_dir()).resolve()


@dataclass(frozen=True)
class BrokerConfig:
    url: str
    transport: str | None = None
    transport_options: dict[str, Any] = field(default_factory=dict)


def broker_config(
    *, url: str, data_dir: Path, poll_seconds: float = 0.05, visibility_timeout: int | None = None
) -> BrokerConfig:
    if url.startswith("filesystem://"):
        folder = data_dir / "broker"
        for name in ("queue", "processed", "control"):
            (folder / name).mkdir(parents=True, exist_ok=True)
        return BrokerConfig(
            url=url,
            transport=FILESYSTEM_TRANSPORT,
            transport_options={
                "data_folder_in": str(folder / "queue"),
                "data_folder_out": str(folder / "queue"),
                "processed_folder": str(folder / "processed"),
                "control_folder": str(folder / "control"),
                "store_processed": False,
                "polling_interval": poll_seconds,
            },
        )
    if url.startswith(("redis://", "rediss://")):
        # An unacknowledged (acks_late) message comes back after this long.
        options = {"visibility_timeout": visibility_timeout} if visibility_timeout else {}
        # rediss:// keeps kombu's own class: kombu turns TLS on from that scheme name.
        transport = REDIS_TRANSPORT if url.startswith("redis://") else None
        return BrokerConfig(url=url, transport=transport, transport_options=options)
    return BrokerConfig(url=url)


# Where the README and the hosts page tell a GPU worker to join: one definition, so they name the same
# commands ("dashboard" stands for the dashboard machine's address as the GPU host reaches it).
WORKER_COMMAND = "python -m worker serve"
SHARED_REDIS_URL = "redis://dashboard:6379/0"
DASHBOARD_ON_REDIS = f"DISPATCHLAB_BROKER_URL={SHARED_REDIS_URL} python -m dispatchlab.devserver"
WORKER_ON_REDIS = f"DISPATCHLAB_BROKER_URL={SHARED_REDIS_URL} {WORKER_COMMAND}"


@dataclass(frozen=True)
class WorkerStart:
    """How a GPU worker joins a dashboard's broker: where the command runs, and the command."""

    where: str
    command: str


def worker_starts(*, url: str, data_dir: Path) -> list[WorkerStart]:
    """The commands that start a GPU worker on the broker `url` (the dashboard's), most direct first.
    A password in the URL is never shown."""
    if url.startswith("filesystem://"):
        same_dir = data_dir.resolve() == default_data_dir().resolve()
        here = WORKER_COMMAND if same_dir else f"DISPATCHLAB_DATA_DIR={data_dir} {WORKER_COMMAND}"
        return [
            WorkerStart(
                "on this machine, from the same checkout (its broker is the folder "
                f"{data_dir / 'broker'}, which no other machine can join)",
                here,
            ),
            WorkerStart(
                "for a GPU host elsewhere, first start the dashboard on a Redis that host reaches",
                DASHBOARD_ON_REDIS,
            ),
            WorkerStart("then, on the GPU host", WORKER_ON_REDIS),
        ]
    if url.startswith(("redis://", "rediss://")):
        scheme, _, rest = url.partition("://")
        credentials, at, location = rest.rpartition("@")
        if at and ":" in credentials:
            location = f"{credentials.partition(':')[0]}:PASSWORD@{location}"
        elif at:
            location = f"{credentials}@{location}"
        return [
            WorkerStart(
                "on the GPU host (it must reach this Redis by that address)",
                f"DISPATCHLAB_BROKER_URL={scheme}://{location} {WORKER_COMMAND}",
            )
        ]
    return [
        WorkerStart(
            "on the GPU host, with this dashboard's broker URL",
            f"DISPATCHLAB_BROKER_URL=... {WORKER_COMMAND}",
        )
    ]


class _RedisChannel(kombu_redis.Channel):
    """kombu's Redis channel, made closable after Redis went away.

    When Redis drops while a worker holds an unacknowledged message (an acks_late task running, or
    an ETA/countdown retry waiting), Celery's consumer calls `connection.collect()`, which detaches
    the transport from its `Connection` (`transport.client = None`), then `connection.close()`. That
    closes the channel, whose QoS tries to give the held messages back to Redis, so it builds a new
    connection pool from `self.connection.client.hostname` and kombu 5.7 raises AttributeError on the
    None. An AttributeError is not a connection error, so the worker exits ("Unrecoverable error").
    Here the missing client is what it really is, a lost connection: kombu ignores it while closing,
    and Celery reconnects. The held messages are not lost: Redis keeps each delivered message in
    its unacked hash until it is acknowledged, and gives it back after the visibility timeout (beat's
    `reports.requeue_stale` re-sends a stuck report sooner).
    """

    def _get_pool(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None:
            from redis.exceptions import ConnectionError as RedisConnectionError

            raise RedisConnectionError("the connection to Redis was lost and has been closed")
        return super()._get_pool(asynchronous=asynchronous)  # type: ignore[no-untyped-call]


class RedisTransport(kombu_redis.Transport):
    Channel = _RedisChannel
