"""pytest setup: the package from this checkout (python/), one seed per test, printed."""

import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture
def seed(request):
    """A fresh seed per test (SPCONV_C_SEED fixes it); printed so that a failure can be rerun."""
    value = int(os.environ.get("SPCONV_C_SEED", random.SystemRandom().randrange(2**31)))
    print(f"\n{request.node.nodeid}: seed {value} (rerun with SPCONV_C_SEED={value})")
    return value


@pytest.fixture
def data_dir():
    if not DATA.is_dir():
        pytest.skip(f"real scans not found at {DATA} (see README: ../shared/data)")
    return DATA
