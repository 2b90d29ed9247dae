use mxswitch::precision;

struct Linear;

#[precision(config = "tests/configs/unknown-recipe.ron")]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
