"""The plan form of an answer: which graphs the verdicts are about and attention() runs."""

from __future__ import annotations

from dataclasses import dataclass

from fusedattn_select.buckets import Bucket
from fusedattn_select.config import AttnConfig
from fusedattn_select.types import TextEnum


class PlanKind(TextEnum):
    """Which graphs run a problem."""

    AS_ASKED = "as asked"  # the engine answers the problem as given (a snapshot row, a rule, no bucket form)
    DENSE = "dense"  # the problem's own graphs at its exact shape
    BUCKET = "bucket"  # the ragged graphs of its shape bucket
    HEADS_AS_BATCH = "heads as batch"  # a decode step's KV heads as sequences, in that problem's bucket


@dataclass(frozen=True)
class PlanForm:
    """Which graphs run a problem: `kind`; for a bucket, `config` is the bucket form (the problem
    whose graphs run) and `bucket` its dimensions; for heads as batch, `heads` is the problem the
    decode step runs as, and `config` and `bucket` are that problem's bucket."""

    kind: PlanKind
    config: AttnConfig | None = None
    bucket: Bucket | None = None
    heads: AttnConfig | None = None

    @classmethod
    def of_bucket(cls, form: AttnConfig) -> PlanForm:
        return cls(PlanKind.BUCKET, form, Bucket(form.batch_size, form.seqlen_q, form.seqlen_kv))

    def with_heads_as_batch(self, decode: AttnConfig) -> PlanForm:
        """This bucket form, run by a decode step whose heads as batch make the problem `decode`."""
        return PlanForm(PlanKind.HEADS_AS_BATCH, self.config, self.bucket, decode)

    @property
    def runs_bucket(self) -> bool:
        """Whether a bucket's graphs run (by the problem's shape, or its heads as batch)."""
        return self.bucket is not None

    def describe(self) -> str:
        """As users read it: "bucket B=4 S_q=1024 S_kv=1024 (ragged thd_thd_thd, padding)", "dense",
        "heads as batch (...); bucket ..."; "" for an answer about the problem as asked."""
        if self.kind is PlanKind.AS_ASKED:
            return ""
        if self.kind is PlanKind.DENSE:
            return "dense"
        assert self.config is not None and self.bucket is not None
        text = f"bucket {self.bucket.describe()} (ragged {self.config.qkv_layout}, {self.config.mask})"
        if self.heads is None:
            return text
        return (f"{PlanKind.HEADS_AS_BATCH.value} (B={self.heads.batch_size} H=1 S_q={self.heads.seqlen_q}: "
                f"one sequence per KV head); {text}")


AS_ASKED = PlanForm(PlanKind.AS_ASKED)
DENSE = PlanForm(PlanKind.DENSE)
