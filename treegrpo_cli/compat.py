"""Import guards for optional third-party stacks.

The PyPI torchvision wheel is a CUDA build; on CPU torch its import fails while registering fake
kernels for two ops whose schemas were never defined (deps-and-weights.md, section 2). open_clip,
timm and several transformers model classes import torchvision, so everything that touches them
calls `ensure_torchvision()` first: it defines the two schemas and imports again. A torchvision
that matches its torch imports on the first try and is left alone.
"""

from __future__ import annotations

import importlib
import sys

import torch

_TORCHVISION_OPS = None  # the schemas' torch.library.Library, alive for the whole process


def ensure_torchvision() -> bool:
    """Make `import torchvision` work if torchvision is installed; False when it is not."""
    global _TORCHVISION_OPS
    try:
        importlib.import_module("torchvision")
        return True
    except ImportError:
        return False
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
    for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
        del sys.modules[name]
    if _TORCHVISION_OPS is None:
        _TORCHVISION_OPS = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            _TORCHVISION_OPS.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    importlib.import_module("torchvision")
    return True
