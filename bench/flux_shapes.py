"""Flux's parameter shapes (models/src/flux/model.rs), without torch.

Shared by flux_torch.py (which builds the tensors) and flux_wide_peer.py
(whose self-test compares the count with `mxswitch plan --json` on machines
without torch). A cfg is a flat dict of the RON config's model and data
fields (see flux_torch.FLUX_SMALL).
"""

import struct

TIME_DIM = 256      # timestep embedding width


def f32(x):
    """x rounded to the nearest f32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def mlp_hidden(cfg):
    """hidden_size * mlp_ratio in f32, truncated, as FluxConfig::mlp_hidden.

    The f64 product of two f32 values is exact, so rounding it once to f32
    gives the f32 product."""
    return int(f32(f32(float(cfg["hidden_size"])) * f32(float(cfg["mlp_ratio"]))))


def param_shapes(cfg):
    """name -> (shape, init) for every parameter, as the Rust visit_params walk.

    init: "uniform" (U(-1/sqrt(in), 1/sqrt(in)), weights and biases, as the
    Rust Dense/QuantLinear and torch.nn.Linear), "zeros" (modulation and the
    final layer), "ones" (QK norm scales)."""
    h, m = cfg["hidden_size"], mlp_hidden(cfg)
    hd = h // cfg["num_heads"]
    out = {}

    def lin(name, fin, fout, bias=True, init="uniform"):
        out[name + ".weight"] = ((fout, fin), init)
        if bias:
            out[name + ".bias"] = ((fout,), init)

    def norm(name):
        out[name + ".query_norm.scale"] = ((hd,), "ones")
        out[name + ".key_norm.scale"] = ((hd,), "ones")

    lin("img_in", cfg["in_channels"], h)
    lin("time_in.in_layer", TIME_DIM, h)
    lin("time_in.out_layer", h, h)
    lin("vector_in.in_layer", cfg["vec_in_dim"], h)
    lin("vector_in.out_layer", h, h)
    lin("txt_in", cfg["context_in_dim"], h)
    qb = cfg.get("qkv_bias", True)
    for i in range(cfg["depth"]):
        p = f"double_blocks.{i}."
        for s in ("img", "txt"):
            lin(p + s + "_mod.lin", h, 6 * h, init="zeros")
            norm(p + s + "_attn.norm")
            lin(p + s + "_qkv", h, 3 * h, bias=qb)
            lin(p + s + "_proj", h, h)
            lin(p + s + "_mlp_fc1", h, m)
            lin(p + s + "_mlp_fc2", m, h)
    for i in range(cfg["depth_single_blocks"]):
        p = f"single_blocks.{i}."
        lin(p + "modulation.lin", h, 3 * h, init="zeros")
        norm(p + "norm")
        lin(p + "qkv", h, 3 * h, bias=qb)
        lin(p + "proj", h, h, bias=False)
        lin(p + "mlp_fc1", h, m)
        lin(p + "mlp_fc2", m, h)
    lin("final_layer.adaLN_modulation", h, 2 * h, init="zeros")
    lin("final_layer.linear", h, cfg["in_channels"], init="zeros")
    return out


def count_params(cfg):
    """Number of parameter values of the model."""
    total = 0
    for shape, _ in param_shapes(cfg).values():
        n = 1
        for d in shape:
            n *= d
        total += n
    return total
