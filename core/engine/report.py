"""What ``dsahal run`` prints: the progress bar, the run report, peak memory, the --check comparison."""
from __future__ import annotations

import resource
import sys

import torch

MIB = 1 << 20


class ProgressBar:
    """A one-line bar on stderr (``[#####.....] 12/40 steps``); does nothing when disabled."""

    def __init__(self, total: int, enabled: bool, width: int = 30):
        self.total, self.enabled, self.width, self.done = max(total, 1), enabled, width, 0

    def advance(self) -> None:
        self.done += 1
        if self.enabled:
            filled = min(self.width, self.width * self.done // self.total)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} steps")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def peak_memory(device: torch.device) -> dict:
    """Peak device memory (CUDA allocator) or the process's peak resident set (CPU), in bytes."""
    if device.type == "cuda":
        return {"kind": "cuda max_memory_allocated", "bytes": torch.cuda.max_memory_allocated(device),
                "reserved_bytes": torch.cuda.max_memory_reserved(device)}
    return {"kind": "process peak RSS", "bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def compare_runs(run, reference) -> dict:
    """Logits of the same requests (the reference forced to the run's tokens) compared position by position.

    Returns the largest absolute logit difference, the largest |logit| (for scale), and how many
    sampled positions the reference's argmax equals the run's emitted token.
    """
    max_diff, max_logit, agree, positions = 0.0, 0.0, 0, 0
    for ours, theirs in zip(run, reference):
        for step, (a, b) in enumerate(zip(ours.logits, theirs.logits)):
            max_diff = max(max_diff, (a - b).abs().max().item())
            max_logit = max(max_logit, b.abs().max().item())
            agree += int(torch.argmax(b).item() == ours.output[step])
            positions += 1
    return {"max_abs_logit_diff": max_diff, "max_abs_logit": max_logit, "greedy_agree": agree,
            "positions": positions, "greedy_agreement": agree / positions if positions else 0.0}


def print_report(report: dict, out=None) -> None:
    out = out or sys.stdout
    config, stats = report["config"], report["stats"]
    kinds = config["layer_kinds"]
    dcp = f", decode context parallel over {report['dcp']} ranks" if report.get("dcp", 1) > 1 else ""
    print(f"backend  {report['backend']} on {report['device']} ({report['dtype']}){dcp}", file=out)
    print(f"config   {config['name']}: {len(kinds)} layers ({kinds.count('kda')} KDA + {kinds.count('dsa')} DSA), "
          f"hidden {config['hidden_size']}, {config['num_heads']} heads, {config['index_heads']} index heads, "
          f"top-k {config['index_topk']}, vocab {config['vocab_size']}", file=out)
    cache = report["cache"]
    print(f"cache    latent {report['latent_fmt']}, index keys {report['index_fmt']}, {report['block_tokens']} "
          f"tokens/block, {cache['rows']} rows x {cache['row_bytes']} B = {cache['bytes'] / MIB:.1f} MiB, "
          f"{cache['state_slots']} KDA state slots", file=out)
    print(f"requests {report['batch']}, prompt lengths {report['prompt_lengths']}, "
          f"{report['decode_tokens_per_request']} generated each, seed {report['seed']}", file=out)
    print(f"prefill  {stats['prefill_tokens']} tokens in {stats['prefill_seconds']:.3f} s = "
          f"{stats['prefill_tokens_per_s']:.1f} tokens/s ({stats['prefill_steps']} steps)", file=out)
    if report.get("cuda_graph"):
        mode = f"{stats.get('graph_steps', 0)} replayed from CUDA graphs"
    else:
        mode = "eager" if not stats.get("compile_seconds") else "torch.compile"
    print(f"decode   {stats['decode_tokens']} tokens in {stats['decode_seconds']:.3f} s = "
          f"{stats['decode_tokens_per_s']:.1f} tokens/s ({stats['decode_steps']} steps, {mode})", file=out)
    if report.get("cuda_graph"):
        sizes = stats.get("graph_sizes") or []
        print(f"         (capturing {len(sizes)} CUDA graph(s) for batch size(s) {sizes}, "
              f"{stats.get('graph_capture_seconds', 0.0):.2f} s with warm-up, is not counted)", file=out)
    if stats.get("compile_seconds"):
        print(f"         (the first decode step, {stats['compile_seconds']:.1f} s with torch.compile, is not counted)",
              file=out)
    if stats.get("draft_tokens"):
        print(f"         speculative: {stats['accepted_draft_tokens']} of {stats['draft_tokens']} draft tokens "
              f"accepted ({100 * stats['accepted_draft_tokens'] / stats['draft_tokens']:.1f}%)", file=out)
    step_seconds = stats["prefill_seconds"] + stats["decode_seconds"]
    print(f"\nper-op time (self time; nested ops excluded from their caller) — {1e3 * report['ops_seconds']:.1f} ms "
          f"in ops of {1e3 * step_seconds:.1f} ms of steps", file=out)
    if report.get("cuda_graph"):
        print("  (decode steps replayed from CUDA graphs run no Python: their ops are not below; the warm-up "
              "steps before each capture are)", file=out)
    print(f"  {'op':<20}{'calls':>7}{'self ms':>11}{'total ms':>11}{'% steps':>9}  route", file=out)
    for row in report["ops"]:
        share = 100.0 * row["self_ms"] / (1e3 * step_seconds) if step_seconds else 0.0
        status = row.get("routes") or row["status"]
        if row["fallback_calls"] and row["status"] != "fallback":
            status += f" ({row['fallback_calls']} fell back)"
        print(f"  {row['op']:<20}{row['calls']:>7}{row['self_ms']:>11.2f}{row['total_ms']:>11.2f}{share:>8.1f}%"
              f"  {status}", file=out)
    memory = report["memory"]
    extra = f", reserved {memory['reserved_bytes'] / MIB:.1f} MiB" if "reserved_bytes" in memory else ""
    print(f"\npeak memory {memory['bytes'] / MIB:.1f} MiB ({memory['kind']}{extra}); weights "
          f"{report['weights_bytes'] / MIB:.1f} MiB, cache {cache['bytes'] / MIB:.1f} MiB", file=out)
    check = report.get("check")
    if check:
        print(f"check vs reference: max |logit difference| {check['max_abs_logit_diff']:.3e} (max |logit| "
              f"{check['max_abs_logit']:.2f}) over {check['positions']} positions; greedy agreement "
              f"{check['greedy_agree']}/{check['positions']} ({100 * check['greedy_agreement']:.1f}%)", file=out)
