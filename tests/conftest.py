import pytest
import torch

from treegrpo_cli.compat import ensure_torchvision
from treegrpo_cli.models.pixel import PixelConfig, PixelPolicy

ensure_torchvision()  # torchmetrics, open_clip and transformers import torchvision (see compat.py)


def pytest_collection_modifyitems(config, items):
    """`gpu` tests run where torch sees a CUDA GPU and are skipped elsewhere."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch sees none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _threads():
    torch.set_num_threads(1)  # deterministic CPU kernels, and fair to the 2-core CI machine
    yield


@pytest.fixture
def tiny_policy():
    """A very small pixel policy (8x8 images) that keeps engine tests fast."""
    return PixelPolicy(PixelConfig(image_size=8, width=8, blocks=1, text_dim=16), name="pixel-test")


@pytest.fixture(autouse=True)
def _own_temp_folder(tmp_path_factory, monkeypatch):
    """In-process commands that write to the temp folder (an internal error's traceback file without a run
    folder) write into this test's own, not the machine's."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("tmp")))


BAD_INPUT_LIMIT_S = 60  # a refused command refuses at once: a bad-input case gets this long


@pytest.fixture
def time_limit():
    """Fails a test that runs longer than BAD_INPUT_LIMIT_S (SIGALRM: the main thread only)."""
    import signal

    def expire(signum, frame):
        raise TimeoutError(f"a bad-input case ran longer than {BAD_INPUT_LIMIT_S} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(BAD_INPUT_LIMIT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
