"""spconv-c from PyTorch: torch.ops.spconv_c operators and spconv 2.x-compatible modules
(``import spconv_c.pytorch as spconv``)."""

from ._build import load as _load

BUILD_KIND = _load()  # "aot" (installed extension) or "jit" (compiled from the checkout)

from . import ops  # noqa: E402,F401
