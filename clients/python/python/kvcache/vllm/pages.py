"""Where each block's bytes are in vLLM's KV cache, for every layout vLLM 0.32 can hand a connector.

vLLM views one buffer as a ``[B, H, N, C]`` tensor per layer whose physical order is one of
``KVCacheLayout``'s (``LBHNC`` on the CPU, ``LBNHC`` by default on a GPU, block-outermost
``BLHNC``/``BLNHC``, head-outermost ``LHBNC``/``BHLNC``), and, when the attention kernel wants
smaller blocks than the scheduler's, splits each block into ``ratio`` kernel blocks that sit one
after the other. So a view is rarely contiguous, but one block of one layer (its page) always
sits at ``base + block * block_stride`` as one dense run (layer- or block-outermost layouts) or
as one run per head (head-outermost ones). ``Pages`` finds those runs from the view's strides,
never from the layout's name, and refuses a view whose page it cannot describe as equal runs.

A block's value is its page of every layer, in layer order, each page its runs in memory order:
``pointers`` gives those ranges (to move them by pointer, on the CPU); ``gather`` and
``scatter`` copy whole blocks between the cache and a dense layer-major buffer (``staged`` names
each block's ranges there) with one indexed copy per layer on the cache's device (to stage them,
on a GPU). ``signature`` names the page's byte order, which the key namespace includes: two
layouts never share a key.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from math import prod

import torch


@dataclass(frozen=True)
class LayerPages:
    """One layer's pages: a uint8 view ``[blocks, *outer, run]`` over the cache's memory."""

    view: torch.Tensor
    #: address of block 0's first run
    base: int
    #: bytes from one block's page to the next's
    block_stride: int
    #: byte offset of each run within a page, in memory order
    offsets: tuple[int, ...]
    #: bytes of each run
    run: int
    #: the page's dims from outermost to innermost in memory: K (kernel block), H, N, C
    order: str


def _bytes_over(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 tensor over all of `t`'s storage (views may span more than `t`)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _runs(sizes: list[int], strides: list[int]) -> tuple[list[tuple[int, int]], int]:
    """Splits one page (dims `sizes` with byte `strides`, the last one 1) into its largest
    contiguous tail and the dims outside it: ``([(size, stride) outer...], run bytes)``."""
    dims = sorted(((s, d) for s, d in zip(strides, sizes) if s > 0 and d > 1), reverse=True)
    run = 1
    while dims and dims[-1][0] == run:
        stride, size = dims.pop()
        run *= size
    return [(size, stride) for stride, size in dims], run


def _layer(name: str, t: torch.Tensor, ratio: int, num_blocks: int) -> LayerPages:
    if t.dim() != 4 or t.stride(-1) != 1:
        raise ValueError(
            f"kvcache.vllm: layer {name}'s KV cache is not a [blocks, heads, tokens, content] view with "
            f"dense content (shape {tuple(t.shape)}, strides {t.stride()}); this cache is not supported"
        )
    e = t.element_size()
    # one scheduler block = `ratio` kernel blocks, then heads, tokens, content (in bytes)
    sizes = [ratio, t.shape[1], t.shape[2], t.shape[3] * e]
    strides = [t.stride(0) * e, t.stride(1) * e, t.stride(2) * e, 1]
    outer, run = _runs(sizes, strides)
    page = prod(sizes)
    if run * prod(size for size, _ in outer) != page or any(
        stride < run for _, stride in outer
    ):  # pragma: no cover - strides of a torch view never overlap this way
        raise ValueError(f"kvcache.vllm: layer {name}'s pages overlap (strides {t.stride()})")
    offsets = [0]
    for size, stride in outer:
        offsets = [o + i * stride for o in offsets for i in range(size)]
    raw = _bytes_over(t)
    start = t.storage_offset() * e
    view = raw.as_strided(
        (num_blocks, *(size for size, _ in outer), run),
        (ratio * strides[0], *(stride for _, stride in outer), 1),
        start,
    )
    order = "".join(n for _, n in sorted(((s, n) for s, d, n in zip(strides, sizes, "KHNC") if d > 1), reverse=True))
    return LayerPages(view, t.data_ptr(), ratio * strides[0], tuple(offsets), run, order)


def _merged(layers: list[LayerPages], num_blocks: int) -> tuple[LayerPages, ...]:
    """One "layer" of every layer's page when a block's pages of all layers are one dense range
    (block-outermost layouts): the same bytes in the same order, moved as one range per block."""
    first, page = layers[0], layers[0].run
    adjacent = all(
        len(layer.offsets) == 1 and layer.block_stride == first.block_stride and layer.base == first.base + i * page
        for i, layer in enumerate(layers)
    )
    if len(layers) == 1 or not adjacent:
        return tuple(layers)
    width = len(layers) * page
    view = first.view.as_strided((num_blocks, width), (first.block_stride, 1))
    return (LayerPages(view, first.base, first.block_stride, (0,), width, first.order),)


@dataclass(frozen=True)
class Pages:
    """Every layer's pages, in layer order (the order of a block's value); layers whose pages
    are adjacent in every block are one entry of ``layers``."""

    layers: tuple[LayerPages, ...]
    num_blocks: int
    device: torch.device
    #: the page's byte order: the runs a page is made of and where they sit
    signature: str

    @staticmethod
    def of(names: list[str], tensors: list[torch.Tensor], block_size: int, page_bytes: int) -> Pages:
        """The pages of `tensors` (one ``[B, H, N, C]`` view per layer, named `names`), whose
        scheduler blocks hold `block_size` tokens and `page_bytes` bytes per layer."""
        if not tensors:
            raise ValueError("kvcache.vllm: the worker registered no KV cache")
        kernel_tokens = tensors[0].shape[2]
        if kernel_tokens < 1 or block_size % kernel_tokens:
            raise ValueError(
                f"kvcache.vllm: the KV cache holds blocks of {kernel_tokens} tokens, which do not divide "
                f"the scheduler's {block_size}; this cache is not supported"
            )
        ratio = block_size // kernel_tokens
        num_blocks = tensors[0].shape[0] // ratio
        layers = []
        for name, t in zip(names, tensors):
            if t.shape != tensors[0].shape or t.dtype != tensors[0].dtype or t.device != tensors[0].device:
                raise ValueError(
                    f"kvcache.vllm: layer {name}'s KV cache ({tuple(t.shape)}, {t.dtype}, {t.device}) differs "
                    f"from layer {names[0]}'s; one group of like layers is supported"
                )
            layers.append(_layer(name, t, ratio, num_blocks))
        first = layers[0]
        got = len(first.offsets) * first.run
        if got != page_bytes:
            raise ValueError(
                f"kvcache.vllm: layer {names[0]}'s page is {got} bytes, not the {page_bytes} its KV cache "
                "spec says; this layout is not supported"
            )
        runs = [(layer.offsets, layer.run, layer.order) for layer in layers]
        if any(r != runs[0] for r in runs):
            raise ValueError("kvcache.vllm: the layers' pages are laid out differently; this is not supported")
        step = first.offsets[1] if len(first.offsets) > 1 else 0
        signature = f"order={first.order};runs={len(first.offsets)}x{first.run}" + (f"@{step}" if step else "")
        return Pages(_merged(layers, num_blocks), num_blocks, tensors[0].device, signature)

    @property
    def page_bytes(self) -> int:
        """Bytes of one block in one entry of ``layers``."""
        layer = self.layers[0]
        return len(layer.offsets) * layer.run

    @property
    def value_bytes(self) -> int:
        """A block's value: its page of every layer."""
        return len(self.layers) * self.page_bytes

    @property
    def parts_per_block(self) -> int:
        return len(self.layers) * len(self.layers[0].offsets)

    def pointers(self, block: int) -> tuple[list[int], list[int]]:
        """The ranges of `block`'s value, in order: addresses and lengths."""
        ptrs, sizes = [], []
        for layer in self.layers:
            at = layer.base + block * layer.block_stride
            ptrs.extend(at + o for o in layer.offsets)
            sizes.extend([layer.run] * len(layer.offsets))
        return ptrs, sizes

    def memory(self) -> list[tuple[int, int]]:
        """The memory the cache lives in (address, bytes), each allocation once: what a
        connection that moves blocks by pointer must have registered."""
        spans: dict[int, int] = {}
        for layer in self.layers:
            storage = layer.view.untyped_storage()
            spans[storage.data_ptr()] = storage.nbytes()
        return sorted(spans.items())

    def staged(self, base: int, n: int, j: int) -> tuple[list[int], list[int]]:
        """The ranges of block `j` of `n` in a staging buffer at `base` that `gather` filled
        (layer-major: ``[layers, n, page]``): addresses and lengths, in value order."""
        page, layers = self.page_bytes, len(self.layers)
        return [base + (i * n + j) * page for i in range(layers)], [page] * layers

    def gather(self, blocks: torch.Tensor, out: torch.Tensor) -> None:
        """Copies `blocks` (int64 ids on the cache's device) into `out`, a contiguous uint8 tensor
        of ``len(blocks) * value_bytes`` on the cache's device, layer-major (``[layers, blocks,
        page]``): one indexed copy per layer on a GPU, one copy per block and layer on a CPU
        (where an indexed copy of bytes is several times slower than a copy of each page)."""
        for layer, rows, ids in self._slabs(blocks, out):
            if ids is None:
                torch.index_select(layer.view, 0, blocks, out=rows)
            else:
                for j, b in enumerate(ids):
                    rows[j].copy_(layer.view[b])

    def scatter(self, blocks: torch.Tensor, src: torch.Tensor) -> None:
        """Copies `src` (laid out as `gather` fills it) into `blocks` of the cache."""
        for layer, rows, ids in self._slabs(blocks, src):
            if ids is None:
                layer.view.index_copy_(0, blocks, rows)
            else:
                for j, b in enumerate(ids):
                    layer.view[b].copy_(rows[j])

    def _slabs(
        self, blocks: torch.Tensor, staged: torch.Tensor
    ) -> Iterator[tuple[LayerPages, torch.Tensor, list[int] | None]]:
        """Each layer with its slab of the layer-major `staged` buffer (shaped as its pages), and
        the block ids as a list on a CPU (``None`` on a GPU: one indexed copy)."""
        n = len(blocks)
        slabs = staged.view(len(self.layers), n, self.page_bytes)
        ids = blocks.tolist() if self.device.type == "cpu" else None
        for i, layer in enumerate(self.layers):
            yield layer, slabs[i].view(n, *layer.view.shape[1:]), ids
