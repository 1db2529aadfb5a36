"""torchvision shim for a CPU-only SGLang venv (installed by bench/sglang_cpu_env.sh).

PyPI's torchvision wheels are CUDA builds; beside the CPU torch their compiled ops
(_C.so) cannot load, and `import torchvision` then dies in _meta_registrations with
`RuntimeError: operator torchvision::nms does not exist`.  SGLang imports
torchvision.transforms at start-up (sglang.srt.configs -> multimodal utils), so the
launch dies before serving anything.

This module is activated by `sglang_cpu_tvshim.pth` in site-packages.  It is lazy:
only when something imports `torchvision` does it import torch and declare the two op
schemas (`torchvision::nms`, `torchvision::qnms`), so that `import torchvision`
succeeds without its C++ ops, as on a CPU build.  No SGLang or torchvision file is
changed, and python processes that never import torchvision (pip, ...) pay nothing.
"""

import importlib.abc
import sys

_done = False


def _declare_ops():
    global _done
    if _done:
        return
    _done = True
    try:
        from importlib.metadata import version

        if "+cpu" in version("torchvision"):
            return  # a real CPU build registers its own ops
    except Exception:
        pass
    import torch

    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    globals()["_lib"] = lib  # keep the Library alive


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            _declare_ops()
        return None  # let the normal finders load torchvision


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
