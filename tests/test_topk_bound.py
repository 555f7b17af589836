"""The max-bound and group-bound top-k kernels under the Triton interpreter (cases in
``tests/interpreted/topk_bound_cases.py``), run in a child pytest whose environment sets
``TRITON_INTERPRET=1`` before triton is imported: in this process the kernels are already compiled-mode
functions (other test modules import them first), which cannot run on CPU tensors."""
import os
import subprocess
import sys

CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "interpreted", "topk_bound_cases.py")


def test_bound_and_group_topk_match_the_reference_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", CASES], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout
