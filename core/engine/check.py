"""``dsahal run --check``: compare a run's logits with the reference backend's, against a documented tolerance.

The reference replays the same requests forced to emit the run's tokens, so both see the same token
sequences and every position's logits are comparable: each prompt position (prefill) and each sampled
position (the last prompt token and every decode step). The measure is the largest absolute logit
difference over all of them divided by the largest reference |logit| (logits of a random-weight model
are O(1-10), so this reads as "a fraction of the logit scale").

Tolerance = :data:`DTYPE_TOLERANCE` of the model dtype + :data:`LATENT_TOLERANCE` of the latent format +
:data:`INDEX_TOLERANCE` of the index format. Why these numbers:

- the dtype term covers a backend computing attention in its own precision while the reference computes
  in float64 and rounds once: measured on correct backends 7e-6 (float32, ``ppu-cpu-twin`` on ``tiny``)
  and 6.8e-3 (bfloat16, ``nvidia`` on ``k31-pro-slice``, H200); the limits leave a margin of ~3x over the
  bfloat16 figure and ~100x over the float32 one;
- the format terms cover one-code rounding differences where a value lands near a rounding tie in a
  quantised cache (a step of the fp8/fp4 grid, amplified through the layers), and the top-k choosing a
  different key between near-equal indexer scores; measured 1e-4 for NVFP4 + MXFP4 on ``tiny``;
- the deliberately broken backends in ``tests/mutants`` land at 1.5e-2 (a cache write touching its
  neighbour) to 1.5e-1 (KDA read before write) on ``tiny`` in float32, far beyond 1e-3.

Deeper models accumulate more: ``--check-tolerance`` overrides the table.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPE_TOLERANCE = {"float32": 1e-3, "float16": 5e-3, "bfloat16": 2e-2}
LATENT_TOLERANCE = {"bf16": 0.0, "fp8": 2e-3, "fp8_ds_mla": 2e-3, "nvfp4": 5e-3}
INDEX_TOLERANCE = {"bf16": 0.0, "fp8": 0.0, "mxfp4": 2e-3}


def check_tolerance(dtype: str, latent_fmt: str, index_fmt: str) -> float:
    """The relative logit tolerance of a run in ``dtype`` with these cache formats (module docstring)."""
    for table, key, what in ((DTYPE_TOLERANCE, dtype, "dtype"), (LATENT_TOLERANCE, latent_fmt, "latent format"),
                             (INDEX_TOLERANCE, index_fmt, "index format")):
        if key not in table:
            raise ValueError(f"dsahal run --check: no tolerance for {what} {key!r}; expected one of {sorted(table)} "
                             f"(pass --check-tolerance to set one)")
    return DTYPE_TOLERANCE[dtype] + LATENT_TOLERANCE[latent_fmt] + INDEX_TOLERANCE[index_fmt]


@dataclass
class _Worst:
    diff: float = 0.0
    where: str = ""


def compare_runs(run, reference, *, tolerance: float) -> dict:
    """Logits of the same requests (the reference forced to the run's tokens), position by position.

    Args:
        run, reference: finished :class:`~dsahal.engine.Request` lists in the same order, recorded with
            ``record_logits`` (and ``record_prompt_logits`` for the prompt positions).
        tolerance: the largest allowed ``max |Δlogit| / max |reference logit|``.

    Returns:
        A JSON-able dict: the largest difference overall, at prompt and at sampled positions, where it
        was, the largest reference |logit|, the relative error, the tolerance, ``passed``, and the greedy
        agreement (sampled positions where the reference's argmax is the run's token; informative only:
        near-ties may disagree within the tolerance).
    """
    worst = {"prompt": _Worst(), "sampled": _Worst()}
    max_logit, agree, sampled, prompt_positions = 0.0, 0, 0, 0
    for ours, theirs in zip(run, reference):
        position = 0
        for a, b in zip(ours.prompt_logits, theirs.prompt_logits):  # [n, vocab] per prefill chunk
            diff = (a - b).abs().amax(dim=1)
            row = int(torch.argmax(diff))
            if float(diff[row]) > worst["prompt"].diff:
                worst["prompt"] = _Worst(float(diff[row]), f"request {ours.request_id}, prompt position {position + row}")
            max_logit = max(max_logit, float(b.abs().max()))
            position += a.shape[0]
            prompt_positions += a.shape[0]
        for step, (a, b) in enumerate(zip(ours.logits, theirs.logits)):
            diff = float((a - b).abs().max())
            if diff > worst["sampled"].diff:
                where = (f"request {ours.request_id}, position {len(ours.prompt) - 1 + step} "
                         f"({'last prompt token' if step == 0 else f'decode step {step}'})")
                worst["sampled"] = _Worst(diff, where)
            max_logit = max(max_logit, float(b.abs().max()))
            agree += int(torch.argmax(b).item() == ours.output[step])
            sampled += 1
    overall = max(worst.values(), key=lambda w: w.diff)
    relative = overall.diff / max_logit if max_logit > 0 else (0.0 if overall.diff == 0 else float("inf"))
    return {"max_abs_logit_diff": overall.diff, "where": overall.where, "max_abs_logit": max_logit,
            "relative_logit_diff": relative, "tolerance": tolerance, "passed": relative <= tolerance,
            "prompt_max_abs_logit_diff": worst["prompt"].diff, "prompt_positions": prompt_positions,
            "sampled_max_abs_logit_diff": worst["sampled"].diff, "positions": sampled, "greedy_agree": agree,
            "greedy_agreement": agree / sampled if sampled else 0.0}


def merge_rank_checks(checks: list[dict]) -> dict:
    """Per-rank :func:`compare_runs` results of a DCP run -> one verdict: the worst rank's figures, with
    every rank's under ``ranks``; passes only if every rank does."""
    worst_rank = max(range(len(checks)), key=lambda r: checks[r]["relative_logit_diff"])
    merged = dict(checks[worst_rank])
    merged["where"] = f"rank {worst_rank}: {merged['where']}" if merged["where"] else ""
    merged["passed"] = all(c["passed"] for c in checks)
    merged["ranks"] = checks
    return merged


def describe_check(check: dict) -> str:
    """The report's --check line(s)."""
    verdict = "within" if check["passed"] else "BEYOND"
    ranks = f" on each of {len(check['ranks'])} ranks (worst shown)" if check.get("ranks") else ""
    itself = (" (the reference backend against itself: this checks the engine's repeatability, not a backend; "
              "pick one with --backend or DSAHAL_BACKEND)") if check.get("backend_under_test", "") is None else ""
    return (f"check vs reference{ranks}{itself}: max |logit difference| {check['max_abs_logit_diff']:.3e} "
            f"({check['relative_logit_diff']:.2e} of max |logit| {check['max_abs_logit']:.2f}), {verdict} the "
            f"tolerance {check['tolerance']:.1e}; over {check['prompt_positions']} prompt positions (max "
            f"{check['prompt_max_abs_logit_diff']:.3e}) and {check['positions']} sampled positions (max "
            f"{check['sampled_max_abs_logit_diff']:.3e}); greedy agreement {check['greedy_agree']}/"
            f"{check['positions']} ({100 * check['greedy_agreement']:.1f}%)")
