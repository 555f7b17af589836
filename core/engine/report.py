"""What ``dsahal run`` prints: the header (before anything is allocated), the results, peak memory, and
the --check line (:mod:`.check` compares; :mod:`.progress` draws the phases on stderr)."""
from __future__ import annotations

import resource
import sys

import torch

from .check import describe_check

MIB = 1 << 20
GIB = 1 << 30


def peak_memory(device: torch.device) -> dict:
    """Peak device memory (CUDA allocator) or the process's peak resident set (CPU), in bytes."""
    if device.type == "cuda":
        return {"kind": "cuda max_memory_allocated", "bytes": torch.cuda.max_memory_allocated(device),
                "reserved_bytes": torch.cuda.max_memory_reserved(device)}
    return {"kind": "process peak RSS", "bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def print_header(report: dict, out=None) -> None:
    """What the run will do, printed first: backend, device, config, cache, requests, memory estimate.

    ``report`` needs backend, device, dtype, config, latent_fmt, index_fmt, block_tokens, cache, batch,
    prompt_lengths, decode_tokens_per_request, seed (and optionally dcp, memory_estimate)."""
    out = out or sys.stdout
    config = report["config"]
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
    estimate = report.get("memory_estimate")
    if estimate:
        where = "CPU memory" if estimate["device_type"] != "cuda" else f"{report['device']}"
        need = estimate["host"] if estimate["device_type"] != "cuda" else estimate["device"]
        free = estimate.get("host_available_bytes") if estimate["device_type"] != "cuda" \
            else estimate.get("device_available_bytes")
        have = f" of {free / GIB:.1f} GiB available" if free else ""
        print(f"memory   estimate {need / GIB:.2f} GiB of {where}{have} (weights {estimate['weights'] / GIB:.2f} "
              f"GiB, cache {estimate['cache'] / GIB:.2f} GiB)", file=out)
    out.flush()


def print_results(report: dict, out=None) -> None:
    """Throughput, per-op times, peak memory and the --check verdict, after the run."""
    out = out or sys.stdout
    stats = report["stats"]
    cache = report["cache"]
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
    if report.get("draft_tokens_per_step"):
        print(f"         {describe_drafts(stats, report)}", file=out)
    if report.get("warmup"):
        print(describe_warmup(report["warmup"]), file=out)
    if report.get("startup"):
        print(describe_startup(report["startup"]), file=out)
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
        print(describe_check(check), file=out)


def print_report(report: dict, out=None) -> None:
    """The header and the results together (what ``dsahal run`` prints, header first)."""
    print_header(report, out)
    print_results(report, out)


def describe_warmup(warmup: dict) -> str:
    """The compile warm-up line: its jobs, threads and seconds, or why it was skipped."""
    if warmup.get("skipped"):
        return f"warm-up  skipped: {warmup['skipped']}"
    failed = f"; {len(warmup['errors'])} failed (their kernels compiled on first use)" if warmup.get("errors") else ""
    took = warmup.get("job_seconds") or {}
    jobs = ", ".join(f"{name} {took[name]:.2f} s" if name in took else name for name in warmup["jobs"])
    return (f"warm-up  {len(warmup['jobs'])} jobs on {warmup['threads']} threads in {warmup['seconds']:.2f} s before "
            f"the first prefill, not counted in prefill ({jobs}){failed}")


def describe_startup(startup: dict) -> str:
    """When the first token came, from the process's start, and where the time before it went."""
    first = startup.get("first_token_s")
    if first is None:
        return f"first token: none generated (start-up and imports took {startup.get('run_s', 0.0):.2f} s)"
    parts, last = [], 0.0
    for key, label in (("run_s", "start-up and imports"), ("header_s", "plan and header"), ("weights_s", "weights"),
                       ("warmup_s", "cache and warm-up"), ("first_token_s", "prefill to the first token")):
        if startup.get(key) is not None:
            parts.append(f"{label} {startup[key] - last:.2f} s")
            last = startup[key]
    return f"first token after {first:.2f} s from {startup['origin']} ({', '.join(parts)})"


def describe_drafts(stats: dict, report: dict) -> str:
    """The speculative-decoding line, saying why few drafts were accepted when few were.

    Prompt lookup proposes the tokens that followed an earlier occurrence of the last two tokens; with
    seeded random weights the model's greedy tokens rarely continue earlier text, so drafts are rarely
    proposed (random prompts seldom repeat a bigram) and rarely accepted."""
    proposed, accepted = stats.get("draft_tokens", 0), stats.get("accepted_draft_tokens", 0)
    line = f"speculative: up to {report['draft_tokens_per_step']} prompt-lookup drafts per request per step; "
    if not proposed:
        return line + ("no draft was proposed: no request's last two tokens occurred earlier in its text, so "
                       "prompt lookup had nothing to propose (the seeded prompts are random tokens)")
    line += f"{accepted} of {proposed} draft tokens accepted ({100 * accepted / proposed:.1f}%)"
    if accepted < proposed / 2 and not report.get("weights"):
        line += ("; the weights are seeded random, so the model's greedy choice seldom repeats earlier text, "
                 "which is what prompt-lookup drafts bet on (a checkpoint, --weights, on repetitive text shows "
                 "real acceptance); the emitted tokens are the same either way")
    return line
