"""Trees, rewards and advantages on disk (see docs/format.md).

    trees-NNNNN       the Tree tensors + leaf_image [L, 3, H, W] uint8; meta: prompts, tree_offset, nfe,
                      prompt_meta (each prompt's metadata, when it has any)
    rewards-NNNNN     reward/<name> [N] float32 (NaN on internal nodes), reward [N] (weighted sum)
    advantages-NNNNN  advantage [N], valid [N], trained [N], fused [N], leaf_advantage [N]

Scoring writes its own shards beside the trees, so it never rewrites latents. A rewards or advantages
shard records the sha256 of the trees shard it scores (`trees_sha256` in its metadata): one copied in
from another tree folder is refused when read, and reading an advantages shard checks its rewards shard
too (the two are written together).

`open_trees` validates index.json as a whole before anything is read: the shard entries (shards.py),
their names and roles, and the types of the meta fields the commands use.

A folder is whole when its writers finished: `rollout` writes meta.complete false first and true last, and
`score` records meta.scoring_pass (its command) before it removes any earlier scores and replaces it with
meta.scoring after the last scores shard. Readers refuse anything else in one line naming the command to run
again; the same `rollout` command replaces its own killed folder, and `score` rescoring is always allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..engine.prompt import Prompt, prompt_meta
from ..engine.tree import Tree
from ..errors import CorruptFileError, TreegrpoError, shown
from .shards import INDEX, ShardStore, kind_of

KIND = "trees"
SCORES = ("rewards", "advantages")  # written by `score` beside the trees shard of the same number
TREES_SHA = "trees_sha256"  # in a rewards or advantages shard's metadata: the trees shard it scores
_ROLE_NAME = re.compile(r"(trees|rewards|advantages)-(\d{5,})\Z")
IMAGES = "images"  # rollout --save-images: the leaf PNGs and their prompts.json
_LEAF_PNG = re.compile(r"p\d+-[a-z0-9-]*-leaf\d+\.png\Z")  # training/stages.py leaf_image_name
_COUNTS = ("iteration", "num_prompts", "trees_per_prompt", "evals_per_tree", "nfe", "num_trees")


def shard_name(role: str, i: int) -> str:
    return f"{role}-{i:05d}"


def to_uint8(images: Tensor) -> Tensor:
    """[B, 3, H, W] float in [0, 1] -> uint8."""
    return (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()


@dataclass
class TreeShard:
    index: int  # shard number
    tree: Tree
    leaf_image: Tensor  # [L, 3, H, W] uint8
    prompts: dict[int, str]  # prompt id -> text (a Prompt with its metadata)
    tree_offset: int  # global id of this shard's tree 0
    nfe: int  # model evaluations spent on this shard

    def leaf_prompts(self) -> list[str]:
        leaves = self.tree.leaves()
        return [self.prompts[int(p)] for p in self.tree.tree_prompt[self.tree.tree[leaves]]]


def write_tree_shard(store: ShardStore, s: TreeShard) -> None:
    tensors = dict(s.tree.tensors(), leaf_image=s.leaf_image)
    meta: dict[str, Any] = {"prompts": {str(k): v for k, v in s.prompts.items()}, "tree_offset": s.tree_offset}
    meta["nfe"] = s.nfe
    extra = {str(k): m for k, v in s.prompts.items() if (m := prompt_meta(v))}
    if extra:  # each prompt's metadata, for the rewards that read it (absent when no prompt has any)
        meta["prompt_meta"] = extra
    store.write(shard_name("trees", s.index), "trees", tensors, meta)


def read_tree_shard(store: ShardStore, name: str) -> TreeShard:
    tensors, meta = store.read(name)
    try:
        tree = Tree.from_tensors(tensors)
        extra = meta.get("prompt_meta", {})
        prompts: dict[int, str] = {int(k): Prompt(str(v), extra.get(k)) for k, v in meta["prompts"].items()}
        missing = sorted({int(p) for p in tree.tree_prompt.tolist()} - set(prompts))
        if missing:
            raise ValueError(f"no prompt text for prompt id {missing[0]}")
        return TreeShard(
            int(name.rsplit("-", 1)[1]),
            tree,
            tensors["leaf_image"],
            prompts,
            int(meta["tree_offset"]),
            int(meta["nfe"]),
        )
    except (KeyError, ValueError, TypeError, AttributeError, IndexError, RuntimeError) as e:
        raise CorruptFileError(f"{store.root / name}.safetensors: not a tree shard ({e})") from None


def read_extra(store: ShardStore, role: str, index: int) -> tuple[dict[str, Tensor], dict[str, Any]] | None:
    """The rewards or advantages shard that belongs to tree shard `index`, if written."""
    name = shard_name(role, index)
    return store.read(name) if name in store.index["shards"] else None


class TreeStore(ShardStore):
    """A tree folder: trees shards, and the rewards and advantages shards that score them."""

    def validate(self) -> None:
        path = self.root / INDEX
        shards = self.index["shards"]
        for name, entry in shards.items():
            m = _ROLE_NAME.match(name)
            if m is None or entry["role"] != m.group(1):
                raise CorruptFileError(
                    f"{path}: shards[{name!r}] is not a trees-, rewards- or advantages-NNNNN shard "
                    f"(role {shown(entry['role'])})"
                )
            if m.group(1) in SCORES and f"trees-{m.group(2)}" not in shards:
                raise CorruptFileError(f"{path}: shards[{name!r}] scores trees-{m.group(2)}, which it does not list")
        check_meta(self.meta, path)

    def leftover(self) -> bool:
        """A rollout that did not finish (killed, or out of space): the same rollout command replaces it."""
        return self.meta.get("complete") is False

    def sweep(self) -> None:
        """The sample images an earlier rollout of this folder wrote (images/: its leaf PNGs and prompts.json)."""
        folder = self.root / IMAGES
        if folder.is_dir() and not folder.is_symlink():
            for p in folder.iterdir():
                if (_LEAF_PNG.match(p.name) or p.name == "prompts.json") and p.is_file() and not p.is_symlink():
                    p.unlink()

    def problem(self, scores: bool = True) -> str | None:
        """Why a reader may not use this folder as whole (None when it may): a rollout that did not finish, or
        (scores) a scoring pass that did not; each with the command to run again."""
        meta, root = self.meta, self.root
        if meta.get("complete") is False:
            again = _cut(meta.get("command") or f"treegrpo rollout --out {root}")
            return f"{root}: an incomplete rollout (its writer stopped before the end); roll it out again: {again}"
        if not scores:
            return None
        redo = f"score it again: {_cut(meta.get('scoring_pass') or f'treegrpo score {root}')}"
        if "scoring_pass" in meta:
            return f"{root}: a scoring pass that did not finish (killed, or out of space); {redo}"
        trees = self.names("trees")
        for role in SCORES:
            have = len(self.names(role))
            if have and ("scoring" not in meta or have != len(trees)):
                return f"{root}: {have} of {len(trees)} trees shards have {role} (an interrupted scoring); {redo}"
        if "scoring" in meta and not self.names("rewards"):
            return f"{root}: meta.scoring is recorded but no rewards shard is listed; {redo}"
        return None

    def write(self, name: str, role: str, tensors: dict[str, Tensor], meta: dict[str, Any] | None = None) -> None:
        if role in SCORES:  # bind the scores to the bytes of the trees they score
            trees = self.index["shards"].get(f"trees-{name.rsplit('-', 1)[-1]}")
            if trees is None:
                raise TreegrpoError(f"{self.root}: no trees shard for {name}")
            meta = {**(meta or {}), TREES_SHA: trees["sha256"]}
        super().write(name, role, tensors, meta)

    def read(self, name: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
        tensors, meta = super().read(name)
        role, _, number = name.rpartition("-")
        if role in SCORES:
            trees = self.index["shards"].get(f"trees-{number}")
            recorded = meta.get(TREES_SHA)  # absent in folders scored before it was recorded
            if recorded is not None and (trees is None or recorded != trees["sha256"]):
                raise CorruptFileError(
                    f"{self.root / self.index['shards'][name]['file']}: scores other trees than trees-{number} "
                    f"(the trees sha256 it records does not match {INDEX}; copied from another tree folder?); "
                    f"run `treegrpo score {self.root}` again"
                )
        if role == "advantages" and f"rewards-{number}" in self.index["shards"]:
            self.read(f"rewards-{number}")  # an update uses the advantages; their rewards must be intact too
        return tensors, meta


def check_meta(meta: dict[str, Any], path: Path) -> None:
    """The meta fields of a tree folder's index that the commands read: one line naming the first bad one."""
    if not isinstance(meta.get("config"), dict):
        got = "missing" if "config" not in meta else kind_of(meta["config"])
        raise CorruptFileError(f"{path}: meta.config must be an object (the rollout's config), got {got}")
    for key in _COUNTS:
        if key in meta and (type(meta[key]) is not int or meta[key] < 0):
            raise CorruptFileError(f"{path}: meta.{key} must be a whole number >= 0, got {shown(meta[key])}")
    if "seed" in meta and type(meta["seed"]) is not int:
        raise CorruptFileError(f"{path}: meta.seed must be a whole number, got {shown(meta['seed'])}")
    for key, typ, what in (
        ("command", str, "a string"),
        ("complete", bool, "true or false"),
        ("scoring_pass", str, "a string"),
    ):
        if key in meta and not isinstance(meta[key], typ):
            raise CorruptFileError(f"{path}: meta.{key} must be {what}, got {shown(meta[key])}")
    model = meta.get("model", {"name": ""})
    if not isinstance(model, dict) or not isinstance(model.get("name"), str):
        raise CorruptFileError(f"{path}: meta.model must be an object with a name, got {shown(model)}")
    steps = meta.get("split_steps", [])
    if not isinstance(steps, list) or not all(type(x) is int for x in steps):
        raise CorruptFileError(f"{path}: meta.split_steps must be a list of whole numbers, got {shown(steps)}")
    sde = meta.get("sde_steps", "all")
    if sde != "all" and (not isinstance(sde, list) or not all(type(x) is int for x in sde)):
        raise CorruptFileError(f'{path}: meta.sde_steps must be "all" or a list of whole numbers, got {shown(sde)}')
    if "scoring" in meta:
        _check_scoring(meta["scoring"], path)


def _check_scoring(scoring: Any, path: Path) -> None:
    if not isinstance(scoring, dict):
        raise CorruptFileError(f"{path}: meta.scoring must be an object, got {kind_of(scoring)}")
    rewards = scoring.get("rewards")
    if not isinstance(rewards, dict) or not all(
        isinstance(k, str) and type(v) in (int, float) for k, v in rewards.items()
    ):
        raise CorruptFileError(f"{path}: meta.scoring.rewards must map reward names to weights, got {shown(rewards)}")
    for key, typ, what in (
        ("combine", str, "a string"),
        ("advantage", dict, "an object"),
        ("pruning", dict, "an object"),
        ("options", list, "a list"),
        ("sets", list, "a list"),
    ):
        if key in scoring and not isinstance(scoring[key], typ):
            raise CorruptFileError(f"{path}: meta.scoring.{key} must be {what}, got {shown(scoring[key])}")
    for key in ("iteration", "max_iterations"):
        if key in scoring and (type(scoring[key]) is not int or scoring[key] < 0):
            raise CorruptFileError(f"{path}: meta.scoring.{key} must be a whole number >= 0, got {shown(scoring[key])}")


def _cut(command: str, most: int = 500) -> str:
    """A recorded command for an error line: at most `most` characters."""
    return command if len(command) <= most else command[: most - 3] + "..."


def open_trees(root: Path, scores: bool = True) -> TreeStore:
    """A whole tree folder, its index validated as a whole (no shard is read): a rollout that finished and,
    unless `scores` is False (score itself), no scoring pass left half done. One line otherwise."""
    store = TreeStore.open(root, kind=KIND)
    if (why := store.problem(scores)) is not None:
        raise TreegrpoError(why)
    return store
