use mxswitch::precision;

struct Linear;

#[precision(config = "tests/configs/three_phase.ron", layers_per_iter = 4)]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
