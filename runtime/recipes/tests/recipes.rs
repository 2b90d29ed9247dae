//! SPEC sections 4 and 4a, number by number: the table's operand specs,
//! defaults, options, per-GEMM overrides, equality, names and saved bytes.

use std::collections::HashSet;

use mxswitch_recipes::{
    At, Elem, Gemm, OperandSpec, Opt, Recipe, RecipeKind, ScaleMode, Scaling, FP8_BLOCK, MX_BLOCK,
    NVFP4_BLOCK, TABLE,
};

fn r(text: &str) -> Recipe {
    text.parse()
        .unwrap_or_else(|e| panic!("`{text}` should parse: {e}"))
}

fn err(text: &str) -> String {
    match text.parse::<Recipe>() {
        Ok(r) => panic!("`{text}` should be refused, got {r}"),
        Err(e) => e.message,
    }
}

#[test]
fn saved_bytes_follow_the_spec() {
    for (text, want) in [
        ("mxfp4", 0.53125),
        ("fp8", 1.0),
        ("fp8_fnuz", 1.0),
        ("mxfp8", 1.03125),
        ("bf16", 2.0),
        ("mxfp4(fprop = bf16)", 0.53125),
        ("mxfp4(dgrad = fp8, wgrad = fp8)", 1.0),
        // NVFP4: half a byte of code and an E4M3 byte per 16 (the f32
        // tensor scale is one scalar, counted as nothing per element).
        ("nvfp4", 0.5625),
        (
            "nvfp4(sr = false, hadamard = false, tile2d = false)",
            0.5625,
        ),
        // FP8 rowwise: a byte of code; the scale pair of each row is per
        // reduction-axis length, so its share depends on the shape.
        ("fp8_rowwise", 1.0),
        ("fp8_rowwise(pow2 = false)", 1.0),
        // FP8 128-block: a byte of code plus two f32 (scale, inverse) per 128.
        ("fp8_block", 1.0625),
        ("fp8_block(tile2d = false, pow2 = true)", 1.0625),
        ("mxfp4(dgrad = fp8_block, wgrad = fp8_block)", 1.0625),
        ("fp8(wgrad = nvfp4)", 1.0),
        ("fp8(dgrad = nvfp4, wgrad = nvfp4)", 0.5625),
    ] {
        assert_eq!(r(text).saved_bytes_per_element(), want, "{text}");
    }
    // bf16 saves x and re-reads the master weight.
    let bf16 = r("bf16").saved();
    assert_eq!((bf16.x, bf16.w), (OperandSpec::BF16, None));
    // A BF16 dgrad saves no W; an MXFP4 wgrad still saves x in MXFP4.
    let s = r("mxfp4(dgrad = bf16)").saved();
    assert_eq!(s.w, None);
    assert_eq!(s.bytes_per_element(), (0.53125, 0.0));
    // x and W saved in different forms: each is reported.
    let s = r("mxfp4(wgrad = bf16)").saved();
    assert_eq!(s.bytes_per_element(), (2.0, 0.53125));
    assert_eq!(r("mxfp4(wgrad = bf16)").saved_bytes_per_element(), 2.0);
}

#[test]
fn the_mxfp4_row_is_spec_section_4() {
    let s = r("mxfp4").spec();
    let mx = |tile, hadamard| OperandSpec {
        elem: Elem::E2M1,
        scaling: Scaling::Mx {
            block: 32,
            mode: ScaleMode::Even,
            tile,
        },
        hadamard,
        sr: false,
    };
    assert_eq!((s.fprop.a, s.fprop.b), (mx(false, false), mx(true, false)));
    assert_eq!((s.dgrad.a, s.dgrad.b), (mx(false, false), mx(true, false)));
    assert_eq!((s.wgrad.a, s.wgrad.b), (mx(false, true), mx(false, true)));
    assert_eq!(MX_BLOCK, 32);
}

#[test]
fn the_fp8_rows_use_e4m3_forward_and_e5m2_gradients() {
    for (name, fwd, grad) in [
        ("fp8", Elem::E4M3, Elem::E5M2),
        ("fp8_fnuz", Elem::E4M3Fnuz, Elem::E5M2Fnuz),
    ] {
        let s = r(name).spec();
        let elems = [
            s.fprop.a.elem,
            s.fprop.b.elem,
            s.dgrad.a.elem,
            s.dgrad.b.elem,
            s.wgrad.a.elem,
            s.wgrad.b.elem,
        ];
        assert_eq!(elems, [fwd, fwd, grad, fwd, grad, fwd], "{name}");
        assert_eq!(s.fprop.a.scaling, Scaling::Tensorwise { pow2: false });
    }
    let s = r("fp8(pow2 = true)").spec();
    assert_eq!(s.wgrad.a.scaling, Scaling::Tensorwise { pow2: true });
}

#[test]
fn defaults_round_trip_through_the_options() {
    for row in &TABLE {
        assert_eq!(Recipe::new(row.kind).spec(), row.spec, "{}", row.name);
        assert_eq!(Recipe::new(row.kind).to_string(), row.name);
    }
    let m4 = Recipe::new(RecipeKind::Mxfp4);
    assert_eq!(
        (m4.scale, m4.sr, m4.hadamard, m4.tile2d),
        (ScaleMode::Even, false, true, true)
    );
    let m8 = Recipe::new(RecipeKind::Mxfp8);
    assert_eq!(
        (m8.scale, m8.sr, m8.hadamard, m8.tile2d),
        (ScaleMode::Rceil, false, false, false)
    );
    assert!(!Recipe::new(RecipeKind::Fp8).pow2);
}

#[test]
fn options_set_the_operands_they_name() {
    let s = r("mxfp4(scale = rceil, sr = true, hadamard = false, tile2d = false)").spec();
    let ops = [
        s.fprop.a, s.fprop.b, s.dgrad.a, s.dgrad.b, s.wgrad.a, s.wgrad.b,
    ];
    for (i, op) in ops.iter().enumerate() {
        assert_eq!(
            op.scaling,
            Scaling::Mx {
                block: 32,
                mode: ScaleMode::Rceil,
                tile: false
            },
            "operand {i}"
        );
        assert!(!op.hadamard, "operand {i}");
    }
    // SR on the gradient operands only: dy of dgrad and of wgrad.
    let sr: Vec<bool> = ops.iter().map(|o| o.sr).collect();
    assert_eq!(sr, [false, false, true, false, true, false]);
}

#[test]
fn per_gemm_overrides_take_the_named_row() {
    let fwd_bf16 = r("mxfp4(fprop = bf16)");
    let s = fwd_bf16.spec();
    assert!(s.fprop.is_bf16());
    assert_eq!(s.dgrad, r("mxfp4").spec().dgrad);
    assert_eq!(s.wgrad, r("mxfp4").spec().wgrad);
    assert_eq!(fwd_bf16.gemm_kind(Gemm::Fprop), RecipeKind::Bf16);
    assert_eq!(fwd_bf16.kinds(), [RecipeKind::Mxfp4, RecipeKind::Bf16]);

    let bwd_fp8 = r("mxfp4(dgrad = fp8, wgrad = fp8)").spec();
    assert_eq!(bwd_fp8.fprop, r("mxfp4").spec().fprop);
    assert_eq!(bwd_fp8.dgrad, r("fp8").spec().dgrad);
    assert_eq!(bwd_fp8.wgrad, r("fp8").spec().wgrad);

    // The override takes the named row with its defaults; the base's own
    // options still hold for the other GEMMs.
    let s = r("mxfp4(scale = rceil, fprop = mxfp8)").spec();
    assert_eq!(s.fprop, r("mxfp8").spec().fprop);
    assert!(matches!(
        s.dgrad.a.scaling,
        Scaling::Mx {
            mode: ScaleMode::Rceil,
            ..
        }
    ));
}

#[test]
fn recipes_are_equal_when_their_specs_are() {
    assert_eq!(r("mxfp4(scale = even)"), r("mxfp4"));
    assert_ne!(r("mxfp4(fprop = bf16)"), r("mxfp4"));
    assert_eq!(
        r("fp8(fprop = bf16, dgrad = bf16, wgrad = bf16)"),
        r("bf16")
    );
    // Hash agrees with equality.
    let set: HashSet<Recipe> = ["mxfp4", "mxfp4(scale = even)", "mxfp4(hadamard = true)"]
        .into_iter()
        .map(r)
        .collect();
    assert_eq!(set.len(), 1);
}

#[test]
fn names_are_canonical() {
    for (text, want) in [
        ("mxfp4(fprop = bf16)", "mxfp4(fprop = bf16)"),
        (
            "mxfp4(wgrad = fp8, dgrad = fp8)",
            "mxfp4(dgrad = fp8, wgrad = fp8)",
        ),
        (
            "mxfp4(fprop = bf16, sr = true, scale = rceil)",
            "mxfp4(scale = rceil, sr = true, fprop = bf16)",
        ),
        ("mxfp4(scale = even, tile2d = true)", "mxfp4"),
        ("fp8(pow2 = true)", "fp8(pow2 = true)"),
        ("  mxfp8 ( scale = floor ) ", "mxfp8(scale = floor)"),
    ] {
        let recipe = r(text);
        assert_eq!(recipe.to_string(), want, "{text}");
        assert_eq!(r(want), recipe, "{want} parses back");
    }
}

#[test]
fn an_override_that_changes_nothing_is_an_error() {
    let e = err("mxfp4(fprop = mxfp4)");
    assert!(e.starts_with("`fprop = mxfp4` changes nothing"), "{e}");
    // mxfp8's dgrad row differs from mxfp4's, so this one does something.
    r("mxfp4(dgrad = mxfp8)");
    // With RCEIL scales the base's fprop is no longer the mxfp4 row.
    r("mxfp4(scale = rceil, fprop = mxfp4)");
    assert!(err("bf16(wgrad = bf16)").contains("changes nothing"));
    // fp8 and fp8_fnuz differ in every GEMM.
    r("fp8(fprop = fp8_fnuz)");
    // With SR on, the base's wgrad differs from the mxfp4 row (no SR).
    r("mxfp4(sr = true, wgrad = mxfp4)");
    let errors =
        Recipe::from_parts("mxfp4", &[("hadamard", "true"), ("wgrad", "mxfp4")]).unwrap_err();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].at, At::Value(1));
    assert!(Recipe::new(RecipeKind::Mxfp4)
        .with_option("fprop", "mxfp4")
        .unwrap()
        .check()
        .is_err());
}

#[test]
fn options_are_checked_against_the_table() {
    assert_eq!(
        err("fp8(scale = even)"),
        "option `scale` does not apply to recipe `fp8`: it applies to mxfp4, mxfp8; \
         recipe `fp8` takes pow2, fprop, dgrad, wgrad"
    );
    assert_eq!(
        err("mxfp4(sclae = rceil)"),
        "unknown recipe option `sclae`; did you mean `scale`? recipe `mxfp4` takes scale, sr, \
         hadamard, tile2d, fprop, dgrad, wgrad"
    );
    assert_eq!(
        err("bf16(bogus = 1)"),
        "unknown recipe option `bogus`; recipe `bf16` takes fprop, dgrad, wgrad"
    );
    assert_eq!(
        err("mxfp4(sr = yes)"),
        "option `sr` takes true or false, not `yes`"
    );
    assert_eq!(
        err("mxfp4(scale = round)"),
        "option `scale` takes floor, ceil, even, rceil, not `round`"
    );
    assert_eq!(
        err("mxfp4(fprop = bf17)"),
        "option `fprop` takes a recipe name: unknown recipe `bf17`; did you mean `bf16`?"
    );
    assert_eq!(
        err("mxfp4(sr = true, sr = false)"),
        "duplicate option `sr`: it is already set; remove one of them"
    );
    assert!(err("mxfp4(sr)").starts_with("malformed recipe"));
    assert!(err("mxfp5").starts_with("unknown recipe `mxfp5`; did you mean `mxfp4`?"));
    // Every recipe takes the per-GEMM keys.
    for kind in RecipeKind::ALL {
        for opt in Opt::GEMMS {
            assert!(opt.applies_to(kind), "{kind} {opt}");
        }
    }
}

#[test]
fn every_mistake_is_reported_where_it_is() {
    let errors = Recipe::from_parts(
        "fp8",
        &[("scale", "even"), ("pow2", "maybe"), ("fprop", "bf16")],
    )
    .unwrap_err();
    let at: Vec<At> = errors.iter().map(|e| e.at).collect();
    assert_eq!(at, [At::Key(0), At::Value(1)]);
    let errors = Recipe::from_parts("fp9", &[("pow2", "true")]).unwrap_err();
    assert_eq!(errors[0].at, At::Name);
}

#[test]
fn the_nvfp4_row_is_the_mxfp4_table_with_nvfp4_operands() {
    let s = r("nvfp4").spec();
    let nv = |tile, hadamard, sr| OperandSpec {
        elem: Elem::E2M1,
        scaling: Scaling::Nvfp4 { block: 16, tile },
        hadamard,
        sr,
    };
    assert_eq!(
        (s.fprop.a, s.fprop.b),
        (nv(false, false, false), nv(true, false, false))
    );
    assert_eq!(
        (s.dgrad.a, s.dgrad.b),
        (nv(false, false, true), nv(true, false, false))
    );
    assert_eq!(
        (s.wgrad.a, s.wgrad.b),
        (nv(false, true, true), nv(false, true, false))
    );
    assert_eq!(NVFP4_BLOCK, 16);
    let d = Recipe::new(RecipeKind::Nvfp4);
    assert_eq!((d.sr, d.hadamard, d.tile2d), (true, true, true));
    // The options set the operands they name, as for MX.
    let s = r("nvfp4(sr = false, hadamard = false, tile2d = false)").spec();
    for (g, op) in [
        ("fprop x", s.fprop.a),
        ("fprop W", s.fprop.b),
        ("dgrad dy", s.dgrad.a),
        ("dgrad W", s.dgrad.b),
        ("wgrad dy", s.wgrad.a),
        ("wgrad x", s.wgrad.b),
    ] {
        assert_eq!(op, nv(false, false, false), "{g}");
    }
    let keys: Vec<&str> = RecipeKind::Nvfp4.options().map(Opt::name).collect();
    assert_eq!(
        keys,
        ["sr", "hadamard", "tile2d", "fprop", "dgrad", "wgrad"]
    );
}

#[test]
fn the_fp8_group_rows_are_e4m3_everywhere() {
    let s = r("fp8_rowwise").spec();
    let row = |pow2| OperandSpec {
        elem: Elem::E4M3,
        scaling: Scaling::Rowwise { pow2 },
        hadamard: false,
        sr: false,
    };
    for g in Gemm::ALL {
        let gs = s.gemm(g);
        assert_eq!((gs.a, gs.b), (row(true), row(true)), "{g}");
    }
    assert!(Recipe::new(RecipeKind::Fp8Rowwise).pow2);
    let s = r("fp8_rowwise(pow2 = false)").spec();
    assert_eq!(s.wgrad.a, row(false));

    let block = |tile, pow2| OperandSpec {
        elem: Elem::E4M3,
        scaling: Scaling::Block {
            block: 128,
            tile,
            pow2,
        },
        hadamard: false,
        sr: false,
    };
    let s = r("fp8_block").spec();
    assert_eq!(
        (s.fprop.a, s.fprop.b),
        (block(false, false), block(true, false))
    );
    assert_eq!(
        (s.dgrad.a, s.dgrad.b),
        (block(false, false), block(true, false))
    );
    assert_eq!(
        (s.wgrad.a, s.wgrad.b),
        (block(false, false), block(false, false))
    );
    assert_eq!(FP8_BLOCK, 128);
    let d = Recipe::new(RecipeKind::Fp8Block);
    assert_eq!((d.tile2d, d.pow2), (true, false));
    let s = r("fp8_block(tile2d = false, pow2 = true)").spec();
    assert_eq!(
        (s.fprop.b, s.dgrad.b),
        (block(false, true), block(false, true))
    );
    assert_eq!(s.wgrad.a, block(false, true));
    let keys: Vec<&str> = RecipeKind::Fp8Block.options().map(Opt::name).collect();
    assert_eq!(keys, ["tile2d", "pow2", "fprop", "dgrad", "wgrad"]);
    let keys: Vec<&str> = RecipeKind::Fp8Rowwise.options().map(Opt::name).collect();
    assert_eq!(keys, ["pow2", "fprop", "dgrad", "wgrad"]);
}

#[test]
fn the_new_recipes_take_part_in_per_gemm_overrides() {
    // The mxfp4 forward and wgrad, an FP8 128-block dgrad.
    let s = r("mxfp4(dgrad = fp8_block)").spec();
    assert_eq!(s.fprop, r("mxfp4").spec().fprop);
    assert_eq!(s.dgrad, r("fp8_block").spec().dgrad);
    assert_eq!(s.wgrad, r("mxfp4").spec().wgrad);
    // Saved: x as mxfp4's wgrad reads it, W as fp8_block's dgrad does.
    let saved = r("mxfp4(dgrad = fp8_block)").saved();
    assert_eq!(saved.bytes_per_element(), (0.53125, 1.0625));
    // An NVFP4 wgrad under tensorwise FP8: SR and Hadamard come with the row.
    let s = r("fp8(wgrad = nvfp4)").spec();
    assert_eq!(s.wgrad, r("nvfp4").spec().wgrad);
    assert!(s.wgrad.a.sr && s.wgrad.a.hadamard && s.wgrad.b.hadamard);
    assert_eq!(s.fprop, r("fp8").spec().fprop);
    assert_eq!(
        r("fp8(wgrad = nvfp4)").kinds(),
        [RecipeKind::Fp8, RecipeKind::Nvfp4]
    );
    // Overrides naming the new rows, and the new rows overridden.
    for text in [
        "nvfp4(fprop = bf16)",
        "nvfp4(dgrad = fp8_rowwise, wgrad = fp8_rowwise)",
        "fp8_block(wgrad = nvfp4)",
        "fp8_rowwise(fprop = fp8_block)",
        "mxfp4(fprop = nvfp4)",
    ] {
        let recipe = r(text);
        assert_eq!(recipe.to_string(), text, "canonical");
        assert_ne!(recipe, Recipe::new(recipe.kind), "{text} changes a GEMM");
    }
    // No-op overrides are refused, as for every recipe.
    for text in [
        "nvfp4(wgrad = nvfp4)",
        "fp8_rowwise(fprop = fp8_rowwise)",
        "fp8_block(dgrad = fp8_block)",
    ] {
        assert!(err(text).contains("changes nothing"), "{text}");
    }
    // With its options changed the base's GEMM differs from the row's.
    r("nvfp4(sr = false, wgrad = nvfp4)");
    r("fp8_block(tile2d = false, fprop = fp8_block)");
    // fp8_block's wgrad has no tiles, so `tile2d` leaves it as the row's.
    assert!(err("fp8_block(tile2d = false, wgrad = fp8_block)").contains("changes nothing"));
}

#[test]
fn the_new_recipes_have_canonical_names_and_compare_by_spec() {
    for (text, want) in [
        ("nvfp4(sr = true, hadamard = true, tile2d = true)", "nvfp4"),
        (
            "nvfp4(tile2d = false, sr = false)",
            "nvfp4(sr = false, tile2d = false)",
        ),
        ("fp8_rowwise(pow2 = true)", "fp8_rowwise"),
        ("fp8_rowwise(pow2 = false)", "fp8_rowwise(pow2 = false)"),
        (
            "fp8_block(pow2 = true, tile2d = false)",
            "fp8_block(tile2d = false, pow2 = true)",
        ),
        (
            "fp8_block(wgrad = nvfp4, pow2 = true)",
            "fp8_block(pow2 = true, wgrad = nvfp4)",
        ),
    ] {
        let recipe = r(text);
        assert_eq!(recipe.to_string(), want, "{text}");
        assert_eq!(r(want), recipe, "{want} parses back");
    }
    assert_eq!(r("fp8_block(pow2 = false)"), r("fp8_block"));
    // Every GEMM overridden: the base row no longer matters.
    assert_eq!(
        r("nvfp4(fprop = fp8_rowwise, dgrad = fp8_rowwise, wgrad = fp8_rowwise)"),
        r("fp8_rowwise")
    );
    assert_ne!(r("fp8_rowwise"), r("fp8_block"));
    assert_ne!(r("nvfp4(hadamard = false)"), r("nvfp4"));
}

#[test]
fn the_new_recipes_options_are_checked_against_the_table() {
    assert_eq!(
        err("nvfp4(scale = rceil)"),
        "option `scale` does not apply to recipe `nvfp4`: it applies to mxfp4, mxfp8; \
         recipe `nvfp4` takes sr, hadamard, tile2d, fprop, dgrad, wgrad"
    );
    assert_eq!(
        err("fp8_rowwise(tile2d = true)"),
        "option `tile2d` does not apply to recipe `fp8_rowwise`: it applies to mxfp4, mxfp8, \
         nvfp4, fp8_block; recipe `fp8_rowwise` takes pow2, fprop, dgrad, wgrad"
    );
    assert_eq!(
        err("fp8_block(sr = true)"),
        "option `sr` does not apply to recipe `fp8_block`: it applies to mxfp4, mxfp8, nvfp4; \
         recipe `fp8_block` takes tile2d, pow2, fprop, dgrad, wgrad"
    );
    assert_eq!(
        err("nvfp4(pow2 = true)"),
        "option `pow2` does not apply to recipe `nvfp4`: it applies to fp8, fp8_fnuz, \
         fp8_rowwise, fp8_block; recipe `nvfp4` takes sr, hadamard, tile2d, fprop, dgrad, wgrad"
    );
    assert!(err("nvfp5").starts_with("unknown recipe `nvfp5`; did you mean `nvfp4`?"));
    assert!(
        err("fp8_rowise").starts_with("unknown recipe `fp8_rowise`; did you mean `fp8_rowwise`?")
    );
    assert!(err("mxfp4(dgrad = fp8_blok)").contains("did you mean `fp8_block`?"));
}
