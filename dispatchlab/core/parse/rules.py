"""The rules every extractor reads, compiled with the extra patterns into one multi-pattern scanner."""

from __future__ import annotations

from functools import lru_cache

from dispatchlab.core.parse.extra import ExtraPatterns
from dispatchlab.core.parse.extract import Extractor
from dispatchlab.core.parse.extract.arguments import Arguments
from dispatchlab.core.parse.extract.backends import Backends
from dispatchlab.core.parse.extract.coredump import CoreDump
from dispatchlab.core.parse.extract.environment import Environment
from dispatchlab.core.parse.extract.failures import Failures
from dispatchlab.core.parse.extract.generated import Generated
from dispatchlab.core.parse.extract.milestones import Milestones
from dispatchlab.core.parse.extract.servers import ServerMentions
from dispatchlab.core.parse.framelines import frame_plans
from dispatchlab.core.parse.scanner import Scanner

# the order extractors see a line in: server mentions (they never claim a line), arguments (a dump line is
# nothing else), failures last
EXTRACTORS: tuple[type[Extractor], ...] = (
    ServerMentions,
    CoreDump,
    Arguments,
    Environment,
    Milestones,
    Backends,
    Generated,
    Failures,
)
RULES: dict[str, str] = {name: rule for cls in EXTRACTORS for name, rule in cls.RULES.items()}
# Hyperscan's cheaper stand-ins for rules it scans slowly (see scanner.py)
GATES: dict[str, str] = {name: gate for cls in EXTRACTORS for name, gate in getattr(cls, "GATES", {}).items()}
# rules a big log reads in some stretches only (chunkscan.SAMPLED_STRETCH_BYTES), with what each looks for
SAMPLED: dict[str, str] = {
    name: what for cls in EXTRACTORS for name, what in getattr(cls, "SAMPLED", {}).items()
}
WANTS = {cls: frozenset(cls.RULES) | cls.READS for cls in EXTRACTORS}  # the rules each extractor reads


class CompiledRules:
    """The rules of every extractor plus the extra patterns, in one multi-pattern scanner."""

    def __init__(self, extra: ExtraPatterns) -> None:
        self.names = list(RULES)
        self.extra = extra
        self.scanner = Scanner(
            [*RULES.values(), *extra.patterns],
            [GATES.get(name) for name in self.names],
            [index for index, name in enumerate(self.names) if name in SAMPLED],
        )
        self.rule_count = len(self.names)
        self.frame_plans = frame_plans(self.names)


@lru_cache(maxsize=8)
def compiled_rules(extra: ExtraPatterns) -> CompiledRules:
    # compiling the multi-pattern database takes a moment: reuse it across logs (workers parse many)
    return CompiledRules(extra)
