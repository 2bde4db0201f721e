from __future__ import annotations

import tempfile
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from ..errors import ConfigError
from .common import DEVICE_HELP, command_line, err, guarded, model_help, print_json, progress_bar
from .common import out as stdout

if TYPE_CHECKING:
    from ..diversity.io import ImageSet

ALPHA = 0.05  # the table's verdict column


def diversity(
    a: Annotated[
        Path | None,
        typer.Argument(
            help="Set A: a folder of images or a tree folder (with --generate: where to write set A).",
            show_default=False,
        ),
    ] = None,
    b: Annotated[Path | None, typer.Argument(help="Set B, like A.", show_default=False)] = None,
    kid: Annotated[
        bool, typer.Option("--kid/--no-kid", help="KID: polynomial-kernel MMD^2 averaged over random subsets.")
    ] = True,
    mmd: Annotated[
        bool,
        typer.Option(
            "--mmd/--no-mmd", help="Unbiased MMD^2 (Gaussian and polynomial kernels) and the permutation test."
        ),
    ] = True,
    features: Annotated[
        str, typer.Option(help="Feature spaces, comma separated: inception, clip, efficientnet, pixels.")
    ] = "efficientnet",
    kid_subsets: Annotated[int, typer.Option("--kid-subsets", min=1, help="KID: number of random subsets.")] = 100,
    kid_subset_size: Annotated[
        int, typer.Option("--kid-subset-size", min=2, help="KID: images per subset (capped at the smaller set).")
    ] = 1000,
    bandwidth: Annotated[
        float | None, typer.Option(help="Gaussian kernel sigma (default: the median pairwise feature distance).")
    ] = None,
    permutations: Annotated[
        int, typer.Option(min=0, help="Permutations of the same-distribution test (0: no test).")
    ] = 1000,
    test_kernel: Annotated[
        str, typer.Option("--test-kernel", help="The MMD^2 the test uses: gaussian | poly.")
    ] = "gaussian",
    by_tree: Annotated[
        bool,
        typer.Option(
            "--by-tree/--by-image",
            help="Test on one random leaf per tree of a tree folder (independent samples), or on every image.",
        ),
    ] = True,
    max_images: Annotated[
        int, typer.Option("--max-images", min=2, help="Per set: use a random subset when larger.")
    ] = 4096,
    batch: Annotated[int, typer.Option(min=1, help="Images per feature forward.")] = 64,
    seed: Annotated[int, typer.Option(help="Seed of subsets, permutations and --generate (set B uses seed + 1).")] = 0,
    device: Annotated[str, typer.Option(help=DEVICE_HELP + " (features and kernels).")] = "auto",
    inception_weights: Annotated[
        Path | None,
        typer.Option(
            "--inception-weights",
            help="pt_inception-2015-12-05-6726825d.pth (default: $TREEGRPO_INCEPTION or ~/.cache/treegrpo/).",
        ),
    ] = None,
    clip_weights: Annotated[
        Path | None,
        typer.Option(
            "--clip-weights",
            help="An open_clip ViT-B-32 checkpoint "
            "(default: $TREEGRPO_CLIP or ~/.cache/treegrpo/open_clip_vit_b_32.bin).",
        ),
    ] = None,
    generate: Annotated[bool, typer.Option("--generate", help="Roll out both sets from one model first.")] = False,
    preset_a: Annotated[str, typer.Option("--preset-a", help="--generate: the method preset of set A.")] = "dance-grpo",
    preset_b: Annotated[str, typer.Option("--preset-b", help="--generate: the method preset of set B.")] = "branch",
    sets_a: Annotated[
        list[str] | None,
        typer.Option("--set-a", help="--generate: key=value override of set A's config (repeatable)."),
    ] = None,
    sets_b: Annotated[
        list[str] | None,
        typer.Option("--set-b", help="--generate: key=value override of set B's config (repeatable)."),
    ] = None,
    num: Annotated[int, typer.Option(min=2, max=100_000, help="--generate: leaf images per set.")] = 4096,
    model: Annotated[str | None, typer.Option(help="--generate: " + model_help("the embedded tiny-shapes"))] = None,
    overwrite: Annotated[bool, typer.Option(help="--generate: replace existing tree folders.")] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Write report.json and embedding-<features>.png here (and, with --generate, set-a/ and set-b/).",
        ),
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    r"""Do two image sets come from one distribution? KID, MMD^2 and a permutation test per feature space.

    Examples:

      treegrpo diversity --generate --num 4096 --out runs/div   # DanceGRPO, branch

      treegrpo diversity runs/div/set-a runs/div/set-b --features clip
    """
    from ..diversity import DiversityConfig, compare, generate_set, open_images, parse_features
    from ..preflight import resolve_device

    with guarded():
        device = resolve_device(device)
        _check_folders(a, b, out, generate, overwrite)
        cfg = DiversityConfig(
            parse_features(features),
            kid,
            mmd,
            kid_subsets,
            kid_subset_size,
            bandwidth=bandwidth,
            permutations=permutations,
            test_kernel=test_kernel,
            by_tree=by_tree,
            max_images=max_images,
            batch=batch,
            seed=seed,
            device=device,
            inception_weights=inception_weights,
            clip_weights=clip_weights,
            out=out,
        ).validate()
        presets = ((preset_a, tuple(sets_a or ())), (preset_b, tuple(sets_b or ())))
        model = model or "tiny-shapes"
        if generate:  # before anything is generated
            from ..diversity.io import generated_trees
            from ..diversity.report import check_tree_counts

            check_tree_counts(cfg, *(generated_trees(p, num, model, s) for p, s in presets))
        with ExitStack() as stack, progress_bar() as bar:
            if generate:
                root = out or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="treegrpo-diversity-")))
                gen = partial(
                    generate_set, num=num, model=model, device=device, overwrite=overwrite, command=command_line()
                )
                (pa, sa), (pb, sb) = presets
                set_a = gen(pa, a or root / "set-a", seed=seed, sets=sa, progress=bar)
                set_b = gen(pb, b or root / "set-b", seed=seed + 1, sets=sb, progress=bar)
            elif a is None or b is None:
                raise ConfigError("give two folders A and B to compare, or pass --generate")
            else:
                set_a, set_b = open_images(a), open_images(b)
            report = compare(set_a, set_b, cfg, bar)
    if json_:
        print_json(report)
    else:
        stdout.print(_table(report, set_a, set_b))
        if out:
            err.print(f"wrote {', '.join(report['files'])}")


def _check_folders(a: Path | None, b: Path | None, out: Path | None, generate: bool, overwrite: bool) -> None:
    """Refuse A == B, an --out folder that is not an earlier report, and set folders that are someone else's."""
    from ..diversity.io import SET_FOLDERS, check_set_folder, is_report_folder
    from ..preflight import check_own_dir, check_writable_dir

    if a is not None and b is not None and a.resolve() == b.resolve():
        raise ConfigError(f"{b} is given twice: A and B are the same folder (compare two different sets)")
    if out is not None:
        check_writable_dir(out, "--out")
        what = f"an earlier diversity report (only report.json, embedding-*.png, {', '.join(SET_FOLDERS)})"
        check_own_dir(out, "--out", is_report_folder, what)
    if generate:  # where the sets go: new, empty, or tree folders to overwrite; never someone else's
        for label, given, default in (("A", a, SET_FOLDERS[0]), ("B", b, SET_FOLDERS[1])):
            folder = given if given is not None else (out / default if out is not None else None)
            if folder is not None:
                check_set_folder(folder, overwrite, f"set {label} folder")


def _table(report: dict[str, Any], a: ImageSet, b: ImageSet) -> Table:
    first = next(iter(report["features"].values()))
    unit = "one leaf per tree" if report["test_unit"] == "tree" else "every image"
    test = (
        f"{first['permutations']} permutations on {unit} ({first['test_n_a']} vs {first['test_n_b']}), "
        f"{first['test_kernel']} MMD^2"
        if "p_value" in first
        else "no permutation test"
    )
    table = Table(
        title="Same distribution? KID and MMD^2 of A against B", caption=f"A: {_source(a)}; B: {_source(b)}; p: {test}"
    )
    for col in ("features", "dim", "KID (mean ± std)", "MMD^2 gaussian", "MMD^2 poly", "p", f"p < {ALPHA}"):
        table.add_column(col, justify="left" if col == "features" else "right")
    for name, s in report["features"].items():
        kid_s = f"{s['kid_mean']:.4g} ± {s['kid_std']:.2g}" if "kid_mean" in s else "-"
        p = s.get("p_value")
        verdict = "-" if p is None else (Text("differ", style="red") if p < ALPHA else "no evidence")
        table.add_row(
            name, str(s["dim"]), kid_s, _num(s.get("mmd2_gaussian")), _num(s.get("mmd2_poly")), _num(p), verdict
        )
    return table


def _source(s: ImageSet) -> str:
    what = "tree leaves" if s.kind == "trees" else "image files"
    return f"{s.source} ({len(s)} of {s.count} {what})"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"
