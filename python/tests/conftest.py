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


# --------------------------------------------------------------------------------------------------
# Devices: the test files that start with `pytestmark = pytest.mark.usefixtures("device")` run every
# test on the CPU and on CUDA (torch's default device is set for the test, so that the modules'
# parameters and the tests' tensors are made there). The CUDA cases are collected everywhere and
# skipped where there is no GPU or the build has no CUDA operators; the summary counts them.
# --------------------------------------------------------------------------------------------------

def cuda_skip_reason():
    """None when the CUDA tests can run here, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    from xsoftmax import _ops
    if not _ops.has_cuda():
        return "this build of xsoftmax has no CUDA operators (xsoftmax.build_info())"
    return None


requires_cuda = pytest.mark.skipif(cuda_skip_reason() is not None, reason=str(cuda_skip_reason()))


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: a test case that runs on a CUDA device")


@pytest.hookimpl(tryfirst=True)  # before `-m cuda` selects by markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("device") == "cuda":
            item.add_marker(pytest.mark.cuda)


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    """The device a test runs on, made torch's default device for the test."""
    if request.param == "cuda":
        reason = cuda_skip_reason()
        if reason is not None:
            pytest.skip(reason)
    previous = torch.get_default_device()
    torch.set_default_device(request.param)
    try:
        yield torch.device(request.param)
    finally:
        torch.set_default_device(previous)


def pytest_terminal_summary(terminalreporter):
    cuda = [r for r in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", [])
            if "cuda" in r.keywords]
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "cuda" in r.keywords]
    reason = cuda_skip_reason()
    terminalreporter.write_line(
        f"xsoftmax: {len(cuda)} CUDA test cases ran, {len(skipped)} were skipped"
        + (f" ({reason})" if skipped and reason else ""))
