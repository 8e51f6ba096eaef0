"""A process forked while another thread warms a cuDNN engine up does not wait for ever on that warm-up
(its lock is renewed in the child, as the store's and the runtime's are): the child's own use of the
engine ends, with CUDA's error about forked processes where CUDA refuses it."""

from __future__ import annotations

import pytest

from tests.forking import forked_while_held

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device")]


def test_a_child_forked_during_a_warm_up_does_not_wait_for_it(cudnn_engine):
    from fusedattn_select.probing.cudnn.cudnn_engine import CudnnEngine  # (the fixture: this machine has one)

    engine = CudnnEngine(warm_up=False)
    status = forked_while_held(engine._warm, lambda: engine.warm_up() or True)
    assert status != -1, "the forked child waited for the parent's warm-up lock"
