"""``KimiDeltaAttention``: the KDA layer of FLA (``fla.layers.kda.KimiDeltaAttention``) on our op.

Parameter names, shapes and initialisation follow FLA's layer, so a state_dict saved from FLA's
layer loads with ``strict=True`` (and back). The attention itself is ``flash_kda_train.chunk_kda``
with the options FLA's layer passes (in-kernel q/k l2norm, in-kernel gate with ``A_log`` and
``dt_bias``, in-kernel beta sigmoid, state stored ``[V, K]``). The short causal convolution and the
gated output norm are plain torch: they are not the hot path.

Not supported (raise): decoding caches (``past_key_values``). FLA's switch to its recurrent
kernel for short sequences at inference is not needed: ``chunk_kda`` computes the same function
at any length.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .api import chunk_kda

__all__ = ["KimiDeltaAttention", "ShortConvolution", "RMSNormGated", "FusedRMSNormGated"]


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype


def _positions(batch: int, length: int, cu_seqlens: Optional[torch.Tensor], device) -> torch.Tensor:
    """Index of each token within its sequence: [B, T] (dense) or [1, T] (packed by cu_seqlens)."""
    t = torch.arange(length, device=device)
    if cu_seqlens is None:
        return t.expand(batch, length)
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    seq = torch.searchsorted(cu[1:], t, right=True)  # sequence of token t
    return (t - cu[seq]).unsqueeze(0)


class ShortConvolution(nn.Conv1d):
    """Depthwise causal convolution over time with an optional SiLU, as FLA's ``ShortConvolution``
    (an ``nn.Conv1d`` with ``groups=hidden_size``: parameters ``weight [D, 1, W]`` and optional
    ``bias [D]``). Input and output ``[B, T, D]``; with ``cu_seqlens`` (``B == 1``) no token sees a
    token of the previous sequence."""

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False, activation: Optional[str] = "silu",
                 device=None, dtype=None, **kwargs):
        super().__init__(hidden_size, hidden_size, kernel_size, groups=hidden_size, bias=bias,
                         padding=kernel_size - 1, device=device, dtype=dtype)
        if activation not in (None, "silu", "swish"):
            raise ValueError(f"activation: expected None, 'silu' or 'swish', got {activation!r}")
        self.hidden_size = hidden_size
        self.activation = activation

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None, mask: Optional[torch.Tensor] = None,
                cache: Optional[torch.Tensor] = None, output_final_state: bool = False,
                cu_seqlens: Optional[torch.Tensor] = None, **kwargs):
        """Returns ``(y, None)`` (FLA's return convention; no decoding cache)."""
        if cache is not None or output_final_state:
            raise NotImplementedError("ShortConvolution: decoding caches (cache, output_final_state) are not supported")
        if mask is not None:
            x = x * mask.unsqueeze(-1)
        B, T, _ = x.shape
        width = self.kernel_size[0]
        dtype = _compute_dtype(x)
        w = self.weight[:, 0, :].to(dtype)  # [D, W]; the last tap multiplies the current token
        xs = x.to(dtype)
        pos = _positions(B, T, cu_seqlens, x.device).unsqueeze(-1)  # [B, T, 1]
        y = xs * w[:, width - 1]
        for lag in range(1, min(width, T)):
            shifted = F.pad(xs[:, :T - lag], (0, 0, lag, 0))  # token t reads token t - lag
            y = y + shifted * (pos >= lag).to(dtype) * w[:, width - 1 - lag]
        if self.bias is not None:
            y = y + self.bias.to(dtype)
        if self.activation is not None:
            y = F.silu(y)
        y = y.to(x.dtype)
        if residual is not None:
            y = y + residual
        return y, None


class RMSNormGated(nn.Module):
    """RMSNorm of ``x`` over the last dim, times ``weight``, times ``sigmoid(g)`` (activation
    "sigmoid") or ``silu(g)`` ("swish"/"silu"): FLA's ``FusedRMSNormGated`` in plain torch
    (float32 math for half inputs, result in ``x``'s dtype). Parameter: ``weight [hidden_size]``.

    As FLA's: a ``residual`` is added to ``x`` in that math before the norm, and ``prenorm=True``
    returns ``(y, x + residual)`` as well, in the residual's dtype (without a residual, ``x`` itself,
    or float32 with ``residual_in_fp32``)."""

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5,
                 activation: str = "swish", device=None, dtype=None):
        super().__init__()
        if activation not in ("swish", "silu", "sigmoid"):
            raise ValueError(f"activation: expected 'swish', 'silu' or 'sigmoid', got {activation!r}")
        self.hidden_size = hidden_size
        self.elementwise_affine = elementwise_affine
        self.eps = eps
        self.activation = activation
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor, g: torch.Tensor, residual: Optional[torch.Tensor] = None,
                prenorm: bool = False, residual_in_fp32: bool = False):
        dtype = _compute_dtype(x)
        xf, gf = x.to(dtype), g.to(dtype)
        if residual is not None:
            xf = xf + residual.to(dtype)
        y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight.to(dtype)
        y = (y * (torch.sigmoid(gf) if self.activation == "sigmoid" else F.silu(gf))).to(x.dtype)
        if not prenorm:
            return y
        if residual is not None:
            return y, xf.to(residual.dtype)
        return y, xf.to(torch.float32) if residual_in_fp32 else x

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, activation={self.activation}"


FusedRMSNormGated = RMSNormGated  # FLA's name


def _unpad(hidden_states: torch.Tensor, attention_mask: torch.Tensor):
    """Packs the valid tokens of a padded batch: ([1, total, ...], indices, cu_seqlens)."""
    mask = attention_mask.bool()
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    lengths = mask.sum(-1, dtype=torch.int64)
    cu_seqlens = F.pad(lengths.cumsum(0), (1, 0))
    packed = hidden_states.reshape(-1, *hidden_states.shape[2:]).index_select(0, indices).unsqueeze(0)
    return packed, indices, cu_seqlens


def _repad(packed: torch.Tensor, indices: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    flat = packed.new_zeros(batch * length, *packed.shape[2:])
    flat = flat.index_copy(0, indices, packed.squeeze(0))
    return flat.view(batch, length, *packed.shape[2:])


class KimiDeltaAttention(nn.Module):
    """Kimi Delta Attention layer with FLA's constructor arguments, parameters and forward.

    Parameters (FLA's names): ``q_proj``, ``k_proj`` ``[H*K, hidden]``; ``v_proj`` ``[HV*V, hidden]``;
    ``q_conv1d``, ``k_conv1d``, ``v_conv1d`` (with ``use_short_conv``); ``f_proj`` (two linears,
    ``hidden -> V -> HV*K``, the gate's low-rank projection); ``b_proj`` ``[HV, hidden]``;
    ``A_log`` ``[HV]``; ``dt_bias`` ``[HV*K]``; ``g_proj`` (``hidden -> V -> HV*V``, bias on the
    second); ``o_norm`` (gated RMSNorm over ``V``, sigmoid gate); ``o_proj`` ``[hidden, HV*V]``.

    ``forward(hidden_states, attention_mask=None, cu_seqlens=None)`` returns
    ``(output, None, past_key_values)`` like FLA's layer. ``attention_mask`` ``[B, T]`` (1 = token,
    0 = padding) packs the valid tokens into sequences (one host copy of the offsets per call);
    ``cu_seqlens`` takes packed input (``B == 1``) directly, with its host copy ``cu_seqlens_cpu``
    when the caller has one (then nothing is copied). Extra constructor argument: ``backend``
    ("auto", "cpu", "cuda"), passed to ``chunk_kda``.
    """

    def __init__(self, hidden_size: int = 2048, expand_v: float = 1, head_dim: int = 128, num_heads: int = 16,
                 num_v_heads: Optional[int] = None, mode: str = "chunk", use_short_conv: bool = True,
                 allow_neg_eigval: bool = False, safe_gate: bool = False, lower_bound: Optional[float] = None,
                 conv_size: int = 4, conv_bias: bool = False, layer_idx: Optional[int] = None,
                 norm_eps: float = 1e-5, backend: str = "auto", **kwargs):
        super().__init__()
        if mode not in ("chunk", "fused_recurrent"):
            raise ValueError(f"mode: expected 'chunk' or 'fused_recurrent', got {mode!r}")
        self.mode = mode
        self.allow_neg_eigval = allow_neg_eigval
        self.safe_gate = safe_gate
        self.lower_bound = lower_bound
        self.hidden_size = hidden_size
        self.expand_v = expand_v
        self.use_short_conv = use_short_conv
        self.conv_size = conv_size
        self.conv_bias = conv_bias
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.num_v_heads = num_v_heads if num_v_heads is not None else num_heads
        self.head_k_dim = head_dim
        self.head_v_dim = int(head_dim * expand_v)
        self.key_dim = num_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.gate_dim = self.num_v_heads * self.head_k_dim
        self.layer_idx = layer_idx
        self.backend = backend
        if not math.isclose(head_dim * expand_v, self.head_v_dim, rel_tol=1e-5):
            raise ValueError(f"expand_v={expand_v}: head_dim * expand_v = {head_dim * expand_v} is not an integer")
        if self.num_v_heads % num_heads != 0:
            raise ValueError(f"num_v_heads={self.num_v_heads} must be a multiple of num_heads={num_heads}")

        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        if use_short_conv:
            self.q_conv1d = ShortConvolution(self.key_dim, conv_size, bias=conv_bias, activation="silu")
            self.k_conv1d = ShortConvolution(self.key_dim, conv_size, bias=conv_bias, activation="silu")
            self.v_conv1d = ShortConvolution(self.value_dim, conv_size, bias=conv_bias, activation="silu")
        self.f_proj = nn.Sequential(nn.Linear(hidden_size, self.head_v_dim, bias=False),
                                    nn.Linear(self.head_v_dim, self.gate_dim, bias=False))
        self.b_proj = nn.Linear(hidden_size, self.num_v_heads, bias=False)
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads, dtype=torch.float32))
        self.A_log._no_weight_decay = True
        self.dt_bias = nn.Parameter(torch.empty(self.gate_dim, dtype=torch.float32))
        self.dt_bias._no_weight_decay = True
        # Drawn here, between b_proj and g_proj, as FLA draws them: the same seed gives FLA's weights.
        self.reset_gate_parameters()
        self.g_proj = nn.Sequential(nn.Linear(hidden_size, self.head_v_dim, bias=False),
                                    nn.Linear(self.head_v_dim, self.value_dim, bias=True))
        self.o_norm = RMSNormGated(self.head_v_dim, activation="sigmoid", eps=norm_eps)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)

    @torch.no_grad()
    def reset_gate_parameters(self):
        """FLA's initialisation of the gate: ``A_log = log(U(1, 16))`` (zeros with ``safe_gate``);
        ``dt_bias = softplus^-1(dt)`` with ``dt`` log-uniform in [1e-3, 1e-1] (at least 1e-4)."""
        if self.safe_gate:
            self.A_log.zero_()
        else:
            self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1, 16).log())
        low, high = math.log(1e-3), math.log(1e-1)
        dt = torch.exp(torch.rand_like(self.dt_bias) * (high - low) + low).clamp(min=1e-4)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def _heads(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        return x.unflatten(-1, (-1, dim))

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                past_key_values=None, use_cache: Optional[bool] = False, output_attentions: Optional[bool] = False,
                **kwargs):
        if past_key_values is not None:
            raise NotImplementedError("KimiDeltaAttention: decoding caches (past_key_values) are not supported")
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError(f"attention_mask: expected a [batch, seq_len] 0/1 padding mask, got shape "
                             f"{tuple(attention_mask.shape)}")
        batch, length, _ = hidden_states.shape
        cu_seqlens, cu_seqlens_cpu = kwargs.get("cu_seqlens"), kwargs.get("cu_seqlens_cpu")
        indices = None
        if cu_seqlens is None and attention_mask is not None:
            hidden_states, indices, cu_seqlens = _unpad(hidden_states, attention_mask[:, -length:])
            cu_seqlens_cpu = None

        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        if self.use_short_conv:
            q, _ = self.q_conv1d(q, cu_seqlens=cu_seqlens)
            k, _ = self.k_conv1d(k, cu_seqlens=cu_seqlens)
            v, _ = self.v_conv1d(v, cu_seqlens=cu_seqlens)
        else:
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        g = self._heads(self.f_proj(hidden_states), self.head_k_dim)
        beta = self.b_proj(hidden_states)
        q, k = self._heads(q, self.head_k_dim), self._heads(k, self.head_k_dim)
        v = self._heads(v, self.head_v_dim)

        o, _ = chunk_kda(q, k, v, g, beta, A_log=self.A_log, dt_bias=self.dt_bias,
                         use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                         allow_neg_eigval=self.allow_neg_eigval, safe_gate=self.safe_gate,
                         lower_bound=self.lower_bound, state_v_first=True, cu_seqlens=cu_seqlens,
                         cu_seqlens_cpu=cu_seqlens_cpu, backend=self.backend)

        o = self.o_norm(o, self._heads(self.g_proj(hidden_states), self.head_v_dim))
        o = self.o_proj(o.flatten(-2))
        if indices is not None:
            o = _repad(o, indices, batch, length)
        return o, None, past_key_values
