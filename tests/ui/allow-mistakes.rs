use mxswitch::precision;

struct Linear;

// Every mistake of `allow` at once: an unknown name, options, a repeat and
// a recipe the schedule already names.
#[precision(mxfp4, switch_to = fp8, at = 12000, allow = [nvfp5, fp8_block(pow2 = true), fp8_rowwise, fp8_rowwise, fp8])]
struct Flux {
    #[quantize]
    img_in: Linear,
}

#[precision(mxfp4, allow = [])]
struct Empty {
    #[quantize]
    img_in: Linear,
}

fn main() {}
