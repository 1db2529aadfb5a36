"""The embedded broker: kombu's filesystem transport, made safe for a separate worker process.

kombu's own `_put` creates the message file and then writes it, so a consumer polling at that moment
can take an empty file and lose the message; and `_get` moves taken messages to the system temporary
folder, a copy across file systems. Here a message is written under a name consumers ignore and
renamed into place (atomic on one file system), and a consumer takes it with one rename into the
broker's own `processed` folder. Used when DISPATCHLAB_BROKER_URL starts with filesystem://
(dispatchlab.messaging.broker).
"""

from __future__ import annotations

import os
import uuid
from queue import Empty
from time import monotonic
from typing import Any

from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".part"  # "<...>.<queue>.msg.part" is no queue's message
        try:
            with open(partial, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as error:
            raise filesystem.ChannelError(f"Cannot add file {final!r} to directory") from error

    def _get(self, queue: str) -> Any:
        wanted = f"{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            taken = os.path.join(self.processed_folder, name)
            try:
                # One rename: of several consumers, exactly one gets the file.
                os.rename(os.path.join(self.data_folder_in, name), taken)
            except OSError:
                continue
            try:
                with open(taken, "rb") as handle:
                    payload = handle.read()
            finally:
                if not self.store_processed:
                    os.remove(taken)
            return loads(bytes_to_str(payload))
        raise Empty()


class Transport(filesystem.Transport):
    Channel = Channel
