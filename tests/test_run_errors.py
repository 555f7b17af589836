"""`dsahal run` errors are one `error:` line on stderr with a non-zero exit, never a traceback: a config
missing keys, a CUDA device on a CPU build, a run that does not fit in memory (refused before allocating),
torchrun without --dcp, a DCP peer dying."""
import json

import pytest
import torch

import dsahal.cli.run as run_cli
import dsahal.engine.memory as memory
from dsahal.cli import main
from dsahal.config import load_config
from dsahal.distributed import DistributedFault
from dsahal.engine.memory import estimate_run_memory, parameter_bytes
from dsahal.model import HybridModel

SMALL = ["run", "--batch", "2", "--prompt-len", "24", "--decode", "3", "--block-tokens", "16", "--chunk", "16"]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and [line for line in lines if line.startswith("error: ")] == lines[-1:], err
    return lines[-1]


@pytest.mark.parametrize("data,fragment", [
    ({"name": "x", "vocab_size": 10, "hidden_size": 8},
     "model config 'x': missing required keys ['intermediate_size', 'num_heads', 'q_lora_rank', "
     "'num_layers (or layer_kinds)']"),
    ({"name": "x", "num_layers": "four", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
      "num_heads": 1, "q_lora_rank": 4}, "num_layers expected an int >= 1, got 'four'"),
    ({"name": "x", "num_layers": 4, "vocab_size": 10.5, "hidden_size": 8, "intermediate_size": 8,
      "num_heads": 1, "q_lora_rank": 4}, "vocab_size expected an int, got 10.5"),
    ([1, 2], "model config: expected a JSON object of fields, got list"),
])
def test_a_config_file_with_missing_or_mistyped_keys_is_named(data, fragment, tmp_path, capsys):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(data))
    assert main(["run", "--config", str(path)]) == 2
    assert fragment in one_error_line(capsys)


@pytest.mark.parametrize("seed,batch", [(2**64, 1), (2**64 - 1, 2), (-2**63 - 1, 1), (10**30, 4)])
def test_a_seed_outside_what_torch_generators_take_names_the_flag(seed, batch, monkeypatch, capsys):
    # the error was torch's own "Overflow when unpacking long long", naming no flag, after the header
    monkeypatch.setattr(run_cli, "_load_model", lambda *a, **k: pytest.fail("loaded the model"))
    assert main(["run", "--batch", str(batch), "--seed", str(seed)]) == 2
    assert one_error_line(capsys) == (f"error: --seed expected an int in [-2^63, 2^64 - --batch] = [{-2**63}, "
                                      f"{2**64 - batch}] (request i samples from seed + i), got {seed}")


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU build of torch")
def test_a_cuda_device_on_a_cpu_build_of_torch_is_a_usage_error(capsys):
    assert main(SMALL + ["--device", "cuda"]) == 2
    assert f"'--device cuda': this torch ({torch.__version__}) was built without CUDA" in one_error_line(capsys)
    assert main(SMALL + ["--device", "tpu9"]) == 2
    assert "argument '--device' expected a torch device such as cpu, cuda or cuda:1, got 'tpu9'" in \
        one_error_line(capsys)


def test_a_run_that_does_not_fit_is_refused_before_allocating(monkeypatch, capsys):
    monkeypatch.setattr(memory, "host_available_bytes", lambda: 64 << 20)  # a 64 MiB machine
    monkeypatch.setattr(run_cli, "_load_model", lambda *a, **k: pytest.fail("allocated the model"))
    assert main(SMALL) == 2
    line = one_error_line(capsys)
    assert line.startswith("error: dsahal run: needs about ") and "GiB of CPU memory" in line
    assert "this machine has 0.1 GiB available" in line and "--no-memory-check" in line


def test_k31_pro_is_refused_on_a_machine_without_its_memory(capsys):
    estimate = estimate_run_memory(load_config("k31-pro"), dtype=torch.float32, device=torch.device("cpu"),
                                   cache_bytes=0, tokens_per_step=416, max_context=159, sampled_rows=4)
    available = memory.host_available_bytes()
    if available is None or available >= estimate.host:
        pytest.skip("this machine has the memory k31-pro needs")
    assert main(["run", "--config", "k31-pro"]) == 2
    out = capsys.readouterr()
    assert "config   k31-pro: 93 layers" in out.out  # the header still comes first
    line = [l for l in out.err.splitlines() if l.startswith("error: ")][-1]
    assert "needs about 26" in line and "weights 251.7 GiB" in line


def test_the_weight_estimate_is_the_models_parameter_bytes():
    config = load_config("tiny")
    model = HybridModel(config)
    assert parameter_bytes(config, torch.float32)[0] == sum(p.numel() * 4 for p in model.parameters())
    assert parameter_bytes(config, torch.bfloat16)[0] == sum(p.numel() * 2 for p in model.parameters())


def test_torchrun_without_dcp_is_refused_once(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert main(SMALL) == 2
    assert "started as 2 processes (WORLD_SIZE=2, e.g. by torchrun) without --dcp" in one_error_line(capsys)
    monkeypatch.setenv("RANK", "1")
    assert main(SMALL) == 2
    assert capsys.readouterr().err == ""  # only rank 0 says it


@pytest.mark.parametrize("bad", [["--batch", "0"], ["--draft-tokens", "9"], ["--temperature", "-1"],
                                 ["--config", "no-such-config"]])
def test_an_argument_error_under_torchrun_is_printed_by_the_first_rank_only(monkeypatch, capsys, bad):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, lines in (("0", 1), ("1", 0)):
        monkeypatch.setenv("RANK", rank)
        assert main(SMALL + ["--dcp", "2"] + bad) == 2  # every rank exits with the usage status
        err = capsys.readouterr().err
        assert len(err.splitlines()) == lines and (not lines or err.startswith("error: ")), (rank, err)


def test_a_dcp_peer_dying_is_an_error_line_with_exit_3(monkeypatch, capsys):
    message = ("dsahal.distributed: topk_merge first round failed on rank 0 of 2: a peer rank died or did not "
               "answer within the process group's timeout (120 s). Underlying error: Connection reset by peer")

    def die(args, config):
        raise DistributedFault(message)
    monkeypatch.setattr(run_cli, "_run_on_backend", die)
    assert main(SMALL) == 3
    assert one_error_line(capsys) == f"error: {message}"
