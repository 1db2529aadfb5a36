"""A crash loop's start lines, held instead of read.

Past 20 runs a run that repeats the run before it is replayed from that run's record (scan.py), but its start
line (an arguments dump: 15 KB to parse, a launch command, a version banner) was read every time, most of a
crash loop's parse. A start line that is one read in the loop before but for its digits' values is held: its
run starts as a replayed run starts, the file's counts it would add (the server votes, the warnings) are
the ones reading the last such line added, and the line is read after all when its run turns out to be no
repeat (or is the file's last). Reading it may only have added to those counts: a start line whose reading
changed anything else the file keeps (a version, the launch command, the GPU) is read each time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatchlab.core.parse.chunkscan import ONE_DIGIT
from dispatchlab.core.records import record

if TYPE_CHECKING:
    from dispatchlab.core.parse.chunkscan import ChunkScan
    from dispatchlab.core.parse.observations import Observations

HOLD_STARTS = True  # tests turn it off to compare


def shape_of(raw: bytes) -> bytes:
    """A line with every digit where it is, whatever its value: a hit's key drops its digits, so `attempt 999`
    and `attempt 1000` share one, but a longer launch command is the one the file keeps."""
    return raw.translate(ONE_DIGIT)


@record(frozen=True)
class StartEffect:
    """What reading one start line added to the file's counts, and that line's shape."""

    shape: bytes
    votes: dict[str, int]
    warnings: int

    def holds(self, raw: bytes) -> bool:
        """Whether a start line may be held on what reading this one did: the same line but for its digits'
        values (the same length, the same digits where they are)."""
        return len(raw) == len(self.shape) and shape_of(raw) == self.shape


def file_facts(obs: Observations) -> tuple[object, ...]:
    """What the file keeps across runs, but for its counts, its timeline and the runs' own records: a start
    line held must leave all of it as reading it would."""
    return (
        obs.year,
        tuple((server, len(mentions)) for server, mentions in obs.server_mentions.items()),
        tuple(obs.versions.items()),
        obs.launch_command,
        tuple(obs.launch_args.items()),
        tuple(obs.gpu_names.items()),
        tuple(obs.gpu_ccs.items()),
        obs.rocm,
        obs.arch,
        obs.arch_strength,
        obs.arch_gpu_name,
        len(obs.nccl_transports),
        obs.metric_total,
        len(obs.metric_points),
        obs.last_metric_line,
        len(obs.sources),
    )


def lone_hit(scan: ChunkScan, number: int) -> bool:
    """Whether a hit was sent with no lines around it (no dump read on past it, no line before it that names
    its process)."""
    if number in scan.context:
        return False
    repeats = scan.repeats
    if repeats is not None and repeats.first_hit <= number < repeats.first_hit + repeats.count:
        return not repeats.previous[(number - repeats.first_hit) % len(repeats.previous)]
    return True
