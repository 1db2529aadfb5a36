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

DEFAULT_BROKER_URL = "filesystem://localhost/"
FILESYSTEM_TRANSPORT = "dispatchlab.messaging.transport:Transport"


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
    if url.startswith(("redis://", "rediss://")) and visibility_timeout:
        # An unacknowledged (acks_late) message comes back after this long.
        return BrokerConfig(url=url, transport_options={"visibility_timeout": visibility_timeout})
    return BrokerConfig(url=url)
