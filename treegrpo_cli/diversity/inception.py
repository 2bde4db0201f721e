"""The FID Inception-v3 (Szegedy et al. 2016, arXiv 1512.00567) as the FID weights file expects it.

pt_inception-2015-12-05-6726825d.pth is pytorch-fid's conversion of the TF 2015-12-05 graph into
torchvision's Inception3 layout; the parameter names and shapes here are torchvision's (checked
against torchvision 0.28's Inception3 without AuxLogits; the file's fc layer is not used). The TF
graph differs from torchvision's network in its pooling: average pools ignore the padding and the
last block max-pools. Input: 299 px bilinear resize, scaled to [-1, 1] (as pytorch-fid). Output:
the 2048-d pool3 features.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class _Conv(nn.Module):
    """Conv (no bias) -> BatchNorm (eps 1e-3) -> ReLU."""

    def __init__(self, cin: int, cout: int, k: int | tuple[int, int], s: int = 1, p: int | tuple[int, int] = 0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, p, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.bn(self.conv(x)))


def _avg(x: Tensor) -> Tensor:
    return F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)


def _seq(*convs: nn.Module) -> Callable[[Tensor], Tensor]:
    def run(x: Tensor) -> Tensor:
        for c in convs:
            x = c(x)
        return x

    return run


class _A(nn.Module):  # Mixed_5b..5d: 64 + 64 + 96 + pool channels
    def __init__(self, cin: int, pool: int):
        super().__init__()
        self.branch1x1 = _Conv(cin, 64, 1)
        self.branch5x5_1, self.branch5x5_2 = _Conv(cin, 48, 1), _Conv(48, 64, 5, p=2)
        self.branch3x3dbl_1, self.branch3x3dbl_2 = _Conv(cin, 64, 1), _Conv(64, 96, 3, p=1)
        self.branch3x3dbl_3, self.branch_pool = _Conv(96, 96, 3, p=1), _Conv(cin, pool, 1)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat(
            [
                self.branch1x1(x),
                _seq(self.branch5x5_1, self.branch5x5_2)(x),
                _seq(self.branch3x3dbl_1, self.branch3x3dbl_2, self.branch3x3dbl_3)(x),
                self.branch_pool(_avg(x)),
            ],
            1,
        )


class _B(nn.Module):  # Mixed_6a: 288 -> 768, stride 2
    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3 = _Conv(cin, 384, 3, s=2)
        self.branch3x3dbl_1, self.branch3x3dbl_2 = _Conv(cin, 64, 1), _Conv(64, 96, 3, p=1)
        self.branch3x3dbl_3 = _Conv(96, 96, 3, s=2)

    def forward(self, x: Tensor) -> Tensor:
        dbl = _seq(self.branch3x3dbl_1, self.branch3x3dbl_2, self.branch3x3dbl_3)(x)
        return torch.cat([self.branch3x3(x), dbl, F.max_pool2d(x, 3, 2)], 1)


class _C(nn.Module):  # Mixed_6b..6e: 768 -> 768 with factorised 7x7 convolutions
    def __init__(self, cin: int, c7: int):
        super().__init__()

        def row(i: int, o: int) -> _Conv:  # 1x7
            return _Conv(i, o, (1, 7), p=(0, 3))

        def col(i: int, o: int) -> _Conv:  # 7x1
            return _Conv(i, o, (7, 1), p=(3, 0))

        self.branch1x1, self.branch_pool = _Conv(cin, 192, 1), _Conv(cin, 192, 1)
        self.branch7x7_1, self.branch7x7_2, self.branch7x7_3 = (
            _Conv(cin, c7, 1),
            row(c7, c7),
            col(c7, 192),
        )
        self.branch7x7dbl_1, self.branch7x7dbl_2 = _Conv(cin, c7, 1), col(c7, c7)
        self.branch7x7dbl_3, self.branch7x7dbl_4 = row(c7, c7), col(c7, c7)
        self.branch7x7dbl_5 = row(c7, 192)

    def forward(self, x: Tensor) -> Tensor:
        b7 = _seq(self.branch7x7_1, self.branch7x7_2, self.branch7x7_3)(x)
        d7 = _seq(
            self.branch7x7dbl_1, self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4, self.branch7x7dbl_5
        )(x)
        return torch.cat([self.branch1x1(x), b7, d7, self.branch_pool(_avg(x))], 1)


class _D(nn.Module):  # Mixed_7a: 768 -> 1280, stride 2
    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3_1, self.branch3x3_2 = _Conv(cin, 192, 1), _Conv(192, 320, 3, s=2)
        self.branch7x7x3_1, self.branch7x7x3_2 = _Conv(cin, 192, 1), _Conv(192, 192, (1, 7), p=(0, 3))
        self.branch7x7x3_3, self.branch7x7x3_4 = _Conv(192, 192, (7, 1), p=(3, 0)), _Conv(192, 192, 3, s=2)

    def forward(self, x: Tensor) -> Tensor:
        b3 = _seq(self.branch3x3_1, self.branch3x3_2)(x)
        b7 = _seq(self.branch7x7x3_1, self.branch7x7x3_2, self.branch7x7x3_3, self.branch7x7x3_4)(x)
        return torch.cat([b3, b7, F.max_pool2d(x, 3, 2)], 1)


class _E(nn.Module):  # Mixed_7b, 7c: -> 2048; the last one max-pools (TF graph)
    def __init__(self, cin: int, max_pool: bool):
        super().__init__()
        self.max_pool = max_pool
        self.branch1x1, self.branch_pool = _Conv(cin, 320, 1), _Conv(cin, 192, 1)
        self.branch3x3_1 = _Conv(cin, 384, 1)
        self.branch3x3_2a, self.branch3x3_2b = _Conv(384, 384, (1, 3), p=(0, 1)), _Conv(384, 384, (3, 1), p=(1, 0))
        self.branch3x3dbl_1, self.branch3x3dbl_2 = _Conv(cin, 448, 1), _Conv(448, 384, 3, p=1)
        self.branch3x3dbl_3a, self.branch3x3dbl_3b = (
            _Conv(384, 384, (1, 3), p=(0, 1)),
            _Conv(384, 384, (3, 1), p=(1, 0)),
        )

    def forward(self, x: Tensor) -> Tensor:
        b = self.branch3x3_1(x)
        d = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        pool = F.max_pool2d(x, 3, 1, 1) if self.max_pool else _avg(x)
        return torch.cat(
            [
                self.branch1x1(x),
                self.branch3x3_2a(b),
                self.branch3x3_2b(b),
                self.branch3x3dbl_3a(d),
                self.branch3x3dbl_3b(d),
                self.branch_pool(pool),
            ],
            1,
        )


class FIDInceptionV3(nn.Module):
    """[N, 3, H, W] in [0, 1] -> [N, 2048] pool3 features."""

    # [N, 3, 299, 299] -> 1a [32, 149, 149] -> 2a [32, 147, 147] -> 2b [64, 147, 147] -> max [64, 73, 73]
    # -> 3b [80, 73, 73] -> 4a [192, 71, 71] -> max [192, 35, 35] -> 5b..5d [288, 35, 35] -> 6a..6e
    # [768, 17, 17] -> 7a [1280, 8, 8] -> 7b, 7c [2048, 8, 8]
    ORDER = (
        "Conv2d_1a_3x3",
        "Conv2d_2a_3x3",
        "Conv2d_2b_3x3",
        "max",
        "Conv2d_3b_1x1",
        "Conv2d_4a_3x3",
        "max",
        "Mixed_5b",
        "Mixed_5c",
        "Mixed_5d",
        "Mixed_6a",
        "Mixed_6b",
        "Mixed_6c",
        "Mixed_6d",
        "Mixed_6e",
        "Mixed_7a",
        "Mixed_7b",
        "Mixed_7c",
    )

    def __init__(self):
        super().__init__()
        self.Conv2d_1a_3x3, self.Conv2d_2a_3x3 = _Conv(3, 32, 3, s=2), _Conv(32, 32, 3)
        self.Conv2d_2b_3x3, self.Conv2d_3b_1x1, self.Conv2d_4a_3x3 = (
            _Conv(32, 64, 3, p=1),
            _Conv(64, 80, 1),
            _Conv(80, 192, 3),
        )
        self.Mixed_5b, self.Mixed_5c, self.Mixed_5d = _A(192, 32), _A(256, 64), _A(288, 64)
        self.Mixed_6a = _B(288)
        self.Mixed_6b, self.Mixed_6c, self.Mixed_6d, self.Mixed_6e = (
            _C(768, 128),
            _C(768, 160),
            _C(768, 160),
            _C(768, 192),
        )
        self.Mixed_7a, self.Mixed_7b, self.Mixed_7c = _D(768), _E(1280, False), _E(2048, True)

    def forward(self, x: Tensor) -> Tensor:
        x = F.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False) * 2 - 1  # [N, 3, 299, 299]
        for name in self.ORDER:
            x = F.max_pool2d(x, 3, 2) if name == "max" else getattr(self, name)(x)
        return x.mean((2, 3))  # [N, 2048, 8, 8] -> [N, 2048]
