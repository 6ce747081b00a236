"""docs/cli.md is generated from the code and must be current."""

from pathlib import Path

from pipeplan.cli.doc import cli_reference


def test_cli_reference_is_current():
    doc = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
    assert doc.read_text() == cli_reference(), "docs/cli.md is stale: python -m pipeplan.cli.doc > docs/cli.md"


def test_cli_reference_lists_every_planner_schedule_preset_and_kind():
    from pipeplan.cluster import KINDS, PRESETS
    from pipeplan.planners.base import planner_catalog
    from pipeplan.schedule.generators import SCHEDULES

    text = cli_reference()
    names = [e["name"] for e in planner_catalog()] + list(SCHEDULES) + list(PRESETS) + [k.name for k in KINDS.values()]
    assert all(f"`{n}`" in text for n in names)
    assert "mobile-hetero-N" in text and "### `pipeplan run`" in text and "`--hang-timeout" in text
