"""SDPA drop-in routing (integrations/sdpa.py): install(), uninstall() and routed() share one
lock-guarded state in every thread: torch's function is saved once and restored when the last
routed() block exits, unless install() was called (then it stays until uninstall())."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from sdpa_state import TORCH_SDPA, F, sdpa, torch_attribute_restored  # noqa: E402,F401 (an autouse fixture)


def _run(*targets):
    threads = [threading.Thread(target=target) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()


def test_overlapping_routed_blocks_in_two_threads_restore_torch_when_the_last_exits():
    # A enters, B enters, A exits, B exits: B's block must not save A's patch as "the original".
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with sdpa.routed():
            a_in.set()
            assert b_in.wait(10)
        seen["after_a"] = sdpa.is_installed()  # B is still inside its block
        a_out.set()

    def b():
        assert a_in.wait(10)
        with sdpa.routed():
            b_in.set()
            assert a_out.wait(10)

    _run(a, b)
    assert seen["after_a"] is True
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_routed_blocks_exiting_in_entry_order_across_threads_restore_torch():
    # B enters after A and exits first (nested in time): still torch's own afterwards.
    a_in, b_in, b_out = threading.Event(), threading.Event(), threading.Event()

    def a():
        with sdpa.routed():
            a_in.set()
            assert b_out.wait(10)
            assert sdpa.is_installed()

    def b():
        assert a_in.wait(10)
        with sdpa.routed():
            b_in.set()
        b_out.set()

    _run(a, b)
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_install_inside_routed_stays_installed_until_uninstall():
    with sdpa.routed():
        sdpa.install()
    assert sdpa.is_installed()
    sdpa.uninstall()
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_install_in_one_thread_survives_another_threads_routed_block():
    b_in, installed = threading.Event(), threading.Event()

    def a():
        assert b_in.wait(10)
        sdpa.install()
        installed.set()

    def b():
        with sdpa.routed():
            b_in.set()
            assert installed.wait(10)

    _run(a, b)
    assert sdpa.is_installed()
    sdpa.uninstall()
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_uninstall_inside_routed_restores_torch_when_the_block_exits():
    sdpa.install()
    with sdpa.routed():
        sdpa.uninstall()
        assert sdpa.is_installed()  # the open block still asks for routing
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_routing_churn_from_many_threads_ends_with_torch_restored():
    start = threading.Barrier(8)

    def churn():
        start.wait(10)
        for _ in range(200):
            with sdpa.routed():
                sdpa.install()
                sdpa.uninstall()

    _run(*[churn] * 8)
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_uninstall_restores_torch_after_the_function_was_assigned_directly():
    F.scaled_dot_product_attention = sdpa.scaled_dot_product_attention  # routed without install()
    assert sdpa.is_installed()
    sdpa.uninstall()
    assert F.scaled_dot_product_attention is TORCH_SDPA
