use mxswitch::precision;

struct Linear;

// A per-GEMM option names a recipe.
#[precision(mxfp4, switch_to = mxfp4(fprop = bf17), at = 12000)]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
