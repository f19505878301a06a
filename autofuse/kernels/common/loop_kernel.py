"""A loop kernel's source and launch record around the body its emitter renders (the pointwise,
reduction, scan and scatter kinds)."""

from __future__ import annotations

from collections.abc import Sequence

from autofuse.kernels.common import load_hints
from autofuse.kernels.common.base import Kernel, KernelMeta
from autofuse.kernels.common.emitter import Emitter
from autofuse.kernels.common.literals import with_size_arguments
from autofuse.kernels.common.render import kernel_header


def render_loop_kernel(
    em: Emitter,
    name: str,
    kind: str,
    consts: Sequence[str] = (),
    launch_kw: Sequence[tuple[str, int]] = (),
) -> Kernel:
    """The source and launch record of a loop kernel whose body ``em`` renders. ``consts``
    and ``launch_kw``: the kind's constexprs beyond XBLOCK / RBLOCK."""
    info, config = em.info, em.cfg
    body = em.emit()
    params = [em.ptr[i] for i in info.loads] + [em.out_ptr[i] for i in info.stored] + ["xnumel"]
    const_params = ["XBLOCK: tl.constexpr"]
    if em.red:
        params.append("rnumel")
        const_params.append("RBLOCK: tl.constexpr")
    const_params += [f"{c}: tl.constexpr" for c in consts]
    what = f"{kind}, domain {list(info.domain)}" + (
        f", reducing dims {list(info.reduce_dims)}" if em.red else ""
    )
    if em.swap is not None:  # AUTOFUSE_REDUCTION_ORDER=stride: the row's digits walked swapped
        what += f", its {em.swap[0]} x {em.swap[1]} row walked by stride ({em.swap[0]} innermost)"
    header = kernel_header(em, name, what, params + const_params)
    helpers = [h.source for h in sorted(em.helpers, key=lambda h: h.name)]
    src = "\n".join(
        ["import triton", "import triton.language as tl", "", ""]
        + [h + "\n" for h in helpers]
        + header
        + body
    )
    layout = [("in", k) for k in range(len(info.loads))]
    layout += [("out", k) for k in range(len(info.stored))] + [("int", info.xnumel)]
    kw = [("XBLOCK", config.XBLOCK), ("num_warps", config.num_warps)]
    kw += [("num_stages", 1)] if getattr(config, "ONE_STAGE", False) else []
    if em.red:
        layout.append(("int", info.rnumel))
        kw.insert(1, ("RBLOCK", config.RBLOCK))
    if em.checked:  # debug mode for the index asserts, without checking every integer op
        kw.append(("sanitize_overflow", False))
    looped = em.red and not em.persistent
    passes = em.load_passes() if looped else (1,) * len(info.loads)
    kernel = Kernel(
        name=name,
        source=src + "\n",
        config=config,
        info=info,
        layout=tuple(layout),
        grid=(-(-info.xnumel // config.XBLOCK),),
        launch_kw=tuple(kw + list(launch_kw)),
        meta=KernelMeta(load_passes=passes, dots=em.dots, **load_hints.meta_fields(em)),
    )
    return with_size_arguments(kernel)  # sizes in its index arithmetic: arguments
