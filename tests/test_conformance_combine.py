"""`python -m dsahal.conformance.combine`: a later run's op families replace the earlier run's, whole."""
import json

import pytest

from dsahal.conformance import combine


def _payload(backend, tests, **settings):
    return {"backend": {"name": backend}, "versions": {"torch": "x"},
            "settings": {"max_examples": 10, "seed": 1, "ops": "all", "jobs": 4, **settings},
            "tests": [dict(id=f"{op}-{prop}", nodeid=f"{op}-{prop}", op=op, property=prop, format="-",
                           backend=backend, outcome=outcome) for op, prop, outcome in tests]}


def test_later_runs_replace_whole_op_families(tmp_path):
    first = _payload("nv", [("topk", "a", "pass"), ("indexer_score", "a", "fail"), ("indexer_score", "b", "pass")])
    second = _payload("nv", [("indexer_score", "a", "pass")], ops=["indexer_score"], jobs=1)
    records, backend, settings, notes = combine.combine([(first, "run 1"), (second, "run 2")])
    assert sorted((r.op, r.property, r.outcome) for r in records) == [("indexer_score", "a", "pass"),
                                                                     ("topk", "a", "pass")]
    assert "- `indexer_score`: run 2 (seed 1)" in notes and "- `topk`: run 1 (seed 1)" in notes
    assert settings["ops"] == "combined" and backend["name"] == "nv"

    paths = []
    for i, payload in enumerate((first, second)):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(payload))
    assert combine.main([f"{paths[0]}:commit A", f"{paths[1]}:commit B", "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "conformance.md").read_text()
    assert "2 pass, 0 fail" in text and "`indexer_score`: commit B (seed 1)" in text
    assert json.loads((tmp_path / "out" / "conformance.json").read_text())["versions"] == {"torch": "x"}


@pytest.mark.parametrize("other", [_payload("amd", []), _payload("nv", [], max_examples=3)])
def test_runs_of_another_backend_or_settings_are_refused(other):
    with pytest.raises(ValueError, match="dsahal.conformance.combine"):
        combine.combine([(_payload("nv", []), "a"), (other, "b")])


def test_runs_with_their_own_seeds_combine_naming_each_familys_seed():
    first = _payload("nv", [("topk", "a", "pass")], seed=7)
    second = _payload("nv", [("indexer_score", "a", "pass")], seed=11)
    records, _, settings, notes = combine.combine([(first, "run 1"), (second, "run 2")])
    assert len(records) == 2 and settings["seed"] == [7, 11]
    assert "- `topk`: run 1 (seed 7)" in notes and "- `indexer_score`: run 2 (seed 11)" in notes


@pytest.mark.parametrize("case", ["missing", "not json", "other backend"])
def test_an_error_is_one_line_and_status_2(tmp_path, capsys, case):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_payload("nv", [("topk", "a", "pass")])))
    bad = tmp_path / "bad.json"
    if case == "not json":
        bad.write_text("{nope")
    elif case == "other backend":
        bad.write_text(json.dumps(_payload("amd", [("topk", "a", "pass")])))
    assert combine.main([str(good), str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: dsahal.conformance.combine"), err
    assert not (tmp_path / "out").exists()
