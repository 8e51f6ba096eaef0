"""The live path and the snapshot path give the same answer for the same shape (issue 36).

50 shapes (seeded) of problem classes a snapshot recorded over their bucket ladders: each class's own
recorded shape and other batch sizes and lengths it never recorded, each landing in a recorded rung.
For each, select() on the live device (a fresh selector: nothing learned yet, so it answers by the
bucket a first call runs in), asked at the depth the snapshot answered at, and select() from the
snapshot must give the same verdict per backend and phase: outcome and stage (and cuDNN's message for
a rejection).

The snapshot is the bundled one of this device when its device name, cuDNN and cudnn-frontend match
and it holds ladders; otherwise the classes are recorded here first, with the project's recorder,
so the comparison runs on any GPU. A shape the snapshot answers "no data" must be one whose recorded
bucket cuDNN rejected (live then answers by the shape's own graphs, which no snapshot holds for an
unrecorded shape); every other shape is compared. With $OUT set, every shape's two answers are
written to $OUT/snapshot_live.json.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from fusedattn_select.buckets import Bucket, bucket_form, ladder
from fusedattn_select.config import AttnConfig
from fusedattn_select.config_files import load_config_file
from fusedattn_select.errors import ConfigError, SnapshotError
from fusedattn_select.planning.forms import PlanKind
from fusedattn_select.probing.choice import TARGETS, bundled_snapshot
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.recorder import Ladder, record_snapshot, write_snapshot
from fusedattn_select.selection.selector import Selection, Selector
from fusedattn_select.types import ProbeDepth

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SEED = 36
CLASSES, SHAPES_PER_CLASS = 10, 5
# Where the classes come from: real models (configs/, the config.json corpus), as recorded in the
# bundled <target>-configs.json and <target>-models.json.
SOURCES = sorted((ROOT / "configs").glob("*.yaml")) + [ROOT / "probes" / "hf-models.yaml"]
SAME_PLATFORM = ("device_name", "cudnn_backend_version", "cudnn_frontend_version")


def _bundled(live) -> list[Path]:
    """This device's bundled configs and models snapshots when they were recorded here, with ladders."""
    fingerprint = live.fingerprint()
    for target in TARGETS:
        paths = [bundled_snapshot(target, suite) for suite in ("configs", "models")]
        paths = [p for p in paths if p.is_file()]
        try:
            recorded = SnapshotEngine.load_many(paths).fingerprint() if paths else None
        except SnapshotError:
            continue
        same = recorded is not None and all(getattr(recorded, f) == getattr(fingerprint, f) for f in SAME_PLATFORM)
        if same and all("buckets" in json.loads(p.read_text()) for p in paths):
            return paths
    return []


def _record_here(live, tmp_path: Path) -> list[Path]:
    """CLASSES classes of SOURCES (seeded), recorded on this device over their ladders."""
    entries, seen = [], set()
    for path in SOURCES:
        for entry in load_config_file(path).entries:
            form = bucket_form(entry.config)
            if form is not None and form.shape_class_key() not in seen:
                seen.add(form.shape_class_key())
                entries.append({"name": f"{path.stem}/{entry.name}", **entry.config.to_dict()})
    chosen = random.Random(SEED).sample(entries, CLASSES)
    suite = tmp_path / "live-classes.yaml"
    suite.write_text(json.dumps({"name": "live-classes", "configs": chosen}))  # JSON is YAML
    data = record_snapshot([suite], live, depth="fast", ask_torch=False, ladder=Ladder())
    return [write_snapshot(data, tmp_path / "live-classes.json")]


Class = tuple[AttnConfig, list[Bucket], bool]


def _classes(paths: list[Path]) -> list[Class]:
    """Each laddered class of the files: its recorded entry, the rungs its ladder recorded, and whether
    cuDNN accepted the bucket of the entry's own shape."""
    found: dict[str, Class] = {}
    for path in paths:
        data = json.loads(path.read_text())
        for group in data.get("buckets", []):
            cfg = AttnConfig.from_dict(data["entries"][group["entry"]]["config"])
            own = Bucket.of(cfg.batch_size, cfg.seqlen_q, cfg.seqlen_kv)
            accepted = all(group["verdicts"][i]["outcome"] == "supported"
                           for r in group["rungs"] if Bucket(*r[:3]) == own for i in r[3:])
            found.setdefault(bucket_form(cfg).shape_class_key(),
                             (cfg, [Bucket(*r[:3]) for r in group["rungs"]], accepted))
    return [found[key] for key in sorted(found)]


def _pick(classes: list[Class], rng: random.Random) -> list[Class]:
    """CLASSES classes: two whose own bucket cuDNN rejected where there are such (their unrecorded
    shapes are no data, their recorded shape compares dense answers), the rest accepted ones."""
    rejected = [c for c in classes if not c[2]]
    chosen = rng.sample(rejected, min(2, len(rejected)))
    accepted = [c for c in classes if c[2]]
    return chosen + rng.sample(accepted, min(CLASSES - len(chosen), len(accepted)))


def _inside(rng: random.Random, high: int) -> int:
    """A length or batch size whose bucket is `high` (a rung's value)."""
    return 1 if high == 1 else rng.randint(2 if high <= 64 else high // 2 + 1, high)


def _shapes(classes, rng: random.Random) -> list[AttnConfig]:
    """SHAPES_PER_CLASS shapes of CLASSES classes: the recorded shape, then shapes in random recorded rungs."""
    shapes = []
    for cfg, rungs, _ in _pick(classes, rng):
        shapes.append(cfg)
        mine = [b for b in rungs if b in ladder(cfg)]  # this class's own kind (self- or cross-attention)
        while len(shapes) % SHAPES_PER_CLASS:
            rung = rng.choice(mine)
            seqlen_kv = _inside(rng, rung.seqlen_kv)
            seqlen_q = seqlen_kv if cfg.seqlen_q == cfg.seqlen_kv else _inside(rng, rung.seqlen_q)
            try:
                shapes.append(cfg.replace(batch_size=_inside(rng, rung.batch), seqlen_q=seqlen_q, seqlen_kv=seqlen_kv))
            except ConfigError:  # a shape this class cannot have (the draw goes on, seeded)
                continue
    return shapes


def _label(cfg: AttnConfig) -> str:
    return (f"B={cfg.batch_size} S_q={cfg.seqlen_q} S_kv={cfg.seqlen_kv} of h{cfg.num_heads_q}/{cfg.num_heads_kv} "
            f"d{cfg.head_dim_qk} {cfg.qkv_dtype} {cfg.mask} training={cfg.is_training} (class {cfg.shape_class_key()[:8]})")


def _answer(sel: Selection) -> list[dict]:
    return [{"backend": v.backend.value, "phase": v.phase.value, "outcome": v.outcome.value, "stage": v.stage,
             "depth": v.depth.value, "message": v.message} for v in sel.verdicts]


def _differences(live: Selection, recorded: Selection) -> list[str]:
    got, want = _answer(live), _answer(recorded)
    if [(g["backend"], g["phase"]) for g in got] != [(w["backend"], w["phase"]) for w in want]:
        return [f"graphs differ: live {got} != snapshot {want}"]
    # A rejection must agree in cuDNN's message too (the same graph was asked both times).
    return [f"{g['backend']} {g['phase']}: live {g['outcome']} at {g['stage']} ({g['message']}) != "
            f"snapshot {w['outcome']} at {w['stage']} ({w['message']})"
            for g, w in zip(got, want)
            if (g["outcome"], g["stage"]) != (w["outcome"], w["stage"])
            or (g["outcome"] != "supported" and g["message"] != w["message"])]


def test_live_select_agrees_with_the_snapshot_on_50_shapes_of_recorded_classes(cudnn_engine, tmp_path):
    paths = _bundled(cudnn_engine) or _record_here(cudnn_engine, tmp_path)
    snapshot = Selector(SnapshotEngine.load_many(paths))
    shapes = _shapes(_classes(paths), random.Random(SEED))
    assert len(shapes) == CLASSES * SHAPES_PER_CLASS
    rows, failures, unexplained = [], [], []
    for shape in shapes:
        recorded = snapshot.select(shape)
        # Asked at the deepest depth the snapshot answered at (configs entries are recorded at full or
        # verify, rungs at fast); a fresh selector has learned nothing: it answers by the bucket a
        # first call runs in.
        depths = {v.depth for v in recorded.verdicts}
        depth = next((d for d in reversed(ProbeDepth) if d in depths), ProbeDepth.FAST)
        live = Selector(cudnn_engine).select(shape, depth)
        row = {"config": shape.to_dict(), "live": _answer(live), "live_plan_form": live.plan_form,
               "snapshot": _answer(recorded), "snapshot_plan_form": recorded.plan_form,
               "snapshot_bucket": recorded.plan.kind is PlanKind.BUCKET}
        rows.append(row)
        if recorded.no_data:
            form = snapshot.bucket_for(shape)
            if form is None or snapshot.select(form).selected:
                unexplained.append(f"{_label(shape)}: no data, yet its bucket was recorded as selected or not at all")
            continue
        failures += [f"{_label(shape)}: {d}" for d in _differences(live, recorded)]
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "snapshot_live.json").write_text(json.dumps(
            {"snapshots": [p.name for p in paths], "device": cudnn_engine.fingerprint().describe(), "shapes": rows},
            indent=1))
    compared = sum(1 for r in rows if not any(v["outcome"] == "no_data" for v in r["snapshot"]))
    unrecorded = sum(1 for r in rows if r["snapshot_bucket"])
    assert failures == [] and unexplained == []
    # Most shapes are compared, most of them shapes the snapshot never recorded (answered from a bucket).
    assert compared >= 30 and unrecorded >= 20, f"{compared} shapes compared, {unrecorded} of them from buckets"
