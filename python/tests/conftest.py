# SPDX-License-Identifier: Apache-2.0
import os
import sys

# Passive OpenMP waiting: libgomp reads it once, when torch loads it (see the README). Spinning
# threads make the many short parallel regions of a hierarchical-softmax step 10-100x slower on
# a machine whose cores are shared.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import pytest  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.abspath(os.path.join(HERE, "..", "..", "examples", "python"))
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
    yield
