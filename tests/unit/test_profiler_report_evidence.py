"""A rule's evidence on the report page: tables a person reads, never raw JSON."""

from __future__ import annotations

from shoal.profiler.report import evidence


def test_nested_objects_become_captioned_tables_and_statistics_a_row():
    details = {"algo-1": {"Step:ModeKeys.TRAIN": {
        "step_stats": {"mean": 0.0409123, "max": 0.506, "p50": 0.001213},
        "number_of_outliers": 40, "step_numbers": list(range(20)), "mode": None}}}
    shown, more = evidence.tables(details)
    assert more == 0
    first, stats = shown
    assert first.caption == "algo-1 › Step:ModeKeys.TRAIN" and first.header == ()
    assert dict(first.rows) == {"number of outliers": "40", "mode": "-",
                                "step numbers": "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, ... 8 more"}
    assert stats.caption == "algo-1 › Step:ModeKeys.TRAIN › step stats"
    assert stats.header == ("mean", "max", "p50")
    assert stats.rows == (("0.04091", "0.506", "0.001213"),)


def test_plot_data_and_the_insufficient_data_note_are_left_out():
    shown, _ = evidence.tables({"probs": [0.1] * 50, "binedges": [1, 2], "InsufficientData": "x",
                                "nodes": ["algo-1"], "ranks": 2})
    assert [dict(t.rows) for t in shown] == [{"nodes": "algo-1", "ranks": "2"}]


def test_a_list_of_like_objects_is_one_table_a_row_each():
    shown, _ = evidence.tables({"worst": [{"rank": i, "seconds": 1.5 * i} for i in range(15)]})
    (table,) = shown
    assert table.caption == "worst" and table.header == ("rank", "seconds")
    assert table.rows[:2] == (("0", "0"), ("1", "1.5"))
    assert len(table.rows) == evidence.MAX_LIST + 1 and table.rows[-1] == ("... 3 more", "")


def test_unlike_objects_are_numbered_and_the_table_count_is_bounded():
    items = [{"rank": i, "extra" if i % 2 else "host": f"algo-{i}"} for i in range(40)]
    shown, more = evidence.tables({"worst": items})
    assert len(shown) == evidence.MAX_TABLES and more == 40 - evidence.MAX_TABLES
    assert shown[0].caption == "worst › #1"
    assert dict(shown[1].rows) == {"rank": "1", "extra": "algo-1"}


def test_names_keep_their_case_unless_they_are_snake_case():
    assert evidence.label("number_of_outliers") == "number of outliers"
    assert evidence.label("GPUUtilization") == "GPUUtilization"
    assert evidence.label("Step:ModeKeys.TRAIN") == "Step:ModeKeys.TRAIN"
    assert evidence.cell(True) == "yes" and evidence.cell(3.14159265) == "3.142"
