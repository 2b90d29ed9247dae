"""The subset of RON that mxswitch run configs use, read without the binary.

`parse(text)` gives Python values: a struct `(a: 1, b: "x")` (with or
without a name in front) is a dict, a tuple `(1, 2)` and a list `[1, 2]` are
lists, `Some(x)` is x, `None` is None, a bare identifier (an enum variant)
is its name as a string, a map `{k: v}` is a dict; numbers, strings, chars,
booleans and `//` / `/* */` comments as in RON. Errors raise RonError with
the line and column.

`load_run_config(name_or_path)` reads a config the way `mxswitch train
--config` does: a built-in name means models/configs/<name>.ron of this
checkout, anything else must be a .ron file. `flux_cfg(run)` flattens a run
config into the dict bench/flux_torch.py takes, with the checks the model
needs.
"""

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(REPO, "models", "configs")


class RonError(ValueError):
    """A RON syntax error, or a config that cannot describe a Flux run."""


_NUMBER = re.compile(r"[+-]?(?:0x[0-9a-fA-F_]+|0b[01_]+|0o[0-7_]+|(?:\d[\d_]*)?\.?\d[\d_]*(?:[eE][+-]?\d+)?|inf|NaN)")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Parser:
    def __init__(self, text, origin):
        self.s, self.i, self.origin = text, 0, origin

    def where(self, i=None):
        i = self.i if i is None else i
        line = self.s.count("\n", 0, i) + 1
        col = i - (self.s.rfind("\n", 0, i) + 1) + 1
        return f"{self.origin}:{line}:{col}"

    def fail(self, msg, i=None):
        raise RonError(f"{self.where(i)}: {msg}")

    def skip(self):
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\r\n":
                self.i += 1
            elif s.startswith("//", self.i):
                j = s.find("\n", self.i)
                self.i = len(s) if j < 0 else j + 1
            elif s.startswith("/*", self.i):
                depth, j = 1, self.i + 2
                while depth and j < len(s):
                    if s.startswith("/*", j):
                        depth, j = depth + 1, j + 2
                    elif s.startswith("*/", j):
                        depth, j = depth - 1, j + 2
                    else:
                        j += 1
                if depth:
                    self.fail("unterminated /* comment")
                self.i = j
            else:
                return

    def peek(self):
        self.skip()
        return self.s[self.i] if self.i < len(self.s) else ""

    def expect(self, c):
        if self.peek() != c:
            self.fail(f"expected `{c}`, found {self.found()}")
        self.i += 1

    def found(self):
        if self.i >= len(self.s):
            return "the end of the text"
        return f"`{self.s[self.i:self.i + 12].splitlines()[0]}`"

    def value(self):
        c = self.peek()
        if c == "":
            self.fail("expected a value, found the end of the text")
        if c == "(":
            return self.parens()
        if c == "[":
            return self.seq("[", "]")
        if c == "{":
            return self.map()
        if c == '"':
            return self.string()
        if c == "'":
            return self.char()
        m = _IDENT.match(self.s, self.i)
        if m and m.group() not in ("inf", "NaN"):
            return self.ident(m)
        m = _NUMBER.match(self.s, self.i)
        if m and m.group() not in ("", "+", "-"):
            return self.number(m)
        self.fail(f"expected a value, found {self.found()}")

    def ident(self, m):
        name = m.group()
        self.i = m.end()
        if name == "true":
            return True
        if name == "false":
            return False
        if name == "None":
            return None
        if self.peek() == "(":
            if name == "Some":
                self.i += 1
                v = self.value()
                if self.peek() == ",":
                    self.i += 1
                self.expect(")")
                return v
            return self.parens()  # a named struct or tuple variant: the name is dropped
        return name

    def number(self, m):
        text = m.group().replace("_", "")
        self.i = m.end()
        body = text.lstrip("+-")
        sign = -1 if text.startswith("-") else 1
        if body in ("inf", "NaN"):
            return sign * float(body.replace("NaN", "nan"))
        for prefix, base in (("0x", 16), ("0b", 2), ("0o", 8)):
            if body.startswith(prefix):
                return sign * int(body[2:], base)
        if any(ch in body for ch in ".eE"):
            return float(text)
        return int(text)

    def string(self):
        start = self.i
        self.i += 1
        out = []
        esc = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == '"':
                self.i += 1
                return "".join(out)
            if c == "\\":
                n = self.s[self.i + 1:self.i + 2]
                if n in esc:
                    out.append(esc[n])
                    self.i += 2
                elif n == "u":
                    m = re.match(r"\\u\{([0-9a-fA-F]{1,6})\}", self.s[self.i:])
                    if not m:
                        self.fail("bad \\u escape")
                    out.append(chr(int(m.group(1), 16)))
                    self.i += m.end()
                else:
                    self.fail(f"unknown escape `\\{n}`")
            else:
                out.append(c)
                self.i += 1
        self.fail("unterminated string", start)

    def char(self):
        m = re.match(r"'(\\.|[^'\\])'", self.s[self.i:])
        if not m:
            self.fail("bad char literal")
        self.i += m.end()
        body = m.group(1)
        return {"\\n": "\n", "\\t": "\t", "\\'": "'", "\\\\": "\\"}.get(body, body)

    def parens(self):
        """`(..)`: a struct when the first item is `name:`, else a tuple; `()` is an empty tuple."""
        self.expect("(")
        if self.peek() == ")":
            self.i += 1
            return []
        save = self.i
        m = _IDENT.match(self.s, self.i)
        if m:
            self.i = m.end()
            if self.peek() == ":":
                self.i = save
                return self.fields()
        self.i = save
        items = []
        while True:
            items.append(self.value())
            if self.peek() == ",":
                self.i += 1
                if self.peek() == ")":
                    break
            else:
                break
        self.expect(")")
        return items

    def fields(self):
        out = {}
        while True:
            self.skip()
            m = _IDENT.match(self.s, self.i)
            if not m:
                self.fail(f"expected a field name, found {self.found()}")
            key, at = m.group(), self.i
            self.i = m.end()
            self.expect(":")
            if key in out:
                self.fail(f"duplicate field `{key}`", at)
            out[key] = self.value()
            if self.peek() == ",":
                self.i += 1
                if self.peek() == ")":
                    break
            else:
                break
        self.expect(")")
        return out

    def seq(self, open_, close):
        self.expect(open_)
        items = []
        while self.peek() != close:
            items.append(self.value())
            if self.peek() == ",":
                self.i += 1
            elif self.peek() != close:
                self.fail(f"expected `,` or `{close}`, found {self.found()}")
        self.i += 1
        return items

    def map(self):
        self.expect("{")
        out = {}
        while self.peek() != "}":
            k = self.value()
            self.expect(":")
            out[k] = self.value()
            if self.peek() == ",":
                self.i += 1
            elif self.peek() != "}":
                self.fail(f"expected `,` or `}}`, found {self.found()}")
        self.i += 1
        return out


def parse(text, origin="<ron>"):
    """One RON value from `text`; anything after it but comments is an error."""
    p = _Parser(text, origin)
    v = p.value()
    if p.peek() != "":
        p.fail(f"unexpected {p.found()} after the value")
    return v


def builtin_names():
    """The configs under models/configs/, by name."""
    if not os.path.isdir(CONFIG_DIR):
        return []
    return sorted(f[:-4] for f in os.listdir(CONFIG_DIR) if f.endswith(".ron"))


def resolve(name_or_path):
    """The file a `--config` value names, as `mxswitch train` reads it."""
    if name_or_path in builtin_names():
        return os.path.join(CONFIG_DIR, name_or_path + ".ron")
    if not name_or_path.endswith(".ron"):
        raise RonError(f"unknown config `{name_or_path}`: give a built-in name "
                       f"({', '.join(builtin_names())}) or a .ron file")
    if not os.path.isfile(name_or_path):
        raise RonError(f"cannot read config {name_or_path}: no such file")
    return name_or_path


def load_run_config(name_or_path):
    """(path, parsed run config) of a built-in name or a .ron file."""
    path = resolve(name_or_path)
    with open(path) as f:
        text = f.read()
    run = parse(text, path)
    if not isinstance(run, dict):
        raise RonError(f"{path}: a run config is a struct `(model: (..), data: (..), train: (..), schedule: (..))`")
    return path, run


MODEL_KEYS = ("in_channels", "vec_in_dim", "context_in_dim", "hidden_size", "mlp_ratio", "num_heads", "depth",
              "depth_single_blocks", "axes_dim", "theta", "qkv_bias", "guidance_embed")
DATA_KEYS = ("latent_channels", "latent_height", "latent_width", "txt_tokens", "batch")


def flux_cfg(run, origin="config"):
    """The flat dict of bench/flux_torch.py: the model and data fields, lr,
    activations ("f32" or "bf16") and phases ([(start, recipe), ...])."""
    def section(name):
        sec = run.get(name)
        if not isinstance(sec, dict):
            raise RonError(f"{origin}: no `{name}: (..)` section")
        return sec

    model, data, train = section("model"), section("data"), section("train")
    cfg = {}
    for keys, sec, name in ((MODEL_KEYS, model, "model"), (DATA_KEYS, data, "data")):
        for k in keys:
            if k not in sec:
                raise RonError(f"{origin}: {name}.{k} is missing")
            cfg[k] = sec[k]
    for k in ("lr", "iters"):
        if k not in train:
            raise RonError(f"{origin}: train.{k} is missing")
    cfg["lr"] = float(train["lr"])
    cfg["iters"] = int(train["iters"])
    cfg["activations"] = train.get("activations", "f32")
    cfg["axes_dim"] = tuple(cfg["axes_dim"])
    phases = run.get("schedule", {}).get("phases", [])
    cfg["phases"] = [(int(p["start"]), str(p["recipe"])) for p in phases]
    h, heads = cfg["hidden_size"], cfg["num_heads"]
    if cfg["guidance_embed"]:
        raise RonError(f"{origin}: model.guidance_embed is true; bench/flux_torch.py has no guidance embedder")
    if heads <= 0 or h % heads or (h // heads) % 2:
        raise RonError(f"{origin}: model.num_heads {heads} must divide hidden_size {h} into an even head dimension")
    if sum(cfg["axes_dim"]) != h // heads:
        raise RonError(f"{origin}: model.axes_dim {list(cfg['axes_dim'])} must sum to the head dimension {h // heads}")
    if cfg["in_channels"] != 4 * cfg["latent_channels"]:
        raise RonError(f"{origin}: model.in_channels must be 4 x data.latent_channels")
    if cfg["latent_height"] % 2 or cfg["latent_width"] % 2:
        raise RonError(f"{origin}: data.latent_height and latent_width must be even (2x2 patches)")
    if cfg["activations"] not in ("f32", "bf16"):
        raise RonError(f"{origin}: train.activations must be \"f32\" or \"bf16\", got {cfg['activations']!r}")
    return cfg


def image_tokens(cfg):
    """Image tokens per sample: the 2x2 patches of the latent."""
    return (cfg["latent_height"] // 2) * (cfg["latent_width"] // 2)


def tokens_per_step(cfg):
    """Tokens of one training step: batch x (image + text tokens)."""
    return cfg["batch"] * (image_tokens(cfg) + cfg["txt_tokens"])
