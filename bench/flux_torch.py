"""Flux (models/src/flux/model.rs) in plain PyTorch, shared by the peers.

Functional over a dict of parameters named as mxswitch's checkpoint keys
(without the `param.` prefix), so a peer can load mxswitch's weights
(flux_tiny_peer.py) or make its own (`init_params`, flux_small_peer.py).
Only torch is needed here; the parameter shapes are flux_shapes.py's
(re-exported here as param_shapes, mlp_hidden and count_params).

The big linears of the blocks go through `Flux.qlin`, which a subclass can
override (flux_tiny_peer.py plugs in its fake-quantized recipes); by default
it is F.linear. Numerics follow the Rust model: QK RMSNorm in f32 and cast
back to v's dtype, RoPE in f32 and cast back, text tokens first.
"""

import math

import torch
import torch.nn.functional as F

from flux_shapes import TIME_DIM, count_params, mlp_hidden, param_shapes  # noqa: F401  (re-exported)

EPS = 1e-6          # LayerNorm and QK RMSNorm

# models/configs/flux-small.ron
FLUX_SMALL = dict(
    in_channels=64, vec_in_dim=768, context_in_dim=4096, hidden_size=768,
    mlp_ratio=4.0, num_heads=6, depth=4, depth_single_blocks=8,
    axes_dim=(16, 56, 56), theta=10000.0, qkv_bias=True,
    latent_channels=16, latent_height=32, latent_width=32, txt_tokens=256, batch=8,
    lr=1e-4,
)


def init_params(cfg, dtype=torch.float32, device="cpu", seed=0):
    """Fresh parameters (torch's RNG, not mxswitch's SplitMix64)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    shapes = param_shapes(cfg)
    params = {}
    for name, (shape, init) in shapes.items():
        if init == "zeros":
            t = torch.zeros(shape)
        elif init == "ones":
            t = torch.ones(shape)
        else:
            fan_in = shapes[name.rsplit(".", 1)[0] + ".weight"][0][1]
            bound = 1.0 / math.sqrt(fan_in)
            t = torch.rand(shape, generator=g) * (2 * bound) - bound
        params[name] = torch.nn.Parameter(t.to(device=device, dtype=dtype))
    return params


def rope_tables(cfg, txt_tokens, ph, pw):
    """[L, D/2] cos and sin (f32); text at (0,0,0), patch (r, c) at (0, r, c)."""
    cos, sin = [], []
    for tok in range(txt_tokens + ph * pw):
        if tok < txt_tokens:
            pos = (0.0, 0.0, 0.0)
        else:
            p = tok - txt_tokens
            pos = (0.0, float(p // pw), float(p % pw))
        rc, rs = [], []
        for axis, d in enumerate(cfg["axes_dim"]):
            for j in range(d // 2):
                omega = 1.0 / (cfg["theta"] ** (2.0 * j / d))
                a = pos[axis] * omega
                rc.append(math.cos(a))
                rs.append(math.sin(a))
        cos.append(rc)
        sin.append(rs)
    f = lambda v: torch.tensor(v, dtype=torch.float64).to(torch.float32)
    return f(cos), f(sin)


def timestep_embedding(ts, dim=TIME_DIM):
    """cos-first sinusoidal embedding of t * 1000 in f64, as the Rust; [B, dim] f32."""
    half = dim // 2
    ln = math.log(10000.0)
    freqs = [math.exp(-ln * i / half) for i in range(half)]
    out = []
    for t in ts:
        args = [(float(t) * 1000.0) * f for f in freqs]
        out.append([math.cos(a) for a in args] + [math.sin(a) for a in args])
    return torch.tensor(out, dtype=torch.float64).to(torch.float32)


class Flux:
    """Forward pass of models/src/flux/model.rs over a name -> Parameter dict.

    batch: dict with img [B, Li, in], txt [B, Lt, ctx], y [B, vec],
    temb [B, 256] (timestep_embedding); pe: rope_tables(...)."""

    def __init__(self, params, cfg):
        self.p = params
        self.cfg = cfg
        self.heads = cfg["num_heads"]

    def dense(self, x, name):
        return F.linear(x, self.p[name + ".weight"], self.p.get(name + ".bias"))

    def qlin(self, x, name):
        """The quantizable linears of the blocks (SPEC 8)."""
        return self.dense(x, name)

    def modulation(self, vec, name, n):
        out = self.dense(F.silu(vec), name + ".lin")[:, None, :].chunk(n, dim=-1)
        return [out[i:i + 3] for i in range(0, n, 3)]  # (shift, scale, gate)

    @staticmethod
    def modulate(m, x):
        return x * (1.0 + m[1]) + m[0]

    @staticmethod
    def ln(x):
        return F.layer_norm(x, x.shape[-1:], eps=EPS)

    def rms(self, x, name, dtype):
        """RMSNorm in f32 with a learnable scale, cast to dtype (no-ops in f32)."""
        xf = x.float()
        s = self.p[name].float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * s).to(dtype)

    def split_heads(self, qkv):
        b, l, h3 = qkv.shape
        d = h3 // 3 // self.heads
        x = qkv.reshape(b, l, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        return x[0], x[1], x[2]

    @staticmethod
    def rope(x, cos, sin):
        """Interleaved pairs, computed in f32 and cast back to x's dtype."""
        xr = x.float().reshape(*x.shape[:-1], -1, 2)
        x0, x1 = xr[..., 0], xr[..., 1]
        out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).reshape(x.shape)
        return out.to(x.dtype)

    def attention(self, q, k, v, pe):
        q, k = self.rope(q, *pe), self.rope(k, *pe)
        x = F.scaled_dot_product_attention(q, k, v)
        b, h, l, d = x.shape
        return x.permute(0, 2, 1, 3).reshape(b, l, h * d)

    def qk(self, qkv, norm):
        q, k, v = self.split_heads(qkv)
        return self.rms(q, norm + ".query_norm.scale", v.dtype), self.rms(k, norm + ".key_norm.scale", v.dtype), v

    def double_block(self, i, img, txt, vec, pe):
        p = f"double_blocks.{i}."
        im1, im2 = self.modulation(vec, p + "img_mod", 6)
        tm1, tm2 = self.modulation(vec, p + "txt_mod", 6)
        iq, ik, iv = self.qk(self.qlin(self.modulate(im1, self.ln(img)), p + "img_qkv"), p + "img_attn.norm")
        tq, tk, tv = self.qk(self.qlin(self.modulate(tm1, self.ln(txt)), p + "txt_qkv"), p + "txt_attn.norm")
        attn = self.attention(torch.cat((tq, iq), 2), torch.cat((tk, ik), 2), torch.cat((tv, iv), 2), pe)
        lt = txt.shape[1]
        txt_attn, img_attn = attn[:, :lt], attn[:, lt:]
        img = img + im1[2] * self.qlin(img_attn, p + "img_proj")
        h = F.gelu(self.qlin(self.modulate(im2, self.ln(img)), p + "img_mlp_fc1"), approximate="tanh")
        img = img + im2[2] * self.qlin(h, p + "img_mlp_fc2")
        txt = txt + tm1[2] * self.qlin(txt_attn, p + "txt_proj")
        h = F.gelu(self.qlin(self.modulate(tm2, self.ln(txt)), p + "txt_mlp_fc1"), approximate="tanh")
        txt = txt + tm2[2] * self.qlin(h, p + "txt_mlp_fc2")
        return img, txt

    def single_block(self, i, x, vec, pe):
        p = f"single_blocks.{i}."
        (m,) = self.modulation(vec, p + "modulation", 3)
        h = self.modulate(m, self.ln(x))
        q, k, v = self.qk(self.qlin(h, p + "qkv"), p + "norm")
        attn = self.attention(q, k, v, pe)
        mlp = F.gelu(self.qlin(h, p + "mlp_fc1"), approximate="tanh")
        out = self.qlin(attn, p + "proj") + self.qlin(mlp, p + "mlp_fc2")
        return x + m[2] * out

    def forward(self, batch, pe):
        img = self.dense(batch["img"], "img_in")
        vec = self.dense(F.silu(self.dense(batch["temb"], "time_in.in_layer")), "time_in.out_layer")
        vec = vec + self.dense(F.silu(self.dense(batch["y"], "vector_in.in_layer")), "vector_in.out_layer")
        txt = self.dense(batch["txt"], "txt_in")
        for i in range(self.cfg["depth"]):
            img, txt = self.double_block(i, img, txt, vec, pe)
        lt = txt.shape[1]
        x = torch.cat((txt, img), 1)
        for i in range(self.cfg["depth_single_blocks"]):
            x = self.single_block(i, x, vec, pe)
        img = x[:, lt:]
        shift, scale = self.dense(F.silu(vec), "final_layer.adaLN_modulation")[:, None, :].chunk(2, dim=-1)
        return self.dense(self.ln(img) * (1.0 + scale) + shift, "final_layer.linear")
