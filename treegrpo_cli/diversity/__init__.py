"""Sample-distribution checks: KID and MMD^2 between two image sets in several feature spaces.

kernels.py    polynomial / Gaussian kernels, unbiased MMD^2, KID over subsets, permutation test
features.py   feature extractors (inception, clip, efficientnet, pixels) and batched extraction
inception.py  the FID Inception-v3 network
io.py         image sets: a folder of images or the leaves of a tree folder; generating one
report.py     compare(): the statistics of every feature space, report.json and the PCA plot
"""

from .features import FEATURES, get_extractor, parse_features
from .io import ImageSet, generate_set, open_images
from .report import DiversityConfig, compare, embedding_png

__all__ = [
    "FEATURES",
    "DiversityConfig",
    "ImageSet",
    "compare",
    "embedding_png",
    "generate_set",
    "get_extractor",
    "open_images",
    "parse_features",
]
