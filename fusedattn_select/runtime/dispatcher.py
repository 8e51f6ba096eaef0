"""The Dispatcher: every piece of state attention() keeps between calls (its fields below), owned by one
object (docs/dispatch.md, 'One owner, one runner per signature'); `dispatcher.clear()` (clear_plans) forgets
it in one place. It imports no other runtime module, so every module reaches the state without import cycles."""

from __future__ import annotations

import queue
import threading
from collections import Counter
from concurrent.futures import Future
from typing import Any, Callable, Optional

from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.single_flight import OncePerKey

COUNTERS = ("calls", "fused_calls", "fallback_calls", "entries_built", "promotions", "torch_calls", "swaps",
            "measured", "stays_on_torch", "ahead_queued", "ahead_built", "ahead_skipped", "ahead_failed")
PLAN_COUNTERS = ("builds", "build_ms", "build_failures", "loads", "load_ms", "load_failures", "executes")


class Job(Future):
    """A Future whose `finished` is a plain attribute: a waiting signature reads it on every call,
    and Future.done() takes a lock. It turns True just before the outcome is set, so a reader that
    sees it waits a moment in result() at most, and whoever waited on the outcome sees it True."""

    finished = False

    def set_result(self, result: Any) -> None:
        self.finished = True
        super().set_result(result)

    def set_exception(self, exception: Optional[BaseException]) -> None:
        self.finished = True
        super().set_exception(exception)


class Preparer:
    """One daemon thread that runs jobs in the order they came and hands each result to its Job."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None  # (in a forked child: not alive, started again)
        self._renew_locks()
        renew_locks_after_fork(self)

    def _renew_locks(self) -> None:
        self._lock = threading.Lock()  # fresh in a forked child: no thread of the parent releases it there

    def submit(self, job: Callable[[], Any]) -> Job:
        future = Job()
        self._jobs.put((job, future))
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
        return future

    def runs_here(self) -> bool:
        """Whether the calling thread is this Preparer's (a job that submits and waits here would wait for ever)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def _loop(self) -> None:
        while True:
            job, future = self._jobs.get()
            try:
                future.set_result(job())
            except BaseException as err:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(err.with_traceback(None))  # its frames would keep the job's tensors alive
            del job, future


class Dispatcher:
    """The runtime's state (see the module docstring). One per process: `dispatcher`."""

    def __init__(self) -> None:
        self._renew_locks()  # the locks named below
        renew_locks_after_fork(self)
        # Decisions. `entries`: one per call signature (entries.key); `by_call`: the same entries by
        # the call as given (entries.fast_key). `lock` guards replacing an entry in both.
        self.entries: OncePerKey[Any] = OncePerKey()
        self.by_call: dict[tuple, Any] = {}
        self.counters: Counter[str] = Counter(dict.fromkeys(COUNTERS, 0))
        # Promotion of bucketed shapes (entries.count_call): calls per problem class, the newest
        # signature of each class, and the calls one pass over a model's layers makes of a shape.
        self.class_calls: Counter[str] = Counter()
        self.newest: dict[str, Any] = {}
        self.class_pass: Counter[str] = Counter()
        # Runner choices by runner key (tiers.py): measured, read from the store or untimed; the keys whose
        # timing failed (a runner or the timing itself), with why; and the timings by key, made once each.
        self.choices: dict[str, Any] = {}
        self.failed_choices: dict[str, str] = {}
        self.timings: OncePerKey[Any] = OncePerKey()
        self.preparer = Preparer("fusedattn-prepare")
        # The thread that allocates the tensors calls keep (streams.persistent): off any CUDA-graph pool.
        self.allocator = Preparer("fusedattn-allocate")
        # Plans (plans.py): by (device, plan key) and by (device, problem, backend, phase); their
        # counters; one workspace per (device, stream).
        self.plans: OncePerKey[Any] = OncePerKey()
        self.plans_by_problem: dict[tuple, Any] = {}
        self.plan_stats: Counter[str] = Counter()
        self.workspaces: dict[tuple[int, int], Any] = {}
        # Why this process can run no cuDNN graph (dense_builds.cudnn_missing): None until checked, "" when it can.
        self.no_cudnn: Optional[str] = None
        # The worker process that builds plans (dense_builds.py), and how many died before answering.
        self.worker: Optional[Any] = None
        self.worker_deaths = 0
        # The worker's build-ahead jobs while they run (dense_builds.queue_ahead; a finished one is counted and
        # forgotten), and the thread that reads the model and queues them (not the preparer: first calls go first).
        self.ahead: set[Future] = set()
        self.ahead_queuer = Preparer("fusedattn-build-ahead")
        # The FP8 path's triton kernels (fp8_kernels.py): the chosen backend, the kernels, per-device facts.
        self.fp8_backend: Optional[str] = None
        self.fp8_kernels: dict[str, Any] = {}
        self.fp8_capable: dict[Any, Any] = {}
        # The compiled module (native/): loaded modules by name (None: did not load), the one whose table
        # attention() asks first (`native_call`), the calls its table ran before last emptied, its background build.
        self.native_names: dict[Any, str] = {}  # source file -> its module's name (a hash, worked out once)
        self.native_loaded: dict[str, Any] = {}
        self.native_table: Optional[Any] = None
        self.native_call: Optional[Callable[..., Any]] = None
        self.native_forgotten_calls = 0
        self.native_build: Optional[Any] = None
        # Held while deciding whether a problem's fallback was logged (`fallbacks_logged`: (problem
        # class key, reason) pairs, forgotten by clear(); entries.log_fallback), or a note of `told` (a key
        # per note said once per process; clear() keeps them).
        self.fallbacks_logged: set[tuple[str, str]] = set()
        self.told: set[str] = set()
        # Per thread: cuDNN handles by device (`handles`, plans.py) and private streams for loading
        # plans (`loading_streams`, streams.py).
        self.per_thread = threading.local()

    def _renew_locks(self) -> None:
        # Fresh in a forked child too (DataLoader workers, pre-fork servers): a lock another thread of the
        # parent held at fork() stays held there for ever, as no thread of the child releases it.
        self.lock = threading.Lock()
        self.choices_lock = threading.Lock()
        self.plan_stats_lock = threading.Lock()
        self.workspace_lock = threading.Lock()
        self.worker_lock = threading.Lock()
        self.ahead_lock = threading.Lock()
        self.native_lock = threading.Lock()
        self.log_lock = threading.Lock()

    def first_time(self, note: str) -> bool:
        """Whether `note` is said for the first time in this process (it counts as said from now on)."""
        with self.log_lock:
            if note in self.told:
                return False
            self.told.add(note)
            return True

    def clear(self) -> None:
        """Forget every decision, count, runner choice and plan (clear_plans): the next call of each
        signature decides again. The loaded compiled module, the worker, the kernels and whether the
        cuDNN frontend is installed stay."""
        self.entries.clear()
        with self.log_lock:
            self.fallbacks_logged.clear()
        with self.lock:
            self.by_call.clear()
        if self.native_table is not None:
            self.native_forgotten_calls = 0
            self.native_table.forget()
        self.class_calls.clear()
        self.newest.clear()
        self.class_pass.clear()
        with self.choices_lock:
            self.choices.clear()
            self.failed_choices.clear()
        self.timings.clear()
        for name in self.counters:
            self.counters[name] = 0
        self.forget_plans()

    def forget_plans(self) -> None:
        """Forget this process's plans (the persistent store keeps their blobs)."""
        self.plans.clear()
        self.plans_by_problem.clear()


dispatcher = Dispatcher()
