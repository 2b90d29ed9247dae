use mxswitch::precision;

#[precision(mxfp4)]
union Flux {
    bits: u32,
    value: f32,
}

fn main() {}
