use mxswitch::prelude::*;
#[precision(layer)]
struct B {
    #[quantize]
    a: QuantLinear,
}
#[precision(mxfp4, switch_to = fp8, at = 300)]
struct M<T> {
    #[layers]
    blocks: Vec<T>,
}
fn plan_of<T>(m: &M<T>) -> Plan {
    m.plan()
}
fn main() {
    let m = M::<B> { blocks: vec![] };
    let _ = m.plan();
    let _ = plan_of(&m);
}
