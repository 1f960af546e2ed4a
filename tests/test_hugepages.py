"""Large host tensors ask for transparent huge pages: where the kernel grants them on request, the memory under an
expert store's tensors is backed by 2 MB pages (read back from /proc/self/smaps), and the values are the same."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from freetoken import hugepages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str | None:
    try:
        return THP.read_text().split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        return None


needs_thp = pytest.mark.skipif(thp_mode() not in ("always", "madvise"), reason="no transparent huge pages here")


@needs_thp
def test_empty_is_aligned_and_backed_by_huge_pages():
    t = hugepages.empty((3, 5 << 20), torch.bfloat16)  # 30 MB
    assert t.shape == (3, 5 << 20) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert t.data_ptr() % hugepages.HUGE_PAGE == 0
    t.fill_(1.5)
    assert hugepages.huge_bytes(t) >= 14 * hugepages.HUGE_PAGE  # all 15 whole huge pages but one may be refused
    assert t.float().sum().item() == 1.5 * t.numel()


def test_only_tensors_of_two_huge_pages_or_more_are_advised():
    """(A small tensor's pages are not checked through huge_bytes: it shares its mapping, the heap, with whatever
    else is there.)"""
    limit = hugepages.MIN_BYTES // 4  # fp32 elements
    assert not hugepages.advise(torch.empty(limit - 1)) and not hugepages.advise(torch.empty(1024))
    if thp_mode() in ("always", "madvise"):
        assert hugepages.advise(torch.empty(2 * limit))  # (the madvise call itself succeeds)


@needs_thp
def test_a_loaded_checkpoints_experts_are_on_huge_pages(tmp_path):
    """A random Qwen3-MoE with 4.7 MB expert stacks per layer, saved by HF transformers: ft's loaded stacks are on
    huge pages and equal the HF model's expert weights."""
    transformers = pytest.importorskip("transformers")
    from freetoken.models.checkpoint import load_checkpoint

    cfg = transformers.Qwen3MoeConfig(hidden_size=256, intermediate_size=256, moe_intermediate_size=320,
                                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=64, num_experts=16, num_experts_per_tok=2, vocab_size=128)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    ckpt = load_checkpoint(tmp_path)
    gate_up, down = ckpt.experts[0]
    assert gate_up.shape == (16, 640, 256) and hugepages.huge_bytes(gate_up) >= hugepages.HUGE_PAGE
    experts = model.model.layers[0].mlp.experts
    first = experts[3] if isinstance(experts, torch.nn.ModuleList) else None
    if first is not None:
        assert torch.equal(gate_up[3, :320], first.gate_proj.weight) and torch.equal(down[3], first.down_proj.weight)
    else:  # fused experts (transformers >= 5): gate_up_proj [E, 2I, D]
        assert torch.equal(gate_up[3], experts.gate_up_proj[3]) and torch.equal(down[3], experts.down_proj[3])
