//! The loss-curve PNG: training loss, eval loss and each switch of the
//! schedule, with ticks, axis labels, a legend and a title. Text is drawn by
//! plotters' pure-Rust `ab_glyph` path with DejaVu Sans from the `dejavu`
//! crate, so no system font library (fontconfig, freetype) is needed. The
//! picture is drawn in memory and written atomically, so a failed plot
//! leaves no broken file.

use std::path::Path;
use std::sync::OnceLock;

use image::ImageEncoder as _;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::{RangedCoordf64, RangedCoordu64};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::files;
use mxswitch_runtime::{Error, Result};

/// A switch of the schedule: at `iter`, the run moves to `recipe`.
#[derive(Clone, Debug, PartialEq)]
pub struct Switch {
    pub iter: u64,
    pub recipe: String,
}

/// The loss axis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Scale {
    /// Linear axis from (about) zero: the default.
    #[default]
    Linear,
    /// Log10 axis: shows late, small improvements that a linear axis flattens.
    Log,
}

/// Everything one loss plot shows.
#[derive(Clone, Debug)]
pub struct LossPlot<'a> {
    /// The title, e.g. "flux-tiny: mxfp4 @ 0, fp8 @ 40" (the caller writes it).
    pub title: &'a str,
    /// Training loss per iteration, in order.
    pub steps: &'a [(u64, f32)],
    /// Eval loss at the iteration after which it was measured, in order (may be empty).
    pub evals: &'a [(u64, f32)],
    /// The schedule's switches (the first phase is not a switch).
    pub switches: &'a [Switch],
    /// Linear or log loss axis.
    pub scale: Scale,
}

const SIZE: (u32, u32) = (960, 540);
/// The family plotters' default text styles ask for; the embedded font is
/// registered under it.
const FONT: &str = "sans-serif";
const TRAIN: RGBColor = RGBColor(31, 119, 180);
const EVAL: RGBColor = RGBColor(230, 115, 0);
const SWITCH: RGBColor = RGBColor(200, 30, 30);
/// Pixels above the chart for the title and the legend.
const TOP_BAND: u32 = 64;

/// Draw `plot` and write it to `path` as PNG, atomically.
pub fn loss_curve(path: &Path, plot: &LossPlot) -> Result<()> {
    let png = render(plot).map_err(|e| Error::Io(format!("loss plot {}: {e}", path.display())))?;
    files::write_atomically(path, |f| std::io::Write::write_all(f, &png))?;
    Ok(())
}

/// The PNG bytes of `plot`; the error is plotters' or the encoder's.
fn render(plot: &LossPlot) -> std::result::Result<Vec<u8>, String> {
    register_font()?;
    let mut rgb = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
    draw(&mut rgb, plot)?;
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(&rgb, SIZE.0, SIZE.1, image::ColorType::Rgb8)
        .map_err(err)?;
    Ok(png)
}

/// Register DejaVu Sans once per process: plotters keeps fonts in a global table.
fn register_font() -> std::result::Result<(), String> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    ok.then_some(())
        .ok_or_else(|| "the embedded DejaVu Sans font does not parse".to_string())
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The y value drawn for `loss`: itself, or its log10 on a log axis; `None`
/// for what the axis cannot show (non-finite, or non-positive on a log axis).
fn plot_y(scale: Scale, loss: f32) -> Option<f64> {
    let l = f64::from(loss);
    match scale {
        Scale::Linear => l.is_finite().then_some(l),
        Scale::Log => (l.is_finite() && l > 0.0).then(|| l.log10()),
    }
}

/// The axis ranges: x over all points (at least one iteration wide), y with
/// headroom, most at the top where the switch labels go. An empty plot gets
/// a unit frame.
fn ranges(scale: Scale, all: &[(u64, f64)]) -> ((u64, u64), (f64, f64)) {
    if all.is_empty() {
        return ((0, 1), (0.0, 1.0));
    }
    let x0 = all.iter().map(|p| p.0).min().unwrap_or(0);
    let x1 = all.iter().map(|p| p.0).max().unwrap_or(0);
    // One iteration: centre it in a range two wide (plotters needs x0 < x1).
    let (x0, x1) = match x0 < x1 {
        true => (x0, x1),
        false => (x0.saturating_sub(1), x0.saturating_sub(1).saturating_add(2)),
    };
    let lo = all.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let hi = all.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let span = match scale {
        _ if hi > lo => hi - lo,
        Scale::Log => 1.0,
        Scale::Linear if hi != 0.0 => hi.abs(),
        Scale::Linear => 1.0,
    };
    let mut y0 = lo - 0.05 * span;
    if scale == Scale::Linear && lo >= 0.0 && y0 < 0.0 {
        y0 = 0.0; // a loss axis that dips below zero only confuses
    }
    ((x0, x1), (y0, hi + 0.15 * span))
}

/// The y ticks as (drawn y, label). Linear: plotters' round numbers. Log:
/// 1-2-5 per decade, fewer over many decades, and over less than a few
/// ticks' worth of range, round numbers of the loss itself.
fn y_ticks(scale: Scale, (y0, y1): (f64, f64)) -> Vec<(f64, String)> {
    let linear = |a: f64, b: f64| -> (Vec<f64>, f64) {
        let ticks = RangedCoordf64::from(a..b).key_points(8usize);
        let step = match ticks.as_slice() {
            [t0, t1, ..] => t1 - t0,
            _ => b - a,
        };
        (ticks, step)
    };
    if scale == Scale::Linear {
        let (ticks, step) = linear(y0, y1);
        return ticks.into_iter().map(|t| (t, label(t, step))).collect();
    }
    let (k0, k1) = (y0.floor() as i32, y1.ceil() as i32);
    let mantissas: &[f64] = if k1 - k0 <= 3 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0]
    };
    let ticks: Vec<f64> = (k0..=k1)
        .step_by(((k1 - k0) as usize / 8).max(1))
        .flat_map(|k| mantissas.iter().map(move |m| m.log10() + f64::from(k)))
        .filter(|t| (y0..=y1).contains(t))
        .collect();
    if ticks.len() >= 3 {
        let decade = |t: f64| 10f64.powf(t.floor());
        return ticks
            .into_iter()
            .map(|t| (t, label(10f64.powf(t), decade(t))))
            .collect();
    }
    let (values, step) = linear(10f64.powf(y0), 10f64.powf(y1));
    values
        .into_iter()
        .filter(|&v| v > 0.0)
        .map(|v| (v.log10(), label(v, step)))
        .collect()
}

/// The loss axis in drawn units with our own ticks: plotters' log axis
/// shows no tick over less than a decade, and its fixed-tick wrapper
/// refuses a label formatter for `f64`.
struct YAxis {
    range: RangedCoordf64,
    ticks: Vec<f64>,
}

impl Ranged for YAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.range.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Bold grid lines only: the light ones would be drawn here as well.
        match hint.weight().allow_light_points() {
            true => vec![],
            false => self.ticks.clone(),
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.range()
    }
}

/// `v` with just the digits that tell ticks `step` apart; exponent form
/// for very large or small numbers.
fn label(v: f64, step: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let step = [step, v.abs()]
        .into_iter()
        .find(|s| *s > 0.0 && s.is_finite())
        .unwrap_or(1.0);
    let mag = v.abs().max(step);
    if !(1e-3..1e5).contains(&mag) {
        let digits = (mag.log10().floor() - step.log10().floor()).clamp(0.0, 6.0) as usize;
        return format!("{v:.digits$e}");
    }
    let decimals = (-step.log10().floor()).clamp(0.0, 8.0) as usize;
    format!("{v:.decimals$}")
}

/// Draw the plot into an RGB buffer of [`SIZE`]; the error is plotters'.
fn draw(rgb: &mut [u8], plot: &LossPlot) -> std::result::Result<(), String> {
    let root = BitMapBackend::with_buffer(rgb, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    draw_title(&root, plot.title)?;

    let points = |series: &[(u64, f32)]| -> Vec<(u64, f64)> {
        (series.iter())
            .filter_map(|&(i, l)| plot_y(plot.scale, l).map(|y| (i, y)))
            .collect()
    };
    let (train, eval) = (points(plot.steps), points(plot.evals));
    let all: Vec<_> = train.iter().chain(&eval).copied().collect();
    let ((x0, x1), (y0, y1)) = ranges(plot.scale, &all);
    let ticks = y_ticks(plot.scale, (y0, y1));
    let y_axis = YAxis {
        range: (y0..y1).into(),
        ticks: ticks.iter().map(|t| t.0).collect(),
    };
    let tick_label = |y: &f64| {
        let nearest = ticks
            .iter()
            .min_by(|a, b| (a.0 - y).abs().total_cmp(&(b.0 - y).abs()));
        nearest.map(|t| t.1.clone()).unwrap_or_default()
    };

    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .margin_top(TOP_BAND)
        .margin_right(28)
        .x_label_area_size(48)
        .y_label_area_size(78)
        .build_cartesian_2d(x0..x1, y_axis)
        .map_err(err)?;
    let y_desc = match plot.scale {
        Scale::Linear => "loss",
        Scale::Log => "loss (log scale)",
    };
    chart
        .configure_mesh()
        .x_desc("iteration")
        .y_desc(y_desc)
        .x_labels(10)
        .x_label_formatter(&|x| x.to_string())
        .y_label_formatter(&tick_label)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 17))
        .bold_line_style(BLACK.mix(0.1))
        .light_line_style(WHITE)
        .draw()
        .map_err(err)?;

    if all.is_empty() {
        let (xs, ys) = chart.plotting_area().get_pixel_range();
        let centre = ((xs.start + xs.end) / 2, (ys.start + ys.end) / 2);
        let style = TextStyle::from((FONT, 18).into_font())
            .color(&RGBColor(120, 120, 120))
            .pos(Pos::new(HPos::Center, VPos::Center));
        root.draw(&Text::new("no loss to plot", centre, style))
            .map_err(err)?;
    }
    let switches: Vec<&Switch> = (plot.switches.iter())
        .filter(|s| (x0..=x1).contains(&s.iter))
        .collect();
    for s in &switches {
        let line = [(s.iter, y0), (s.iter, y1)];
        chart
            .draw_series(DashedLineSeries::new(line, 8, 5, SWITCH.stroke_width(2)))
            .map_err(err)?;
    }
    if let [only] = train[..] {
        // A line of one point draws nothing.
        chart
            .draw_series([Circle::new(only, 4, TRAIN.filled())])
            .map_err(err)?;
    }
    chart
        .draw_series(LineSeries::new(train, TRAIN.stroke_width(2)))
        .map_err(err)?;
    if !eval.is_empty() {
        chart
            .draw_series(LineSeries::new(eval.clone(), EVAL.stroke_width(1)))
            .map_err(err)?;
        chart
            .draw_series(eval.iter().map(|&p| Circle::new(p, 4, EVAL.filled())))
            .map_err(err)?;
    }
    draw_switch_labels(&chart, &switches, y1)?;
    draw_legend(&root, !plot.evals.is_empty())?;
    root.present().map_err(err)
}

/// Each switch's recipe at the top of its line, drawn after the curves on a
/// white box so that they cannot hide it: right of the line, left of it
/// near the right edge, and a row lower where it would overlap the label
/// before.
fn draw_switch_labels(
    chart: &ChartContext<BitMapBackend, Cartesian2d<RangedCoordu64, YAxis>>,
    switches: &[&Switch],
    y1: f64,
) -> std::result::Result<(), String> {
    let area = chart.plotting_area();
    let right_edge = area.get_pixel_range().0.end;
    let style = TextStyle::from((FONT, 14).into_font()).color(&SWITCH);
    let (mut row, mut last_end) = (0, i32::MIN);
    for s in switches {
        let (w, h) = area.estimate_text_size(&s.recipe, &style).map_err(err)?;
        let (w, h) = (w as i32 + 6, h as i32 + 6);
        let at = chart.backend_coord(&(s.iter, y1)).0;
        let left = if at + 3 + w > right_edge { -3 - w } else { 3 };
        row = if at + left < last_end { row + 1 } else { 0 };
        last_end = at + left + w;
        let top = 4 + row * (h + 2);
        let tag = EmptyElement::at((s.iter, y1))
            + Rectangle::new([(left, top), (left + w, top + h)], WHITE.mix(0.85).filled())
            + Text::new(s.recipe.clone(), (left + 3, top + 3), style.clone());
        area.draw(&tag).map_err(err)?;
    }
    Ok(())
}

/// The title centred in the top band, shrunk until it fits the width.
fn draw_title<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
) -> std::result::Result<(), String> {
    let mut size = 22.0;
    let style = loop {
        let style = TextStyle::from((FONT, size).into_font()).color(&BLACK);
        let (w, _) = root.estimate_text_size(title, &style).map_err(err)?;
        if w + 24 <= SIZE.0 || size <= 10.0 {
            break style;
        }
        size -= 1.0;
    };
    let centre = Pos::new(HPos::Center, VPos::Top);
    let text = Text::new(title, ((SIZE.0 / 2) as i32, 10), style.pos(centre));
    root.draw(&text).map_err(err)
}

/// The legend in the top band, right-aligned under the title, so that it
/// never covers the curves.
fn draw_legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    with_eval: bool,
) -> std::result::Result<(), String> {
    let style = TextStyle::from((FONT, 14).into_font()).color(&BLACK);
    let y = TOP_BAND as i32 - 16;
    let mut items = vec![("train loss", TRAIN, false)];
    if with_eval {
        items.push(("eval loss", EVAL, true));
    }
    let mut x = SIZE.0 as i32 - 28;
    for (name, colour, marker) in items.into_iter().rev() {
        let (w, _) = root.estimate_text_size(name, &style).map_err(err)?;
        x -= w as i32;
        let text = Text::new(name, (x, y), style.pos(Pos::new(HPos::Left, VPos::Center)));
        root.draw(&text).map_err(err)?;
        let line = PathElement::new([(x - 30, y), (x - 6, y)], colour.stroke_width(2));
        root.draw(&line).map_err(err)?;
        if marker {
            root.draw(&Circle::new((x - 18, y), 4, colour.filled()))
                .map_err(err)?;
        }
        x -= 56;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Scale::{Linear, Log};

    type Series<'a> = &'a [(u64, f32)];

    /// Write the plot, read it back, and check its size.
    fn png(
        title: &str,
        steps: Series,
        evals: Series,
        switches: &[Switch],
        scale: Scale,
    ) -> image::RgbImage {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("loss.png");
        let plot = LossPlot {
            title,
            steps,
            evals,
            switches,
            scale,
        };
        loss_curve(&path, &plot).unwrap();
        let img = image::open(&path).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), SIZE);
        img
    }

    fn curve() -> Vec<(u64, f32)> {
        (0..100)
            .map(|i| (i, 3.0 / (1.0 + i as f32 * 0.1)))
            .collect()
    }

    /// Pixels in rows `rows` that differ between `a` and `b`.
    fn differing(a: &image::RgbImage, b: &image::RgbImage, rows: std::ops::Range<u32>) -> usize {
        rows.flat_map(|y| (0..SIZE.0).map(move |x| (x, y)))
            .filter(|&(x, y)| a.get_pixel(x, y) != b.get_pixel(x, y))
            .count()
    }

    fn has_colour(img: &image::RgbImage, c: RGBColor) -> bool {
        img.pixels().any(|p| p.0 == [c.0, c.1, c.2])
    }

    #[test]
    fn png_decodes_at_its_size() {
        png("flux-tiny", &curve(), &[], &[], Linear);
    }

    #[test]
    fn title_text_is_drawn() {
        let titled = png("flux-tiny: mxfp4 @ 0, fp8 @ 40", &curve(), &[], &[], Linear);
        let untitled = png("", &curve(), &[], &[], Linear);
        assert!(
            differing(&titled, &untitled, 0..36) > 200,
            "no title pixels"
        );
        let dark = (0..36)
            .flat_map(|y| (0..SIZE.0).map(move |x| (x, y)))
            .filter(|&(x, y)| titled.get_pixel(x, y).0.iter().all(|&c| c < 100))
            .count();
        assert!(dark > 100, "the title band has {dark} dark pixels");
    }

    #[test]
    fn eval_colour_only_with_evals() {
        assert!(!has_colour(&png("t", &curve(), &[], &[], Linear), EVAL));
        let evals = [(49, 1.2), (99, 0.9)];
        assert!(has_colour(&png("t", &curve(), &evals, &[], Linear), EVAL));
    }

    #[test]
    fn switch_is_marked_and_labelled() {
        let switches = [Switch {
            iter: 50,
            recipe: "fp8".into(),
        }];
        let without = png("t", &curve(), &[], &[], Linear);
        let with = png("t", &curve(), &[], &switches, Linear);
        // The label sits just below the top of the chart, right of the line.
        let band = TOP_BAND..TOP_BAND + 30;
        assert!(differing(&with, &without, band) > 100, "no switch label");
        assert!(has_colour(&with, SWITCH) && !has_colour(&without, SWITCH));
    }

    #[test]
    fn log_scale_skips_what_it_cannot_show() {
        let (nan, inf) = (f32::NAN, f32::INFINITY);
        let steps = [(0, 0.0), (1, -1.0), (2, nan), (3, 2.0), (4, 0.5), (5, inf)];
        png("log", &steps, &[(3, 0.0), (5, 0.7)], &[], Log);
        png(
            "nothing",
            &[(0, 0.0), (1, -2.0), (2, nan)],
            &[(1, 0.0)],
            &[],
            Log,
        );
    }

    #[test]
    fn empty_input_writes_a_frame() {
        for scale in [Linear, Log] {
            png("empty", &[], &[], &[], scale);
        }
    }

    #[test]
    fn edge_values_do_not_panic() {
        let cases: [Series; 6] = [
            &[(7, 1.0)],
            &[(3, 1.0), (3, 2.0)],
            &[(0, f32::MAX), (1, 1.0)],
            &[(0, 1e-40), (1, 1e-38)],
            &[(0, 0.0), (1, 0.0)],
            &[(0, -5.0), (1, 1e30), (u64::MAX, 2.0)],
        ];
        for steps in cases {
            let switches = [Switch {
                iter: steps[0].0,
                recipe: "mxfp4".into(),
            }];
            for scale in [Linear, Log] {
                png("edge", steps, steps, &switches, scale);
            }
        }
    }

    #[test]
    fn labels_tell_ticks_apart() {
        assert_eq!(label(2.5, 0.5), "2.5");
        assert_eq!(label(1200.0, 200.0), "1200");
        assert_eq!(label(0.0002, 0.0001), "2e-4");
        assert_eq!(label(0.0, 1.0), "0");
        let log = y_ticks(Log, (-1.1, 0.6));
        let names: Vec<&str> = log.iter().map(|t| t.1.as_str()).collect();
        assert_eq!(names, ["0.1", "0.2", "0.5", "1", "2"]);
        assert!(
            y_ticks(Log, (0.1, 0.2)).len() >= 2,
            "a narrow log axis has no ticks"
        );
    }

    #[test]
    fn scale_parses_from_the_command_line() {
        use clap::ValueEnum as _;
        assert_eq!(Scale::from_str("log", true), Ok(Log));
        assert_eq!(Scale::from_str("linear", true), Ok(Linear));
    }

    /// The plot must not bring back a system font library (see Cargo.toml).
    #[test]
    fn no_system_font_library_in_the_lock_file() {
        let lock = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock");
        let lock = std::fs::read_to_string(lock).unwrap();
        let banned = ["fontconfig", "freetype", "font-kit", "pkg-config"];
        let names = lock.lines().filter_map(|l| l.strip_prefix("name = \""));
        let found: Vec<&str> = names
            .map(|n| n.trim_end_matches('"'))
            .filter(|n| banned.iter().any(|b| n.contains(b)))
            .collect();
        assert!(found.is_empty(), "Cargo.lock has {found:?}");
    }
}
