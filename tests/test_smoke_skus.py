"""The GPU model table: every row is recognised from nvidia-smi's product names and carries a
source for each floor. Fixtures are synthesized (no GPU machine was lent: see
tests/fixtures/smoke/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.smoke import nvidia, skus

FIXTURES = Path(__file__).parent / "fixtures" / "smoke"

ROW_FIXTURES = {
    "h100-sxm.xml": "H100 SXM",
    "h200-sxm.xml": "H200 SXM",
    "h200-sxm-real.xml": "H200 SXM",  # captured on a real H200 (driver 580.159.04)
    "h100-pcie.xml": "H100 PCIe",
    "h100-nvl.xml": "H100 NVL",
    "h200-nvl.xml": "H200 NVL",
    "a100-sxm4-40gb.xml": "A100 SXM 40GB",
    "a100-sxm4-80gb.xml": "A100 SXM 80GB",
    "a100-pcie-40gb.xml": "A100 PCIe 40GB",
    "a100-pcie-80gb.xml": "A100 PCIe 80GB",
    "l40s.xml": "L40S",
    "l4.xml": "L4",
    "old-layout.xml": "generic",  # a V100: not in the table
}


def inventory(name: str) -> nvidia.Inventory:
    return nvidia.parse((FIXTURES / name).read_text(), name)


def test_every_row_but_generic_has_a_fixture():
    assert {row.name for row in skus.ROWS} == set(ROW_FIXTURES.values())


@pytest.mark.parametrize("fixture,row", sorted(ROW_FIXTURES.items()))
def test_each_fixture_is_recognised_as_its_row(fixture, row):
    found = inventory(fixture)
    assert len(found.gpus) == (1 if "real" in fixture else 2), found.reason  # the real node had one
    assert skus.node_sku(found.gpus).name == row


@pytest.mark.parametrize("name,memory,row", [
    ("NVIDIA H100 80GB HBM3", 81559, "H100 SXM"),
    ("NVIDIA H100 PCIe", 81559, "H100 PCIe"),
    ("NVIDIA H100 NVL", 95830, "H100 NVL"),
    ("NVIDIA H200", 143771, "H200 SXM"),
    ("NVIDIA H200 NVL", 143771, "H200 NVL"),
    ("NVIDIA A100-SXM4-40GB", 40960, "A100 SXM 40GB"),
    ("NVIDIA A100-SXM4-80GB", 81920, "A100 SXM 80GB"),
    ("NVIDIA A100 80GB PCIe", 81920, "A100 PCIe 80GB"),
    ("NVIDIA A100-PCIE-40GB", 40960, "A100 PCIe 40GB"),
    ("NVIDIA A100-SXM4", 81920, "A100 SXM 80GB"),  # no size in the name: the memory decides
    ("NVIDIA A100-SXM4", 40960, "A100 SXM 40GB"),
    ("NVIDIA L40S", 46068, "L40S"),
    ("NVIDIA L4", 23034, "L4"),
    # Look-alikes whose floors differ: the generic row, not a wrong one.
    ("NVIDIA L40", 46068, "generic"),
    ("NVIDIA GH200 480GB", 97871, "generic"),
    ("NVIDIA H800", 81559, "generic"),
    ("NVIDIA A800-SXM4-80GB", 81920, "generic"),
    ("Tesla V100-SXM2-32GB", 32510, "generic"),
    (None, None, "generic"),
])
def test_product_names_map_to_rows(name, memory, row):
    assert skus.sku_for(name, memory).name == row


def test_every_floor_of_every_row_names_its_source():
    for row in skus.ROWS:
        for field in skus.FLOOR_FIELDS:
            threshold = getattr(row, field)
            assert threshold is not None and threshold.value > 0 and threshold.source, (row.name, field)


def test_h100_and_h200_floors_are_the_issues_figures():
    assert skus.H100_SXM.bf16_tflops.value == 560 and skus.H100_SXM.copy_gbps.value == 1900
    assert skus.H100_SXM.busbw_gbps.value == 460 and skus.H200_SXM.busbw_gbps.value == 431
    assert skus.H100_SXM.h2d_gbps.value == 48 and skus.H100_SXM.p2p_gbps.value == 316


def test_a_node_without_gpus_gets_the_generic_floors():
    row = skus.node_sku([])
    assert row.name == "generic"
    assert (row.bf16_tflops.value, row.copy_gbps.value, row.busbw_gbps.value) == (100, 500, 10)


def test_a_mixed_node_says_so_and_is_held_to_its_weakest_model():
    row = skus.node_sku(inventory("mixed.xml").gpus)
    assert row.name == "mixed: H100 SXM + A100 SXM 40GB"
    assert row.bf16_tflops.value == skus.A100_SXM_40.bf16_tflops.value
    assert row.copy_gbps.value == skus.A100_SXM_40.copy_gbps.value
    assert row.h2d_gbps.value == 22 and row.p2p_gbps.value == 210
    assert row.bf16_tflops.source.startswith("mixed node, weakest: A100 SXM 40GB")
