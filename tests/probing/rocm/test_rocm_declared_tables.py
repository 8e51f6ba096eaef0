"""The declared tables agree with the pinned copies of their upstream sources (a drift fails here)."""

from __future__ import annotations

import ast
import csv
import json
import re
import shutil
from pathlib import Path

import pytest

from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.probing.rocm.rocm_engine import DeclaredRocmEngine
from fusedattn_select.probing.rocm.tables import DECLARED_DIR, TABLE_NAMES, load_table
from fusedattn_select.types import Outcome, Phase, ProbeDepth

# A source's `pinned` path is relative to the repository root; the copies live in tests/data only.
REPOSITORY = Path(__file__).resolve().parents[3]
PINNED_DIR = REPOSITORY / "tests" / "data" / "rocm_sources"


def pinned_text(table, name_part: str) -> str:
    (source,) = [s for s in table.sources if name_part in s.pinned]
    return (REPOSITORY / source.pinned).read_text(encoding="utf-8")


def python_assignments(text: str) -> dict:
    return {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(text).body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
    }


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_every_source_names_a_commit_and_its_pinned_copy_exists(name):
    table = load_table(name)
    for source in table.sources:
        assert re.fullmatch(r"[0-9a-f]{40}", source.commit), source
        assert source.repository and source.path
        pinned = REPOSITORY / source.pinned
        assert pinned.is_relative_to(PINNED_DIR) and pinned.is_file(), source.pinned


def test_every_pinned_copy_is_cited_by_a_table():
    cited = {REPOSITORY / s.pinned for name in TABLE_NAMES for s in load_table(name).sources}
    copies = {p for p in PINNED_DIR.rglob("*") if p.is_file() and p.name != "README.md"}
    assert copies == cited


def test_the_tables_answer_the_same_without_the_pinned_copies(tmp_path):
    for path in DECLARED_DIR.glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
    cfg = AttnConfig(batch_size=2, num_heads_q=16, num_heads_kv=16, seqlen_q=4096, seqlen_kv=4096,
                     head_dim_qk=128, mask="causal_bottom_right", is_training=False)
    alone, shipped = (
        DeclaredRocmEngine("gfx942", directory=d).probe(cfg, cfg.candidate, Phase.FORWARD, ProbeDepth.FAST)
        for d in (str(tmp_path), str(DECLARED_DIR))
    )
    assert (alone.outcome, alone.stage) == (Outcome.SUPPORTED, "declared:hipdnn_sdpa")
    assert (alone.message, alone.detail) == (shipped.message, shipped.detail)


def test_the_package_holds_the_declared_tables_and_no_source_copies():
    assert sorted(p.name for p in DECLARED_DIR.iterdir()) == sorted(f"{name}.json" for name in TABLE_NAMES)


def test_an_unknown_table_name_is_refused():
    with pytest.raises(ConfigError, match="table='cudnn'"):
        load_table("cudnn")


# ----- CK Tile FMHA ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ck():
    table = load_table("ck_fmha")
    specs = json.loads(pinned_text(table, "fmha_arch_specs.json"))
    symbols = python_assignments(pinned_text(table, "symbol_map_excerpt.py.txt"))
    return table.facts, specs, symbols, pinned_text(table, "validation_excerpt.py.txt")


def test_ck_architectures_match_the_arch_specs(ck):
    facts, specs, _, _ = ck
    assert set(facts["architectures"]) == set(specs["architectures"])
    for arch, info in specs["architectures"].items():
        ours = facts["architectures"][arch]
        assert list(ours["dtypes"]) == info["supported_dtypes"], arch
        assert ours["backward"] == ("bwd" in info["supported_pipelines"]), arch
        assert ours["paged_kv"] == ("qr_pagedkv" in info["supported_pipelines"]), arch


def test_ck_forward_head_dims_are_the_spec_pairs_of_every_forward_dtype(ck):
    facts, specs, symbols, _ = ck
    expected = {d: pairs for d, pairs in specs["supported_hdims"].items() if d in symbols["FWD_DTYPE_MAP"]}
    assert {d: [list(p) for p in pairs] for d, pairs in facts["forward_head_dims"].items()} == expected
    assert list(facts["forward_dtypes"]) == list(symbols["FWD_DTYPE_MAP"])


def test_ck_backward_dtypes_and_head_dims_match_the_backward_tiles(ck):
    facts, specs, symbols, _ = ck
    assert list(facts["backward_dtypes"]) == list(symbols["BWD_DTYPE_MAP"])
    tiles = specs["bwd_tiles"]
    keys = set(tiles["dq_dk_dv_fp16"]) | set(tiles["dq_dk_dv_extra"])
    expected = sorted(tuple(map(int, k.split("_"))) for k in keys)
    assert sorted(tuple(p) for p in facts["backward_head_dims"]) == expected


def test_ck_global_rules_bias_kinds_and_warnings_match_the_sources(ck):
    facts, specs, symbols, validation = ck
    assert facts["head_dim_multiple_of"] == specs["global_rules"]["hdim_divisible_by"]
    assert "Head dimensions must be multiples of {divisor}" in validation
    assert set(facts["bias_tokens"].values()) <= set(symbols["BIAS_CANONICAL"].values())
    assert set(facts["mask_kinds"]) == set(symbols["MASK_CANONICAL"].values())
    for warning in facts["warnings"]:
        assert specs["global_rules"]["hdim_192_128_no_bias_dropout"]
        assert warning["text"] in validation


def test_ck_dtype_tokens_name_declared_ck_dtypes(ck):
    facts, specs, _, _ = ck
    all_dtypes = {d for info in specs["architectures"].values() for d in info["supported_dtypes"]}
    assert {t["token"] for t in facts["dtype_tokens"]} <= all_dtypes


# ----- hipDNN SDPA ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hipdnn():
    table = load_table("hipdnn_sdpa")
    return table, {name: pinned_text(table, name) for name in (
        "gfx942_fmha_fwd.csv", "gfx950_fmha_fwd.csv", "SdpaFwdPlanBuilder", "SdpaBwdPlanBuilder", "SdpaPlanUtils")}


def test_hipdnn_mask_ordinals_match_the_mask_enum(hipdnn):
    table, texts = hipdnn
    enum = {name.lower(): int(value) for name, value in re.findall(r"(\w+) = (\d+)", texts["SdpaPlanUtils"])}
    assert dict(table.facts["mask_ordinals"]) == enum


def test_hipdnn_forward_kernels_are_the_rows_of_the_pinned_csvs(hipdnn):
    table, texts = hipdnn
    ordinal_to_mask = {v: k for k, v in table.facts["mask_ordinals"].items()}
    rows = set()
    for arch in ("gfx942", "gfx950"):
        for row in csv.DictReader(texts[f"{arch}_fmha_fwd.csv"].splitlines()):
            mode = {"0": "batch", "1": "group"}[row["mode"]]
            rows.add((arch, row["dtype"], int(row["hdim_q"]), int(row["hdim_v"]), ordinal_to_mask[int(row["mask"])], mode))
    ours = {(k["arch"], k["dtype"], k["head_dim_qk"], k["head_dim_v"], k["mask"], k["mode"]) for k in table.facts["forward"]["kernels"]}
    assert ours == rows


def test_hipdnn_forward_gates_match_is_applicable(hipdnn):
    table, texts = hipdnn
    fwd, source = table.facts["forward"], texts["SdpaFwdPlanBuilder"]
    assert set(fwd["architectures"]) == set(re.findall(r'deviceString != "(gfx\w+)"', source))
    identifiers = re.search(r"std::string getDataTypeIdentifier\(.*?\n}\n", source, re.S).group(0)
    assert {t["token"] for t in fwd["dtype_tokens"]} == set(re.findall(r'return "(\w+)";', identifiers))
    for key in fwd["rejects"]:
        assert REJECT_MESSAGES[key] in source, key


def test_hipdnn_backward_gates_match_is_applicable(hipdnn):
    table, texts = hipdnn
    bwd, source = table.facts["backward"], texts["SdpaBwdPlanBuilder"]
    assert set(bwd["architectures"]) == set(re.findall(r'deviceString != "(gfx\w+)"', source))
    assert list(bwd["head_dims_checked"]) == [int(d) for d in re.findall(r"headDimQk != (\d+)", source)]
    assert "hd64, whose\n    // registry carries only pddv=0 rows" in source and list(bwd["head_dims_without_kernel_row"]) == [64]
    assert set(bwd["dtypes"]) == set(re.findall(r'return std::string\("(\w+)"\);', source))
    assert list(bwd["verified_head_dims"]) == [int(d) for d in re.findall(r"hdimQ == (\d+)", source)]
    assert list(bwd["masks"]) == ["no_mask"] and "maskType != MaskType::NO_MASK" in source
    assert bwd["symmetric_head_dims"] and "Asymmetric head dimensions not supported" in source
    for key in bwd["rejects"]:
        assert REJECT_MESSAGES[key] in source, key


REJECT_MESSAGES = {
    "dropout": "dropout_probability must be unset or zero",
    "alibi": "alibi_mask must be false",
    "padding_mask": "padding_mask must be false",
    "attn_mask": "attn_mask tensor not supported",
    "paged_kv": "page_table_k tensor not supported",
    "stats_output": "Stats output not supported",
    "group_mode": "group mode (seq_len_q_tensor_uid or seq_len_kv_tensor_uid set) is not supported",
    "bias_gradient": "dbias tensor not supported",
}


# ----- PyTorch SDPA on ROCm --------------------------------------------------------------------
@pytest.fixture(scope="module")
def sdpa():
    table = load_table("pytorch_sdpa")
    return table.facts, pinned_text(table, "sdp_utils_rocm_excerpt.cpp")


def test_sdpa_head_dim_limits_match_aotriton_max_hdim(sdpa):
    facts, source = sdpa
    limit = int(re.search(r"AOTRITON_VERSION_INT\(0, 9\)\n\s+return (\d+);", source).group(1))
    prefix, capped = re.search(r'starts_with\("(gfx\d+)"\)\) \{\n\s+return (\d+);', source).groups()
    for kernel in facts["kernels"].values():
        assert kernel["max_head_dim"] == limit
        assert dict(kernel["max_head_dim_by_arch_prefix"]) == {prefix: int(capped)}


def test_sdpa_flash_rules_match_its_constraints(sdpa):
    facts, source = sdpa
    flash = facts["kernels"]["flash"]
    assert "check_for_attn_mask," in source and flash["attn_mask"] is False
    assert "check_flash_causal_non_square_seqlens," in source and flash["causal_needs_equal_seqlens"]
    assert "backend_supports_grouped_query_attention = true" in source and flash["grouped_query"]
    assert "query_size_last == key_size_last && query_size_last == value_size_last &&\n      query_size_last <= max_size" in source
    assert flash["head_dims_equal"] == "qkv"
    assert list(flash["dtypes"]) == ["fp16", "bf16"] and "({at::kHalf, at::kBFloat16})" in source


def test_sdpa_efficient_rules_match_its_rocm_constraints(sdpa):
    facts, source = sdpa
    efficient = facts["kernels"]["efficient"]
    rocm_gqa = re.search(r"#ifdef USE_ROCM\n\s+constexpr bool supports_gqa = (\w+);", source).group(1)
    assert efficient["grouped_query"] is (rocm_gqa == "true")
    assert efficient["head_dim_multiple_of"] == int(re.search(r"is_half \? (\d+) : 4", source).group(1))
    assert efficient["attn_mask"] and "Efficient attention on ROCm requires attn_mask be boolean" in source
    assert efficient["head_dims_equal"] == "qk"
    assert set(efficient["dtypes"]) <= {"fp16", "bf16"} and "{at::kHalf, at::kFloat, at::kBFloat16}" in source
