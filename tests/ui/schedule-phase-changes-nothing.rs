use mxswitch::precision;

struct Linear;

// EVEN is mxfp4's default scale mode, so the second phase resolves to the first.
#[precision(schedule = [mxfp4 @ 0, mxfp4(scale = even) @ 100, mxfp4(fprop = bf16) @ 200])]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
