"""`python -m dsahal.bench.profile`: the cases it profiles exist in the bench."""


def test_profile_targets_name_existing_bench_rows():
    """`python -m dsahal.bench.profile --targets` selects bench rows by 'name | shape': a renamed row
    would silently drop out of the profile."""
    from dsahal.bench.cases import all_cases
    from dsahal.bench.profile import TARGET_CASES

    rows = {f"{c.name} | {c.shape}" for c in all_cases()}
    assert set(TARGET_CASES) <= rows
