"""The committed configuration reference is the generator's output."""

from pathlib import Path

from ursa.coordinator.config import CoordinatorConfig
from ursa.tools.docs.config_reference import COMMAND, attribute_docstrings, main, render

PAGE = Path(__file__).resolve().parents[3] / "docs" / "reference" / "configuration.md"


def test_committed_page_matches_the_models() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), (
        f"docs/reference/configuration.md is stale: regenerate it with `{COMMAND}`"
    )


def test_every_key_of_both_configs_is_on_the_page() -> None:
    page = render()
    for key in (
        "min_devices",
        "num_classes",
        "device_id",
        "made_initial_weights",
        "nabla",
    ):
        assert f"| `{key}` |" in page


def test_attribute_docstrings_become_descriptions() -> None:
    docs = attribute_docstrings(CoordinatorConfig)
    assert docs["min_devices"].startswith("Enrolled online devices")
    assert "Enrolled online devices needed before the first key epoch" in render()


def test_every_key_has_a_description() -> None:
    rows = [line for line in render().splitlines() if line.startswith("| `")]
    undescribed = [row.split("|")[1].strip() for row in rows if row.endswith("|  |")]
    assert rows and not undescribed, f"keys without a docstring: {undescribed}"


def test_out_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "configuration.md"
    assert main(["--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render()
