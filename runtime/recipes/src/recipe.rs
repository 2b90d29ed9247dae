//! A recipe with its options (SPEC sections 4 and 4a): a table row, the
//! option values written for it, and per-GEMM overrides naming other rows.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use crate::error::{At, RecipeError};
use crate::spec::{Gemm, LinearSpec, OperandSpec, SavedSpec, ScaleMode, Scaling};
use crate::table::{Opt, RecipeKind};

/// A recipe with its options. Build one with [`Recipe::new`] and
/// [`Recipe::from_parts`] (or `str::parse`), which check every option
/// against the table. Two recipes are equal when their resolved specs are
/// ([`Recipe::spec`], SPEC section 4a).
#[derive(Clone, Copy, Debug)]
pub struct Recipe {
    /// The table row the recipe starts from (its name).
    pub kind: RecipeKind,
    /// MX recipes: how block scales are chosen.
    pub scale: ScaleMode,
    /// MX and NVFP4 recipes: stochastic rounding of the gradient operands.
    pub sr: bool,
    /// MX and NVFP4 recipes: Hadamard-16 on both wgrad operands.
    pub hadamard: bool,
    /// MX, NVFP4 and FP8 block recipes: block x block weight tiles.
    pub tile2d: bool,
    /// FP8 recipes: power-of-two scales (tensorwise, rowwise or per block).
    pub pow2: bool,
    /// The recipe whose row the forward GEMM uses instead of this one's.
    pub fprop: Option<RecipeKind>,
    /// The recipe whose row the input-gradient GEMM uses.
    pub dgrad: Option<RecipeKind>,
    /// The recipe whose row the weight-gradient GEMM uses.
    pub wgrad: Option<RecipeKind>,
}

/// The operands of a spec, for rules that read or set all of them.
const fn operands(s: &LinearSpec) -> [OperandSpec; 6] {
    [
        s.fprop.a, s.fprop.b, s.dgrad.a, s.dgrad.b, s.wgrad.a, s.wgrad.b,
    ]
}

fn operands_mut(s: &mut LinearSpec) -> [&mut OperandSpec; 6] {
    let LinearSpec {
        fprop,
        dgrad,
        wgrad,
    } = s;
    [
        &mut fprop.a,
        &mut fprop.b,
        &mut dgrad.a,
        &mut dgrad.b,
        &mut wgrad.a,
        &mut wgrad.b,
    ]
}

impl Recipe {
    /// The recipe with its SPEC defaults, read off its table row.
    pub const fn new(kind: RecipeKind) -> Recipe {
        let s = &kind.row().spec;
        let ops = operands(s);
        // `scale` and `pow2` govern every MX / FP8 operand; their defaults
        // are the first such operand's (a row keeps them alike).
        let (mut scale, mut pow2) = (None, None);
        let mut i = 0;
        while i < ops.len() {
            if let (Scaling::Mx { mode, .. }, None) = (ops[i].scaling, scale) {
                scale = Some(mode);
            }
            if let (Some(p), None) = (ops[i].scaling.pow2(), pow2) {
                pow2 = Some(p);
            }
            i += 1;
        }
        Recipe {
            kind,
            scale: match scale {
                Some(m) => m,
                None => ScaleMode::Even,
            },
            sr: s.dgrad.a.sr,
            hadamard: s.wgrad.a.hadamard,
            tile2d: s.fprop.b.scaling.tiled(),
            pow2: match pow2 {
                Some(p) => p,
                None => false,
            },
            fprop: None,
            dgrad: None,
            wgrad: None,
        }
    }

    /// The recipe named `name` with `options` as `(key, value)` text, as
    /// written in `mxfp4(scale = rceil, fprop = bf16)`. Every mistake is
    /// reported, each [`At`] the name, key or value (by option index) at fault.
    pub fn from_parts(name: &str, options: &[(&str, &str)]) -> Result<Recipe, Vec<RecipeError>> {
        let kind = RecipeKind::from_name(name).map_err(|e| vec![e.at(At::Name)])?;
        let mut recipe = Recipe::new(kind);
        let mut errors = Vec::new();
        let mut set: Vec<(Opt, usize)> = Vec::new();
        for (i, &(key, value)) in options.iter().enumerate() {
            let opt = match recipe.opt(key, i) {
                Ok(opt) => opt,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            if set.iter().any(|&(seen, _)| seen == opt) {
                errors.push(
                    RecipeError::new(format!(
                        "duplicate option `{key}`: it is already set; remove one of them"
                    ))
                    .at(At::Key(i)),
                );
                continue;
            }
            match recipe.set(opt, value, i) {
                Ok(()) => set.push((opt, i)),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            for g in recipe.no_op_overrides() {
                let i = set
                    .iter()
                    .find(|(o, _)| gemm_of(*o) == Some(g))
                    .map_or(0, |s| s.1);
                errors.push(recipe.no_op_error(g).at(At::Value(i)));
            }
        }
        if errors.is_empty() {
            Ok(recipe)
        } else {
            Err(errors)
        }
    }

    /// Set one option, `key = value`; errors are [`At::Key`]`(0)` or
    /// [`At::Value`]`(0)`. An override that changes nothing is caught by
    /// [`Self::check`] (or [`Self::from_parts`]), once every option is set.
    pub fn with_option(mut self, key: &str, value: &str) -> Result<Recipe, RecipeError> {
        let opt = self.opt(key, 0)?;
        self.set(opt, value, 0)?;
        Ok(self)
    }

    /// The rule of SPEC section 4a that needs every option: an override
    /// that resolves to this recipe's own GEMM is an error.
    pub fn check(&self) -> Result<(), RecipeError> {
        match self.no_op_overrides().first() {
            Some(&g) => Err(self.no_op_error(g)),
            None => Ok(()),
        }
    }

    /// The key `key`, if this recipe takes it.
    fn opt(&self, key: &str, i: usize) -> Result<Opt, RecipeError> {
        let takes = || {
            let keys: Vec<&str> = self.kind.options().map(Opt::name).collect();
            format!("recipe `{}` takes {}", self.kind, keys.join(", "))
        };
        let opt = Opt::from_name(key).map_err(|e| {
            let sep = if e.message.ends_with('?') { "" } else { ";" };
            RecipeError::new(format!("{}{sep} {}", e.message, takes())).at(At::Key(i))
        })?;
        if !opt.applies_to(self.kind) {
            let who: Vec<&str> = RecipeKind::ALL
                .into_iter()
                .filter(|&k| opt.applies_to(k))
                .map(RecipeKind::name)
                .collect();
            return Err(RecipeError::new(format!(
                "option `{key}` does not apply to recipe `{}`: it applies to {}; {}",
                self.kind,
                who.join(", "),
                takes()
            ))
            .at(At::Key(i)));
        }
        Ok(opt)
    }

    fn set(&mut self, opt: Opt, value: &str, i: usize) -> Result<(), RecipeError> {
        let bad = |expected: &str| {
            RecipeError::new(format!("option `{opt}` takes {expected}, not `{value}`"))
                .at(At::Value(i))
        };
        let flag = || match value {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(bad("true or false")),
        };
        let recipe = || {
            RecipeKind::from_name(value).map_err(|e| {
                RecipeError::new(format!("option `{opt}` takes a recipe name: {e}"))
                    .at(At::Value(i))
            })
        };
        match opt {
            Opt::Scale => {
                self.scale = ScaleMode::from_name(value)
                    .map_err(|_| bad(&ScaleMode::ALL.map(ScaleMode::name).join(", ")))?
            }
            Opt::Sr => self.sr = flag()?,
            Opt::Hadamard => self.hadamard = flag()?,
            Opt::Tile2d => self.tile2d = flag()?,
            Opt::Pow2 => self.pow2 = flag()?,
            Opt::Fprop => self.fprop = Some(recipe()?),
            Opt::Dgrad => self.dgrad = Some(recipe()?),
            Opt::Wgrad => self.wgrad = Some(recipe()?),
        }
        Ok(())
    }

    /// The recipe whose row GEMM `g` uses: its override, else this recipe.
    pub fn gemm_kind(&self, g: Gemm) -> RecipeKind {
        self.override_of(g).unwrap_or(self.kind)
    }

    /// The per-GEMM override written for `g` (`fprop = ...` etc.), if any.
    pub const fn override_of(&self, g: Gemm) -> Option<RecipeKind> {
        match g {
            Gemm::Fprop => self.fprop,
            Gemm::Dgrad => self.dgrad,
            Gemm::Wgrad => self.wgrad,
        }
    }

    /// Every recipe whose row one of the GEMMs uses, base first, without
    /// repeats: the recipes whose code must be compiled in and warmed up.
    pub fn kinds(&self) -> Vec<RecipeKind> {
        let mut kinds = vec![self.kind];
        for g in Gemm::ALL {
            let k = self.gemm_kind(g);
            if !kinds.contains(&k) {
                kinds.push(k);
            }
        }
        kinds
    }

    /// The row under this recipe's own options, before overrides. Each
    /// option sets the operands its [`Opt`] docs name, where the row has them.
    fn base_spec(&self) -> LinearSpec {
        let row = self.kind.row();
        let mut s = row.spec;
        for &opt in row.options {
            match opt {
                Opt::Scale => operands_mut(&mut s).into_iter().for_each(|o| {
                    if let Some(mode) = o.scaling.mode_mut() {
                        *mode = self.scale;
                    }
                }),
                Opt::Pow2 => operands_mut(&mut s).into_iter().for_each(|o| {
                    if let Some(pow2) = o.scaling.pow2_mut() {
                        *pow2 = self.pow2;
                    }
                }),
                Opt::Tile2d => [&mut s.fprop.b, &mut s.dgrad.b].into_iter().for_each(|o| {
                    if let Some(tile) = o.scaling.tile_mut() {
                        *tile = self.tile2d;
                    }
                }),
                Opt::Hadamard => {
                    s.wgrad.a.hadamard = self.hadamard;
                    s.wgrad.b.hadamard = self.hadamard;
                }
                Opt::Sr => {
                    s.dgrad.a.sr = self.sr;
                    s.wgrad.a.sr = self.sr;
                }
                Opt::Fprop | Opt::Dgrad | Opt::Wgrad => {}
            }
        }
        s
    }

    /// The three GEMMs this recipe runs (SPEC section 4a): its row under its
    /// options, with each overridden GEMM taken from the named row.
    pub fn spec(&self) -> LinearSpec {
        let mut s = self.base_spec();
        for g in Gemm::ALL {
            if let Some(k) = self.override_of(g) {
                *s.gemm_mut(g) = *k.row().spec.gemm(g);
            }
        }
        s
    }

    /// What the forward keeps for the backward (SPEC section 4a).
    pub fn saved(&self) -> SavedSpec {
        self.spec().saved()
    }

    /// Bytes per saved element (see [`LinearSpec::saved_bytes_per_element`]).
    pub fn saved_bytes_per_element(&self) -> f64 {
        self.spec().saved_bytes_per_element()
    }

    fn no_op_overrides(&self) -> Vec<Gemm> {
        let base = self.base_spec();
        Gemm::ALL
            .into_iter()
            .filter(|&g| {
                self.override_of(g)
                    .is_some_and(|k| k.row().spec.gemm(g) == base.gemm(g))
            })
            .collect()
    }

    fn no_op_error(&self, g: Gemm) -> RecipeError {
        let k = self.gemm_kind(g);
        RecipeError::new(format!(
            "`{g} = {k}` changes nothing: the {g} of `{}` is already the `{k}` one; remove it \
             or name a recipe whose {g} differs",
            self.without_overrides()
        ))
    }

    fn without_overrides(&self) -> Recipe {
        Recipe {
            fprop: None,
            dgrad: None,
            wgrad: None,
            ..*self
        }
    }

    /// `key = value` for each option that differs from the defaults, in
    /// [`Opt::ALL`] order (so the per-GEMM keys come last, fprop first).
    fn written_options(&self) -> Vec<String> {
        let d = Recipe::new(self.kind);
        self.kind
            .options()
            .filter_map(|opt| {
                let (v, dv) = match opt {
                    Opt::Scale => (self.scale.name(), d.scale.name()),
                    Opt::Sr => (bool_name(self.sr), bool_name(d.sr)),
                    Opt::Hadamard => (bool_name(self.hadamard), bool_name(d.hadamard)),
                    Opt::Tile2d => (bool_name(self.tile2d), bool_name(d.tile2d)),
                    Opt::Pow2 => (bool_name(self.pow2), bool_name(d.pow2)),
                    Opt::Fprop | Opt::Dgrad | Opt::Wgrad => {
                        let g = gemm_of(opt)?;
                        return self.override_of(g).map(|k| format!("{opt} = {k}"));
                    }
                };
                (v != dv).then(|| format!("{opt} = {v}"))
            })
            .collect()
    }
}

/// The GEMM a per-GEMM key overrides.
fn gemm_of(opt: Opt) -> Option<Gemm> {
    match opt {
        Opt::Fprop => Some(Gemm::Fprop),
        Opt::Dgrad => Some(Gemm::Dgrad),
        Opt::Wgrad => Some(Gemm::Wgrad),
        _ => None,
    }
}

const fn bool_name(b: bool) -> &'static str {
    if b {
        "true"
    } else {
        "false"
    }
}

impl PartialEq for Recipe {
    fn eq(&self, other: &Recipe) -> bool {
        self.spec() == other.spec()
    }
}

impl Eq for Recipe {}

impl Hash for Recipe {
    /// Hashes the resolved spec, as equality compares it.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.spec().hash(state);
    }
}

impl fmt::Display for Recipe {
    /// The canonical name: the recipe, the options that differ from its
    /// defaults, then the overrides in the order fprop, dgrad, wgrad.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opts = self.written_options();
        if opts.is_empty() {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}({})", self.kind, opts.join(", "))
        }
    }
}

impl FromStr for Recipe {
    type Err = RecipeError;

    /// `mxfp4` or `mxfp4(scale = rceil, fprop = bf16)`, as [`fmt::Display`] writes it.
    fn from_str(text: &str) -> Result<Recipe, RecipeError> {
        let malformed = || {
            RecipeError::new(format!(
                "malformed recipe `{text}`: write a name such as `mxfp4`, or a name with \
                 options, `mxfp4(scale = rceil, fprop = bf16)`"
            ))
        };
        let text = text.trim();
        let (name, options) = match text.split_once('(') {
            None => (text, Vec::new()),
            Some((name, rest)) => {
                let inner = rest.strip_suffix(')').ok_or_else(malformed)?;
                let options = inner
                    .split(',')
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').ok_or_else(malformed)?;
                        Ok((k.trim(), v.trim()))
                    })
                    .collect::<Result<Vec<_>, RecipeError>>()?;
                (name.trim(), options)
            }
        };
        Recipe::from_parts(name, &options)
            .map_err(|errors| errors.into_iter().next().unwrap_or_else(malformed))
    }
}
