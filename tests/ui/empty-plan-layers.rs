use mxswitch::precision;
use mxswitch::runtime::module::{ParamSlot, Parameters};
use mxswitch::runtime::plan::{LinearSite, PlanCx, PlanLayer, PlanLinear, Planned};

/// A layer type, written by hand, that can never hold a quantized linear.
struct Norm;

impl Parameters for Norm {
    fn visit_params(&mut self, _: &str, _: &mut dyn FnMut(ParamSlot<'_>)) {}
}

impl PlanLayer for Norm {}

impl Planned for Norm {
    const CAN_HOLD_LINEARS: bool = false;
    fn visit_linears(&self, _: &mut PlanCx, _: &mut dyn FnMut(LinearSite, &dyn PlanLinear)) {}
    fn visit_linears_mut(
        &mut self,
        _: &mut PlanCx,
        _: &mut dyn FnMut(LinearSite, &mut dyn PlanLinear),
    ) {
    }
}

#[precision(mxfp4, switch_to = fp8, at = 12000)]
struct Flux {
    #[layers]
    norms: Vec<Norm>,
}

fn main() {}
