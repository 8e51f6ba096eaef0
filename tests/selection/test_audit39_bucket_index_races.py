"""BucketIndex under threads: a memo that another thread starts over (its size bound reached) never
turns a lookup into a KeyError. Real threads, no engine needed: the index is
the live selector's, and its memos are plain dicts that one thread may clear while another reads."""

from __future__ import annotations

import sys
import threading

import pytest

from fusedattn_select import AttnConfig
from fusedattn_select.planning import bucket_index
from fusedattn_select.planning.bucket_index import BucketIndex
from fusedattn_select.types import Fingerprint

SECONDS = 2.0


@pytest.fixture
def fast_switching():
    # Thread switches every microsecond: the window between a memo check and its read is met often.
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


def _shapes() -> list[AttnConfig]:
    return [AttnConfig(batch_size=b, num_heads_q=8, num_heads_kv=8, seqlen_q=s, seqlen_kv=s, head_dim_qk=64,
                       mask="causal") for b in (1, 2, 3) for s in range(60, 200)]


def _hammer(index: BucketIndex) -> list[str]:
    """Four threads look up shapes for SECONDS or until one raises; the errors raised."""
    shapes, errors, stop = _shapes(), [], threading.Event()

    def find() -> None:
        try:
            while not stop.is_set():
                for cfg in shapes:
                    index.find(cfg)
        except Exception as err:  # noqa: BLE001 - what the test looks for
            errors.append(repr(err))
            stop.set()

    threads = [threading.Thread(target=find) for _ in range(4)]
    for thread in threads:
        thread.start()
    stop.wait(SECONDS)
    stop.set()
    for thread in threads:
        thread.join()
    return errors


def test_lookups_while_other_threads_restart_the_memos_never_raise(fast_switching, monkeypatch):
    # The memos start over at _MEMO_SIZE entries (a server meeting many shapes); a small bound makes
    # that happen every few lookups.
    monkeypatch.setattr(bucket_index, "_MEMO_SIZE", 8)
    assert _hammer(BucketIndex(None, Fingerprint(platform="cuda"))) == []


def test_a_lookup_still_answers_each_shape_by_its_own_bucket():
    index = BucketIndex(None, Fingerprint(platform="cuda"))
    cfg = AttnConfig(batch_size=3, num_heads_q=8, num_heads_kv=8, seqlen_q=100, seqlen_kv=100, head_dim_qk=64,
                     mask="causal")
    form = index.find(cfg)
    assert (form.batch_size, form.seqlen_q, form.seqlen_kv, form.mask) == (4, 128, 128, "padding_causal")
    assert index.find(cfg) is form  # remembered
