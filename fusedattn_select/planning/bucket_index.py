"""Which shape bucket answers (and runs) a problem: the buckets a selector learned were answered
"yes", by problem class, looked for in the store once per class and bucket, and remembered answers."""

from __future__ import annotations

import threading

from fusedattn_select import offpath
from fusedattn_select.buckets import Bucket, bucket_form, larger_buckets
from fusedattn_select.config import AttnConfig
from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.store import protocol
from fusedattn_select.types import Fingerprint

# Answers and bucket forms remembered before each memo starts over.
_MEMO_SIZE = 65536
_MISSING = object()  # a memo's "not remembered" (None is a remembered answer: no bucket form)


def _bucket(form: AttnConfig) -> Bucket:
    return Bucket(form.batch_size, form.seqlen_q, form.seqlen_kv)


class BucketIndex:
    """The bucket forms a Selector answers problems by (thread-safe for its callers' use)."""

    def __init__(self, store: protocol.Store | None, fingerprint: Fingerprint) -> None:
        self._store = store
        self._fingerprint = fingerprint
        self._renew_locks()
        renew_locks_after_fork(self)
        self._selected: dict[str, list[Bucket]] = {}  # buckets answered "yes", by problem class
        self._scanned: set[tuple[str, Bucket]] = set()  # (class, bucket) looked up in the store
        self._changes = 0  # buckets learned or forgotten so far: remembered answers hold until it moves
        self._answers: dict[tuple[str, int, int], AttnConfig | None] = {}
        self._forms: dict[tuple[str, Bucket], AttnConfig | None] = {}

    def _renew_locks(self) -> None:
        self._lock = threading.Lock()  # fresh in a forked child: no thread of the parent releases it there

    def find(self, cfg: AttnConfig) -> AttnConfig | None:
        """The smallest bucket of `cfg`'s class answered "yes" (here, or in the store) that holds its
        shape, else its own bucket; None when it has no bucket form."""
        if offpath.limit() == offpath.MEMORY:  # no store reads: answered by what memory holds, not remembered
            return self._find(cfg, scan=False)
        memo_key = (cfg.cache_key(), len(self._scanned), self._changes)
        # One read (get, not `in` then a subscript): another thread may clear the memo in between.
        remembered = self._answers.get(memo_key, _MISSING)
        if remembered is not _MISSING:
            return remembered
        form = self._find(cfg)
        if len(self._answers) >= _MEMO_SIZE:
            self._answers.clear()
        # Filed under the state it was read in: a bucket learned or forgotten meanwhile (by another
        # thread, or this lookup's own store scan) moves the key, and the next lookup looks again.
        self._answers[memo_key] = form
        return form

    def remember(self, form: AttnConfig) -> None:
        """A bucket form answered "yes": shapes of its class it holds are answered by it."""
        with self._lock:
            held = self._selected.setdefault(form.shape_class_key(), [])
            if _bucket(form) not in held:
                held.append(_bucket(form))
                self._changes += 1

    def forget(self, form: AttnConfig) -> None:
        """A bucket form no longer answers "yes" (its plans failed to build)."""
        with self._lock:
            held = self._selected.get(form.shape_class_key(), [])
            if _bucket(form) in held:
                held.remove(_bucket(form))
                self._changes += 1

    def clear(self) -> None:
        with self._lock:
            self._selected.clear()
            self._scanned.clear()
            self._answers.clear()
            self._changes += 1

    def _find(self, cfg: AttnConfig, scan: bool = True) -> AttnConfig | None:
        own = self._form(cfg)
        if own is None:
            return None
        held = self._selected.get(own.shape_class_key(), ())
        holding = [b for b in held if b.holds(cfg.batch_size, cfg.seqlen_q, cfg.seqlen_kv)]
        if holding:
            return self._form(cfg, min(holding, key=lambda b: (b.batch * b.seqlen_q * b.seqlen_kv, b.batch)))
        return (self._stored(cfg, own) if scan else None) or own

    def _form(self, cfg: AttnConfig, bucket: Bucket | None = None) -> AttnConfig | None:
        """bucket_form(cfg, bucket), one instance per problem class and bucket (its keys computed once)."""
        bucket = bucket or Bucket.of(cfg.batch_size, cfg.seqlen_q, cfg.seqlen_kv)
        key = (cfg.shape_class_key(), bucket)
        form = self._forms.get(key, _MISSING)
        if form is _MISSING:
            if len(self._forms) >= _MEMO_SIZE:
                self._forms.clear()
            form = self._forms[key] = bucket_form(cfg, bucket)
        return form

    def _stored(self, cfg: AttnConfig, own: AttnConfig) -> AttnConfig | None:
        """The smallest bucket of `cfg`'s class, its own first, the store already answered "yes"
        (warmed by another process, or built ahead), looked for once per class and bucket; None
        when there is none."""
        scan = (own.shape_class_key(), _bucket(own))
        if self._store is None or scan in self._scanned:
            return None
        self._scanned.add(scan)
        for bucket in [_bucket(own), *larger_buckets(_bucket(own))]:
            form = self._form(cfg, bucket)
            stored = self._store.get(self._fingerprint, form.cache_key())
            if stored is not None and all(v.supported for v in stored[0]):
                self.remember(form)
                return form
        return None
