use mxswitch::precision;

struct Linear;

// Recipes are compared by what they resolve to, not by how they are written.
#[precision(mxfp4, switch_to = mxfp4(tile2d = true), at = 12000)]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
