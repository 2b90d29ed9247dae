use mxswitch::precision;

#[precision(mxfp4)]
enum Flux {
    Schnell,
    Dev,
}

fn main() {}
