use mxswitch::precision;

struct Linear;

// `fprop = mxfp4` is what mxfp4 runs already (SPEC section 4a).
#[precision(mxfp4(fprop = mxfp4), switch_to = fp8, at = 12000)]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
