"""Synthetic checkpoints in every public layout ``dsahal run --weights`` loads, run with ``--check`` on a backend.

Usage (from the repository with dsahal importable)::

    python3 scripts/h200/model_check.py [--backend nvidia] [--keep DIR]   # on the H200
    python3 scripts/h200/model_check.py --cpu-smoke                        # on a CPU: the reference backend

For each layout, seeded weights (``dsahal.model.init_weights``) are written into a temporary directory
by the library's own writer (``dsahal.model.checkpoint.save_checkpoint``, the one the checkpoint tests
load from) and ``dsahal run --weights DIR --check`` runs on them in this process:

- ``deepseek-v3.2 bf16``: DeepSeek-V3.2 names (``model.layers.N.self_attn.q_a_proj``, ``indexer.wq_b``,
  ``mlp.experts.E.gate_proj``...), 2 shards + ``model.safetensors.index.json``;
- ``deepseek-v3.2 fp8``: the same with the projections in FP8 e4m3 and 128x128 ``_scale_inv`` blocks
  (dequantised on load); hidden size 160, so blocks at the edges are partial;
- ``k3-hybrid bf16`` / ``k3-hybrid fp8``: the K3-style hybrid (3 KDA layers with fla's names and short
  convolutions stored ``[D, 1, K]``, then MLA + DSA), MoE from layer 1, sharded the same way.

Selections are made total so that the comparison is continuous: ``index_topk`` covers every position
(the indexer and top-k kernels still run and select, but no near-tie can flip which tokens attend) and
every token routes to every expert (``num_experts_per_tok = n_routed_experts``, all groups kept; the
router's weights still scale each expert). With the presets' sparse selections (top-k 64 of ~100
positions, 2 of 8 experts), a bf16 run and the float64 reference pick different tokens and experts at
near-ties, and their logits then differ by far more than any kernel error (H200, 2026-12-01: 0.2-0.56
of the largest logit): that measures the model's sensitivity to rounding, not the backend. The
selection kernels' exactness on identical scores is the conformance suite's job.

``--check`` replays every run on the float64 reference and compares every prompt and sampled
position's logits against the tolerance of the run's dtype (README, ``dsahal run``). A bf16 layout
must also emit the tokens of the run on the seeded weights it was written from (the checkpoint held
exactly those weights). One table: layout, backend, tokens, max |logit error| / max |logit| vs the
reference, tolerance, pass/fail. A failure exits 1 with one ``error:`` line. Under 2 minutes on an
H200 (tiny models; most of it Triton compiles).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import sys
import tempfile
import time
from pathlib import Path

RUN = ["--batch", "2", "--prompt-len", "96", "--decode", "4", "--block-tokens", "16", "--seed", "0"]
MOE = dict(n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=64, n_group=2,
           topk_group=1, routed_scaling_factor=2.5, first_k_dense_replace=1)


def total_selection(config):
    """Every position attended (top-k >= the run's context) and every expert used (see the docstring)."""
    context = int(RUN[RUN.index("--prompt-len") + 1]) + int(RUN[RUN.index("--decode") + 1])
    changes = dict(index_topk=max(config.index_topk, 1 << (context - 1).bit_length()))
    if config.n_routed_experts:
        changes.update(num_experts_per_tok=config.n_routed_experts, topk_group=config.n_group)
    return dataclasses.replace(config, **changes)


def layouts():
    """(name, config, fp8) per layout; the configs are presets at test size (see the module docstring)."""
    from dsahal.config import load_config

    deepseek = total_selection(dataclasses.replace(load_config("deepseek-v3.2-tiny"), name="deepseek-v3.2-check",
                                                   hidden_size=160))
    hybrid = total_selection(dataclasses.replace(load_config("tiny"), name="k3-hybrid-check", **MOE))
    return [("deepseek-v3.2 bf16", deepseek, False), ("deepseek-v3.2 fp8", deepseek, True),
            ("k3-hybrid bf16", hybrid, False), ("k3-hybrid fp8", hybrid, True)]


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``dsahal`` in this process; (exit code, its stdout and stderr)."""
    from dsahal.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(argv)
    return code, out.getvalue()


def check_layout(name: str, config, fp8: bool, folder: Path, run_args: list[str]) -> dict:
    """Write the checkpoint, run ``dsahal run --check`` on it; the table row."""
    from dsahal.model import HybridModel, init_weights
    from dsahal.model.checkpoint import save_checkpoint

    folder.mkdir(parents=True)
    config_file = folder / "config.json"
    config_file.write_text(json.dumps(config.to_dict()))
    # drawn where `dsahal run` draws its seeded weights (a CUDA generator's stream is not the CPU one's)
    import torch

    draw_on = "cuda" if torch.cuda.is_available() else "cpu"
    save_checkpoint(init_weights(HybridModel(config), seed=0, device=draw_on), folder / "weights", fp8=fp8)
    args = run_args + ["--config", str(config_file)]
    report_file = folder / "report.json"
    code, output = run_cli(["run", *args, "--weights", str(folder / "weights"), "--check",
                            "--json", str(report_file)])
    row = {"layout": name, "code": code, "output": output, "problems": []}
    if not report_file.exists():
        row["problems"].append(f"dsahal run exited {code} without a report: {_last_line(output)}")
        return row
    report = json.loads(report_file.read_text())
    check = report["check"]
    row |= {"backend": report["backend"], "tokens": sum(len(o) for o in report["outputs"]),
            "error": check["relative_logit_diff"], "tolerance": check["tolerance"]}
    if code != 0 or not check["passed"]:
        row["problems"].append(f"--check failed (exit {code}): {_last_line(output)}")
    if not fp8:  # the checkpoint holds exactly the seeded weights: the same tokens
        seeded_file = folder / "seeded.json"
        code, output = run_cli(["run", *args, "--json", str(seeded_file)])
        if code != 0 or not seeded_file.exists():
            row["problems"].append(f"the seeded run exited {code}: {_last_line(output)}")
        elif json.loads(seeded_file.read_text())["outputs"] != report["outputs"]:
            row["problems"].append("the loaded weights emit other tokens than the seeded weights they were "
                                   "written from")
    return row


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def print_table(rows: list[dict]) -> None:
    print(f"{'layout':<20} {'backend':<10} {'tokens':>6}  {'max err/ref':>11}  {'tolerance':>9}  result")
    for row in rows:
        error = f"{row['error']:.2e}" if "error" in row else "-"
        tolerance = f"{row['tolerance']:.0e}" if "tolerance" in row else "-"
        print(f"{row['layout']:<20} {row.get('backend', '-'):<10} {row.get('tokens', '-'):>6}  {error:>11}  "
              f"{tolerance:>9}  {'FAIL' if row['problems'] else 'pass'}")
        for problem in row["problems"]:
            print(f"    {problem}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=None, help="backend to check (default: nvidia; reference with "
                                                        "--cpu-smoke)")
    parser.add_argument("--cpu-smoke", action="store_true", help="run on the CPU in float32 (reference backend "
                                                                 "unless --backend says otherwise)")
    parser.add_argument("--keep", default=None, metavar="DIR", help="write the checkpoints and reports under DIR "
                                                                    "(must not exist) instead of a temporary one")
    args = parser.parse_args(argv)
    backend = args.backend or ("reference" if args.cpu_smoke else "nvidia")
    run_args = RUN + ["--backend", backend] + (["--device", "cpu", "--dtype", "float32", "--threads", "2"]
                                               if args.cpu_smoke else [])
    if args.keep and Path(args.keep).exists():
        print(f"error: model_check: argument '--keep' expected a directory that does not exist yet, got "
              f"{args.keep!r}", file=sys.stderr)
        return 2
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        root = Path(args.keep) if args.keep else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        rows = [check_layout(name, config, fp8, root / name.replace(" ", "-"), run_args)
                for name, config, fp8 in layouts()]
    print_table(rows)
    print(f"({time.monotonic() - start:.0f} s)")
    failed = [row["layout"] for row in rows if row["problems"]]
    if failed:
        print(f"error: model_check: {len(failed)} of {len(rows)} layouts failed on backend {backend!r}: "
              f"{', '.join(failed)} (each failure is listed under its row)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
