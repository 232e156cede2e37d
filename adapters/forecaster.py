"""The forecaster network of the `tft` adapter, and how much memory training it takes.

The model reads a window of a price series' log returns and predicts the next `horizon`
returns. It keeps the Temporal Fusion Transformer's building blocks - gated residual networks
(ELU MLP, GLU gate, residual, LayerNorm), gated skip connections around causal multi-head
self-attention - without the covariate machinery (variable selection, static encoders): it has
one input, the series itself.

Every batch is GPU work (no environment to simulate), so its cost grows with batch size, width,
window and depth: the memory model below says how, and tests/test_supervised.py checks it
against a measurement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapters.base import MemoryModel
from orchestrator.imports import LazyImport

# The layers subclass torch's nn.Module, so their module imports torch as it loads: deferred
# like torch itself, so that listing adapters and `plan` read the memory model without torch.
if TYPE_CHECKING:
    import torch

    from adapters import _forecaster_layers as layers
else:
    layers = LazyImport("adapters._forecaster_layers")

HEADS = 4  # attention heads; every width in the search space is a multiple of this

# --- Memory model -------------------------------------------------------------------------
#
# Per sample, training keeps every tensor that backward needs until backward has used it. In
# fp32 elements, for window W, width d and h heads, what one sample leaves saved is:
#
#   gated residual network (GRN): fc1 input, ELU input, ELU output (= fc2 input), dropout mask,
#     GLU projection input, GLU input (2 W d), LayerNorm input                     8 W d
#   attention sublayer: qkv projection input, q, k, v, attention output (= output projection
#     input), GLU projection input, GLU input (2 W d), LayerNorm input              9 W d
#     plus, on the unfused (math) path: softmax output, dropout mask, dropped weights  3 h W^2
#   every LayerNorm: mean and 1/std per position                                      2 W
#   one block = attention sublayer + GRN; the model = value projection input (W), the encoder
#   GRN, `depth` blocks, and the head's input: the last position of the last block's output,
#   a view that keeps the whole W d output alive.
#
# This is the CPU's layout, counted exactly (tests/test_supervised.py measures it): an upper
# bound for a GPU, where dropout masks are one byte, fused attention kernels keep none of the
# W^2 tensors and autocast stores many activations in 16 bits.
# On top of what is saved, backward briefly holds the gradients of one block's activations,
# and the caching allocator rounds blocks up: TRANSIENT_FACTOR covers both.
GRN_SAVED_PER_WD = 8
ATTENTION_SAVED_PER_WD = 9
ATTENTION_SAVED_PER_HW2 = 3
LAYERNORM_SAVED_PER_W = 2
TRANSIENT_FACTOR = 1.25
BYTES_FP32 = 4
MB = 1024 * 1024

# Fixed per trial: the CUDA context with its kernels and cuBLAS/cuDNN workspaces (about
# 300-500 MB on current GPUs, held outside PyTorch's allocator, so torch's own counters never
# show it), plus parameters, their gradients and Adam's two moments (4 copies of the largest
# model in the search space), plus the validation batch's outputs and the series on the device.
CUDA_CONTEXT_MB = 500.0
STATE_COPIES = 4  # parameters + gradients + Adam exp_avg + exp_avg_sq


def block_parameters(width: int) -> int:
    """Parameters of one fusion block (attention sublayer + GRN), weights and biases."""
    d = width
    attention = (d * 3 * d + 3 * d) + (d * d + d)  # qkv + output projection
    attention_gate = d * 2 * d + 2 * d + 2 * d  # GLU projection + LayerNorm
    return attention + attention_gate + grn_parameters(width)


def grn_parameters(width: int) -> int:
    d = width
    return (d * d + d) * 2 + (d * 2 * d + 2 * d) + 2 * d  # fc1, fc2, GLU projection, LayerNorm


def model_parameters(width: int, window: int, depth: int, horizon: int) -> int:
    """Every parameter of `Forecaster(width, window, depth, horizon)`."""
    embedding = (1 * width + width) + window * width  # value projection + position embedding
    head = width * horizon + horizon
    return embedding + grn_parameters(width) + depth * block_parameters(width) + head


def activation_bytes_per_sample(width: int, window: int, depth: int) -> float:
    """What training saves for backward per sample, in bytes (fp32, unfused attention)."""
    w, wd = window, window * width
    grn = GRN_SAVED_PER_WD * wd + LAYERNORM_SAVED_PER_W * w
    attention = ATTENTION_SAVED_PER_WD * wd + ATTENTION_SAVED_PER_HW2 * HEADS * w * w
    attention += LAYERNORM_SAVED_PER_W * w
    elements = w + grn + depth * (attention + grn) + wd
    return float(elements * BYTES_FP32)


def forecaster_memory_model(
    max_width: int, max_window: int, max_depth: int, horizon: int
) -> MemoryModel:
    """The memory model at the largest width, window and depth that the search space allows."""
    params = model_parameters(max_width, max_window, max_depth, horizon)
    state_mb = STATE_COPIES * params * BYTES_FP32 / MB
    per_sample_mb = (
        TRANSIENT_FACTOR * activation_bytes_per_sample(max_width, max_window, max_depth) / MB
    )
    return MemoryModel(
        model_overhead_mb=CUDA_CONTEXT_MB + state_mb,
        per_sample_mb=per_sample_mb,
        per_process_mb=CUDA_CONTEXT_MB,  # a fused group's members share one context
    )


# --- The model ---------------------------------------------------------------------------


def build_forecaster(
    width: int, window: int, depth: int, horizon: int, dropout: float = 0.0
) -> torch.nn.Module:
    """The forecaster for these sizes (public so tests and users can measure it); torch is
    imported when the first model is built."""
    return layers.Forecaster(width, window, depth, horizon, dropout, HEADS)
