use mxswitch::precision;

struct Linear;

// Three mistakes, reported together.
#[precision(mxfp5, switch_to = fp8, at = 0, order = deep_to_shallow, order = shallow_to_deep)]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
