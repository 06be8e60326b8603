"""test_cpu_gpt_numpy.py: the C reference GPT's forward against an independent numpy GPT.

The C tests check each layer and the model's backward by finite differences; this checks the
wiring of the whole forward (pre-LayerNorm blocks, residuals, causal mask, tied LM head,
padded vocab) against a second implementation written from the model's definition.
Runs from the repository root after `make`, which builds $BUILD/libcpu_gpt.so.
"""
import ctypes
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test"))
import harness  # noqa: E402

LIB = ctypes.CDLL(os.path.join(ROOT, os.environ.get("BUILD", "build"), "libcpu_gpt.so"))
LIB.cpu_gpt_forward_backward.restype = ctypes.c_double


def c_forward(config, params, inputs, targets, with_grads=False):
    """Mean loss, logits (B, T, Vp) and (with_grads) the loss gradient from the C reference."""
    B, T = inputs.shape
    logits = np.empty((B, T, config[4]), dtype=np.float64)
    grads = np.empty_like(params) if with_grads else None
    as_ptr = lambda a, t: a.ctypes.data_as(ctypes.POINTER(t))  # noqa: E731
    cfg = np.asarray(config, dtype=np.int32)
    inputs, targets = np.ascontiguousarray(inputs, np.int32), np.ascontiguousarray(targets, np.int32)
    loss = LIB.cpu_gpt_forward_backward(as_ptr(cfg, ctypes.c_int), B, T, as_ptr(params, ctypes.c_double),
                                        as_ptr(inputs, ctypes.c_int), as_ptr(targets, ctypes.c_int),
                                        as_ptr(logits, ctypes.c_double),
                                        as_ptr(grads, ctypes.c_double) if with_grads else None)
    return loss, logits, grads


def param_shapes(config):
    """config = (L, C, NH, V, Vp, maxT, NKV): the QKV projection has (NH + 2·NKV)·HD outputs."""
    L, C, NH, _, Vp, maxT, NKV = config
    QKV = (NH + 2 * NKV) * (C // NH)
    return [(Vp, C), (maxT, C), (L, C), (L, C), (L, QKV, C), (L, QKV), (L, C, C), (L, C), (L, C), (L, C),
            (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C), (C,), (C,)]


def numpy_forward(config, params, inputs, targets):
    """GPT-2 forward written from the model's definition; returns (mean loss, logits)."""
    L, C, NH, V, _, _, NKV = config
    HD = C // NH
    B, T = inputs.shape
    tensors, offset = [], 0
    for shape in param_shapes(config):
        size = int(np.prod(shape))
        tensors.append(params[offset:offset + size].reshape(shape))
        offset += size
    wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb = tensors

    def layernorm(x, w, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * w + b

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    x = wte[inputs] + wpe[:T]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for l in range(L):
        h = layernorm(x, ln1w[l], ln1b[l])
        q, k, v = np.split(h @ qkvw[l].T + qkvb[l], [NH * HD, (NH + NKV) * HD], axis=-1)
        q = q.reshape(B, T, NH, HD).transpose(0, 2, 1, 3)  # (B, NH, T, HD)
        # grouped-query attention: K/V head g serves query heads g·NH/NKV .. (g + 1)·NH/NKV − 1
        k, v = (a.reshape(B, T, NKV, HD).transpose(0, 2, 1, 3).repeat(NH // NKV, axis=1) for a in (k, v))
        scores = np.where(causal, q @ k.transpose(0, 1, 3, 2) / np.sqrt(HD), -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        y = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ attprojw[l].T + attprojb[l]
        x = x + gelu(layernorm(x, ln2w[l], ln2b[l]) @ fcw[l].T + fcb[l]) @ fcprojw[l].T + fcprojb[l]
    logits = layernorm(x, lnfw, lnfb) @ wte.T
    real = logits[..., :V]
    log_norm = np.log(np.exp(real - real.max(-1, keepdims=True)).sum(-1)) + real.max(-1)
    losses = log_norm - np.take_along_axis(real, targets[..., None], -1)[..., 0]
    return losses.mean(), logits


def check_config(config, B, T, seed):
    rng = np.random.default_rng(seed)
    n_params = sum(int(np.prod(s)) for s in param_shapes(config))
    params = rng.normal(0.0, 0.3, n_params)
    inputs = rng.integers(0, config[3], (B, T))
    targets = rng.integers(0, config[3], (B, T))
    loss_c, logits_c, _ = c_forward(config, params, inputs, targets)
    loss_np, logits_np = numpy_forward(config, params, inputs, targets)
    err = np.linalg.norm(logits_c - logits_np) / np.linalg.norm(logits_np)
    assert err < 1e-12, f"logits relative error {err:.3e}"
    assert abs(loss_c - loss_np) < 1e-12 * abs(loss_np), f"loss {loss_c!r} vs numpy {loss_np!r}"


def test_forward_matches_numpy_tiny():
    # L2, hidden 64, 4 heads of 16, vocab 60 padded to 64, T 16.
    check_config((2, 64, 4, 60, 64, 16, 4), B=2, T=16, seed=1)


def test_forward_matches_numpy_gqa_and_mqa():
    # 4 heads sharing 2 key/value heads, and 1 (multi-query).
    check_config((2, 64, 4, 60, 64, 16, 2), B=2, T=16, seed=None)
    check_config((2, 48, 3, 50, 64, 9, 1), B=1, T=9, seed=None)


def test_forward_matches_numpy_odd_sizes():
    # 3 layers, head dim 10, T shorter than the position table, a single sequence.
    check_config((3, 40, 4, 50, 64, 9, 4), B=1, T=7, seed=None)


def test_forward_matches_numpy_T1():
    check_config((1, 32, 2, 17, 24, 4, 2), B=3, T=1, seed=None)


def test_backward_matches_numpy_finite_differences():
    # The C backward against central differences of the numpy forward: a check of the
    # backward that shares no code with it. 40 random parameters of every tensor kind.
    config, B, T = (2, 32, 4, 40, 64, 8, 2), 2, 8  # grouped-query: 4 heads, 2 key/value heads
    rng = np.random.default_rng()
    n_params = sum(int(np.prod(s)) for s in param_shapes(config))
    params = rng.normal(0.0, 0.3, n_params)
    inputs, targets = rng.integers(0, config[3], (B, T)), rng.integers(0, config[3], (B, T))
    loss, _, grads = c_forward(config, params, inputs, targets, with_grads=True)
    assert np.isfinite(loss), "the C reference reported a failure (NaN loss)"
    sample = rng.choice(n_params, 40, replace=False)
    numeric = np.empty(len(sample))
    for n, i in enumerate(sample):
        saved, h = params[i], 1e-6
        params[i] = saved + h
        up = numpy_forward(config, params, inputs, targets)[0]
        params[i] = saved - h
        down = numpy_forward(config, params, inputs, targets)[0]
        params[i] = saved
        numeric[n] = (up - down) / (2 * h)
    err = np.linalg.norm(grads[sample] - numeric) / np.linalg.norm(numeric)
    assert err < 1e-6, f"relative error {err:.3e} on {len(sample)} sampled parameters"


if __name__ == "__main__":
    harness.run_module(globals())
