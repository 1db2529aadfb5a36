"""The core must stay importable without the web or GPU stacks: the CLI and the GPU worker rely on it."""

import subprocess
import sys

FORBIDDEN = ("django", "celery", "kombu", "pynvml", "sglang", "torch", "redis", "plotly", "pygments")


def test_importing_the_core_pulls_in_no_framework_or_gpu_library():
    code = (
        "import sys\n"
        "import dispatchlab.core, dispatchlab.core.cli, dispatchlab.core.matching, dispatchlab.core.evaluate\n"
        "import dispatchlab.core.signatures.lint, dispatchlab.core.signatures.examples, dispatchlab.core.summary\n"
        "from dispatchlab.core import analyze_paths\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {name.split(".")[0] for name in result.stdout.split()}
    assert not (loaded & set(FORBIDDEN)), f"core imported {sorted(loaded & set(FORBIDDEN))}"
