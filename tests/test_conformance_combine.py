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
    assert "- `indexer_score`: run 2" in notes and "- `topk`: run 1" in notes
    assert settings["ops"] == "combined" and backend["name"] == "nv"

    paths = []
    for i, payload in enumerate((first, second)):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(payload))
    assert combine.main([f"{paths[0]}:commit A", f"{paths[1]}:commit B", "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "conformance.md").read_text()
    assert "2 pass, 0 fail" in text and "`indexer_score`: commit B" in text
    assert json.loads((tmp_path / "out" / "conformance.json").read_text())["versions"] == {"torch": "x"}


@pytest.mark.parametrize("other", [_payload("amd", []), _payload("nv", [], max_examples=3)])
def test_runs_of_another_backend_or_settings_are_refused(other):
    with pytest.raises(ValueError, match="dsahal.conformance.combine"):
        combine.combine([(_payload("nv", []), "a"), (other, "b")])
