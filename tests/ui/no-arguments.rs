use mxswitch::precision;

struct Linear;

#[precision]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
