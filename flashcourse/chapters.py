"""The course's table of chapters: the one place that says what each chapter is and where it lives.

Every chapter has a *stem*, one short word used for its module in every layer of the package
(``formulas/STEM.py``, ``reference/STEM.py``, ``kernels/STEM.py``, ``checks/STEM.py``,
``bench/STEM.py``, ``viz/STEM.py``), its tests (``tests/test_LAYER_STEM.py``), its notebook
sources (``lectures/NN_..STEM..py``) and its notebooks, so that ``git ls-files | grep STEM``
lists the whole chapter. Two chapters that build one algorithm share a stem (FlashAttention-1 and
-2 are ``attention``; Flash-Decoding and FlashDecoding++'s unified max are ``decode``). A chapter
too large for one module in a layer names its other modules there (``extra_modules``, each name
beginning with the stem: chapter 6's ``kernels/gemm_linear.py`` and ``kernels/gemm_floor.py``).

The packages find their chapter modules here (:func:`layer_modules`) instead of keeping import lists; the
README's course map, the Colab table and the notebooks' header cells are written from it; and the
tests check every chapter against it (its kernels exported and compiled ahead of time, its bench
suite with shipped results, its checks with hidden cases).

This module imports nothing from the course: it is the ground under the ground floor.

Example:
    >>> from flashcourse.chapters import CHAPTERS, chapter
    >>> [c.label for c in CHAPTERS][:8]         # chapters 0-6, and the primer, 0b (the examples hold when a chapter is added)
    ['0', '0b', '1', '2', '3', '4', '5', '6']
    >>> [c.stem for c in CHAPTERS][:8]
    ['roofline', 'primer', 'online', 'attention', 'attention', 'decode', 'decode', 'gemm']
    >>> chapter(3).notebook
    'notebooks/03_flashattention2.ipynb'
    >>> modules("kernels")[:4]
    ['online', 'attention', 'decode', 'gemm']
    >>> [m for m in layer_modules("kernels") if m.startswith(("decode", "gemm"))]    # each stem, then its extras
    ['decode', 'decode_configs', 'decode_taught', 'decode_unified', 'gemm', 'gemm_linear', 'gemm_floor', 'gemm_configs', 'gemm_taught']
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["Chapter", "CHAPTERS", "LAYERS", "chapter", "renamed", "stems", "modules", "layer_modules",
           "import_layer", "export"]

#: The layers of the package that hold one module per chapter stem, from the ground up.
LAYERS = ("formulas", "reference", "kernels", "checks", "bench", "viz")


@dataclass(frozen=True)
class Chapter:
    """One chapter of the course.

    ``name`` is the notebooks' file name without ``.ipynb`` (``NN_...``, and it contains the stem);
    ``layers`` are the layers that have a ``STEM.py`` module for it; ``kernels`` the entry points it
    adds to :mod:`flashcourse.kernels`; ``bench`` its benchmark suite (named by its stem);
    ``checks`` the functions of :mod:`flashcourse.checks` its exercise notebook calls;
    ``extra_modules`` its modules besides ``LAYER/STEM.py``, as ``"LAYER.NAME"`` with NAME
    beginning with ``STEM_`` (imported and exported with the layer, after ``STEM.py``; an extra bench
    module registers a suite named by the module, as chapter 3's ``bench.attention_gqa`` does);
    ``former_names`` the names its notebooks had before the chapters were renamed (so that
    ``flashcourse grade`` still knows a student's ``01_softmax.ipynb``; see :func:`renamed`);
    ``part`` a letter for a chapter slotted in after chapter ``number`` without renumbering the ones
    after it (the Triton primer is chapter 0b, between chapter 0 and chapter 1): its :attr:`label`.

    Example:
        >>> c = chapter(1)
        >>> c.stem, c.exercise, c.source
        ('online', 'exercises/01_online_softmax.ipynb', 'lectures/01_online_softmax.py')
    """
    number: int
    stem: str
    title: str
    name: str
    layers: tuple[str, ...]
    kernels: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    bench: str | None = None
    extra_modules: tuple[str, ...] = ()
    former_names: tuple[str, ...] = ()
    part: str = ""

    @property
    def label(self) -> str:
        """The chapter's number as the course shows it: ``"3"``, or ``"0b"`` for a part.

        Example:
            >>> chapter("0b").label, chapter(3).label
            ('0b', '3')
        """
        return f"{self.number}{self.part}"

    @property
    def notebook(self) -> str:
        """The lecture notebook, relative to the repository root."""
        return f"notebooks/{self.name}.ipynb"

    @property
    def exercise(self) -> str | None:
        """The exercise notebook (generated from :attr:`solution`), or None for a chapter without one."""
        return f"exercises/{self.name}.ipynb" if self.checks else None

    @property
    def solution(self) -> str | None:
        """The exercise notebook with its solutions, or None."""
        return f"solutions/{self.name}.ipynb" if self.checks else None

    @property
    def source(self) -> str:
        """The Python source the lecture notebook is written from."""
        return f"lectures/{self.name}.py"

    @property
    def solution_source(self) -> str | None:
        """The Python source the solution notebook is written from, or None."""
        return f"lectures/{self.name}_solutions.py" if self.checks else None


_ALL = LAYERS
CHAPTERS: tuple[Chapter, ...] = (
    Chapter(0, "roofline", "Why attention is memory-bound", "00_roofline",
            layers=("bench", "viz"), bench="roofline"),
    Chapter(0, "primer", "A Triton primer: programs, blocks, masks", "00b_triton_primer",
            layers=("checks",), checks=("axpy_kernel", "outer_kernel", "pad_scores_kernel", "rms_norm_kernel",
                                        "logsumexp_kernel", "dot_tile_kernel", "predict_rms_norm", "grid_waves",
                                        "rms_norm_looped_kernel"),
            extra_modules=("checks.primer_puzzles", "checks.primer_tiles", "checks.primer_predict",
                           "checks.primer_waves"), part="b"),
    Chapter(1, "online", "Softmax: naive → safe → online", "01_online_softmax",
            layers=("formulas", "reference", "kernels", "checks", "bench"),
            kernels=("softmax", "safe_softmax_3pass", "softmax_taught"),
            checks=("online_softmax", "merge", "softmax_kernel", "softmax_bytes", "online_cross_entropy"),
            bench="online", extra_modules=("reference.online_blocks", "checks.online_predict", "checks.online_entropy"),
            former_names=("01_softmax",)),
    Chapter(2, "attention", "FlashAttention-1: tiles, and the order of the loops", "02_flashattention1",
            layers=_ALL, kernels=("fa1_forward",), checks=("fa1_step", "fa1_accesses", "o_writes"),
            bench="attention", extra_modules=("reference.attention_updates", "checks.attention_predict",
                                              "checks.attention_writes")),
    Chapter(3, "attention", "FlashAttention-2: swap the loops, defer the rescale", "03_flashattention2",
            layers=_ALL, kernels=("fa2_forward", "fa2_taught"), checks=("fa2_attention", "fa2_kernel", "choose_fa2_config",
                                                                           "skipped_blocks"),
            bench="attention",
            extra_modules=("reference.attention_warps", "reference.attention_gqa", "kernels.attention_fast", "kernels.attention_gqa",
                           "checks.attention_tiles", "checks.attention_causal", "bench.attention_gqa")),
    Chapter(4, "decode", "Flash-Decoding: split the keys, not the queries", "04_flash_decode",
            layers=_ALL, kernels=("flash_decode", "flash_decode_taught"),
            checks=("lse_combine", "split_kv_kernel", "choose_num_splits", "combine_crossover"),
            bench="decode", extra_modules=("kernels.decode_configs", "kernels.decode_taught", "checks.decode_splits",
                                           "checks.decode_combine"),
            former_names=("04_flash_decoding",)),
    Chapter(5, "decode", "FlashDecoding++: one shared maximum instead of many", "05_unified_max_decode",
            layers=_ALL, kernels=("unified_max_decode", "unified_max_decode_taught"),
            checks=("unified_max_partials", "choose_phi", "partials_kernel"),
            bench="decode",
            extra_modules=("reference.decode_unified", "kernels.decode_unified", "checks.decode_unified",
                           "checks.decode_phi", "checks.decode_partials"),
            former_names=("05_unified_max",)),
    Chapter(6, "gemm", "Flat GEMM: the linear layers of a decoding step", "06_flat_gemm",
            layers=_ALL, kernels=("flat_gemm", "flat_gemm_taught", "gemv", "linear", "read_once"),
            checks=("choose_block_n", "gemm_accesses", "k_shares", "flat_gemm_kernel"), bench="gemm",
            extra_modules=("kernels.gemm_linear", "kernels.gemm_floor", "kernels.gemm_configs", "kernels.gemm_taught",
                           "checks.gemm_predict", "checks.gemm_split")),
    Chapter(7, "backward", "The backward pass: recompute P, don't store it", "07_backward",
            layers=("formulas", "reference", "kernels", "checks", "bench"),
            kernels=("fa2_backward", "fa2_backward_taught", "fa1_backward", "flash_attention"),
            checks=("fa2_backward_step", "backward_step_dlse", "backward_accesses", "dkdv_kernel"), bench="backward",
            extra_modules=("kernels.backward_taught", "kernels.backward_configs", "kernels.backward_fa1",
                           "kernels.backward_autograd", "checks.backward_lse", "checks.backward_predict")),
    Chapter(8, "sparse", "Block-sparse FlashAttention: skip the empty blocks", "08_block_sparse",
            layers=("formulas", "reference", "kernels", "checks", "bench"),
            kernels=("block_sparse_attention", "block_sparse_taught", "block_sparse_backward", "create_block_mask"),
            checks=("block_lists", "sparse_kernel", "band_lists", "forward_time"),
            bench="sparse", extra_modules=("formulas.sparse_masks", "kernels.sparse_taught", "kernels.sparse_configs",
                                           "checks.sparse_bands", "checks.sparse_predict")),
    Chapter(9, "paged", "The KV cache and PagedAttention", "09_paged_attention",
            layers=("formulas", "reference", "kernels", "checks", "bench", "viz"),
            kernels=("paged_decode", "paged_decode_taught", "paged_append"),
            checks=("cache_step", "paged_split_kernel", "requests_that_fit"), bench="paged",
            extra_modules=("kernels.paged_write", "checks.paged_walk", "checks.paged_predict")),
    Chapter(10, "fa3", "FlashAttention-3 on Hopper, in Gluon", "10_fa3_hopper",
            layers=("reference", "kernels", "checks", "viz"), kernels=("fa3_forward",),
            checks=("block_ns", "ring_phases", "overlap_order", "take_turn"),
            extra_modules=("kernels.fa3_gluon", "checks.fa3_turn", "checks.fa3_hopper")),
    Chapter(11, "ring", "Ring attention across GPUs", "11_ring_attention",
            layers=("formulas", "reference", "checks", "bench", "viz"),
            checks=("ring_step", "zigzag_positions", "ring_predict")),
)


def chapter(label: int | str) -> Chapter:
    """The chapter whose :attr:`Chapter.label` is ``label`` (a number, or a string such as ``"0b"``).

    Example:
        >>> chapter(6).stem, chapter("0b").stem
        ('gemm', 'primer')
    """
    for c in CHAPTERS:
        if c.label == str(label):
            return c
    raise KeyError(f"chapter: there is no chapter {label!r}; the course has {[c.label for c in CHAPTERS]}")


def renamed() -> dict[str, str]:
    """Each former chapter name (a chapter's :attr:`Chapter.former_names`) with the chapter's name today.

    Example:
        >>> renamed()["01_softmax"]
        '01_online_softmax'
    """
    return {old: c.name for c in CHAPTERS for old in c.former_names}


def stems() -> list[str]:
    """Every chapter stem once, in chapter order.

    Example:
        >>> stems()[:3]
        ['roofline', 'primer', 'online']
    """
    return list(dict.fromkeys(c.stem for c in CHAPTERS))


def modules(layer: str) -> list[str]:
    """The stems that have a module in ``layer`` (one of :data:`LAYERS`), in chapter order.

    Example:
        >>> modules("bench")[:5]
        ['roofline', 'online', 'attention', 'decode', 'gemm']
        >>> modules("checks")[:2]
        ['primer', 'online']
    """
    if layer not in LAYERS:
        raise ValueError(f"modules: layer must be one of {LAYERS}, got {layer!r}")
    return list(dict.fromkeys(c.stem for c in CHAPTERS if layer in c.layers))


def layer_modules(layer: str) -> list[str]:
    """The chapter modules of ``layer``, in chapter order: each stem of :func:`modules`, followed by
    the ``extra_modules`` its chapters name in that layer.

    Example:
        >>> [m for m in layer_modules("kernels") if m.startswith("gemm")]
        ['gemm', 'gemm_linear', 'gemm_floor', 'gemm_configs', 'gemm_taught']
        >>> [m for m in layer_modules("reference") if m.startswith("decode")]     # chapter 4's stem, then 5's
        ['decode', 'decode_unified']
    """
    names = []
    for stem in modules(layer):
        names.append(stem)
        for c in CHAPTERS:
            if c.stem == stem:
                names += [m.split(".", 1)[1] for m in c.extra_modules if m.split(".", 1)[0] == layer]
    return list(dict.fromkeys(names))


def import_layer(package: str) -> list:
    """Import the chapter modules of the layer package ``package`` (e.g. ``"flashcourse.kernels"``):
    those of :func:`layer_modules`.

    This is how a layer finds its chapters: a new chapter is a row of :data:`CHAPTERS` and a
    ``STEM.py`` in each layer it names, not a line in the layer's ``__init__.py``.

    Example:
        >>> [m.__name__ for m in import_layer("flashcourse.reference")][:2]
        ['flashcourse.reference.online', 'flashcourse.reference.online_blocks']
    """
    layer = package.rsplit(".", 1)[-1]
    return [importlib.import_module(f"{package}.{name}") for name in layer_modules(layer)]


def export(package: str, namespace: dict) -> list[str]:
    """Import the chapter modules of ``package`` and put the names of their ``__all__`` in ``namespace``.

    A layer's ``__init__.py`` calls ``__all__ = export(__name__, globals())``. Two chapters that
    export one name, or a name that would hide one of the package's modules (a function ``softmax``
    over a module ``softmax.py``), are refused: every name has one home.

    Example:
        >>> ns = {}
        >>> "flash_decode" in export("flashcourse.kernels", ns), ns["flash_decode"].__module__
        (True, 'flashcourse.kernels.decode')
    """
    names: list[str] = []
    for module in import_layer(package):
        for name in module.__all__:
            value = getattr(module, name)
            if name in names and namespace.get(name) is not value:
                raise ImportError(f"{package}: {name!r} is exported by two chapter modules; give one a "
                                  f"different name (the second is {module.__name__})")
            if name in layer_modules(package.rsplit(".", 1)[-1]):
                raise ImportError(f"{package}: {module.__name__} exports {name!r}, which would hide the "
                                  f"module {package}.{name}; rename one of them")
            namespace[name] = value
            names.append(name)
    return names
