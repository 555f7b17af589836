"""The bench's peer columns on the CPU: a peer is timed only after its output agreed with ours, and
FlashMLA offers no peer where it cannot run (no CUDA here; the H200 runs the real one)."""
import torch

from dsahal.bench import peers


def test_only_agreeing_peers_are_kept_and_the_others_are_reported():
    ours = torch.randn(6, 16, 512)
    close = lambda: torch.cat([ours + 1e-4 * torch.randn_like(ours), torch.zeros(6, 48, 512)], dim=1)  # noqa: E731
    far = lambda: (ours + 1.0, None)  # noqa: E731

    def broken():
        raise RuntimeError("kernel image not found")

    kept, notes = peers.agreeing({"close": close, "far": far, "broken": broken}, (ours, None), heads=16)
    assert list(kept) == ["close"]  # padded heads (beyond 16) are ignored by the comparison
    assert any(n.startswith("far: output differs") for n in notes)
    assert any("broken: RuntimeError: kernel image not found" in n for n in notes)


def test_flashmla_offers_no_peer_off_cuda():
    q = torch.randn(4, 16, 576, dtype=torch.bfloat16)
    pages = torch.zeros(8, 64, 656, dtype=torch.uint8)
    slots = torch.zeros(4, 64, dtype=torch.int32)
    assert peers.flashmla_sparse_mla(q, pages, slots, "fp8_ds_mla", 0.07) == {}
    assert peers.flashmla_decode(q, pages, 0.07) is None
