//! The report's SVG plots, drawn with plotters' SVG backend. Every plot's `<svg>` carries an `id`, the class
//! `armoury-plot` and a `data-series` attribute (a JSON list of the series it draws), so a browser test or a
//! reader's script can find each one.

use std::f64::consts::TAU;

use plotters::coord::types::{RangedCoordf64, RangedCoordi32};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{html_escape, AttackSummary, ClassFlips, EpsCurve, Interval, NormDistribution, Radar};
use crate::{Error, Result};

/// One rendered plot.
pub(super) struct Plot {
    /// The `id` of its `<svg>`.
    pub id: String,
    /// The SVG document.
    pub svg: String,
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];
pub(super) const FONT: &str = "sans-serif";
const GREY: RGBColor = RGBColor(190, 190, 190);

/// Draws an element on a drawing area, turning plotters' error into ours.
macro_rules! draw {
    ($root:expr, $e:expr) => {
        $root.draw(&$e).map_err(plot_error)?
    };
}

pub(super) fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

pub(super) fn plot_error(e: impl std::fmt::Debug) -> Error {
    Error::invalid("report", format!("drawing a plot failed: {e:?}"))
}

/// Draws with `draw` on a fresh `w × h` SVG canvas and tags the `<svg>` element with its id and series.
pub(super) fn render(
    id: &str,
    series: Vec<String>,
    (w, h): (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend, Shift>) -> Result<()>,
) -> Result<Plot> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        draw(&root)?;
        root.present().map_err(plot_error)?;
    }
    let names = serde_json::to_string(&series).expect("a list of strings serialises");
    let tag = format!(r#"<svg id="{}" class="armoury-plot" data-series="{}" "#, html_escape(id), html_escape(&names));
    let svg = buf.replacen("<svg ", &tag, 1);
    Ok(Plot { id: id.to_string(), svg })
}

fn text_style(size: u32, h: HPos, v: VPos) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font()).color(&BLACK).pos(Pos::new(h, v))
}

/// MindArmour's radar chart: one polygon per series, the first axis at the top, clockwise, rings at 0.2 … 1;
/// `id` is the `<svg>`'s id, `title` its heading.
pub(super) fn radar(r: &Radar, id: &str, title: &str) -> Result<Plot> {
    let names: Vec<String> = r.series.iter().map(|s| s.name.clone()).collect();
    render(id, names, (720, 500), |root| {
        let (cx, cy, rad) = (260.0, 265.0, 180.0);
        let k = r.axes.len();
        let at = |i: usize, v: f64| -> (i32, i32) {
            let a = i as f64 / k as f64 * TAU;
            ((cx + rad * v * a.sin()).round() as i32, (cy - rad * v * a.cos()).round() as i32)
        };
        draw!(root, Text::new(title.to_string(), (cx as i32, 18), text_style(18, HPos::Center, VPos::Center),));
        for ring in 1..=5 {
            let v = ring as f64 / 5.0;
            let mut pts: Vec<(i32, i32)> = (0..k).map(|i| at(i, v)).collect();
            pts.push(pts[0]);
            draw!(root, PathElement::new(pts, GREY.stroke_width(1)));
            let (x, y) = at(0, v);
            draw!(root, Text::new(format!("{v:.1}"), (x + 4, y), text_style(11, HPos::Left, VPos::Center)));
        }
        for (i, axis) in r.axes.iter().enumerate() {
            draw!(root, PathElement::new(vec![at(i, 0.0), at(i, 1.0)], GREY.stroke_width(1)));
            let a = i as f64 / k as f64 * TAU;
            let h = if a.sin() > 0.2 {
                HPos::Left
            } else if a.sin() < -0.2 {
                HPos::Right
            } else {
                HPos::Center
            };
            draw!(root, Text::new(axis.clone(), at(i, 1.1), text_style(14, h, VPos::Center)));
        }
        for (j, s) in r.series.iter().enumerate() {
            let c = colour(j);
            let mut pts: Vec<(i32, i32)> = s.values.iter().enumerate().map(|(i, v)| at(i, *v)).collect();
            draw!(root, Polygon::new(pts.clone(), c.mix(0.15).filled()));
            pts.push(pts[0]);
            for p in &pts {
                draw!(root, Circle::new(*p, 3, c.filled()));
            }
            draw!(root, PathElement::new(pts, c.stroke_width(2)));
        }
        legend(root, (500, 60), &r.series.iter().map(|s| s.name.as_str()).collect::<Vec<_>>())
    })
}

/// A legend drawn by hand: a coloured square and the name per series, from `(x, y)` down.
fn legend(root: &DrawingArea<SVGBackend, Shift>, (x, y): (i32, i32), names: &[&str]) -> Result<()> {
    for (j, name) in names.iter().enumerate() {
        let y = y + 24 * j as i32;
        root.draw(&Rectangle::new([(x, y - 7), (x + 14, y + 7)], colour(j).filled())).map_err(plot_error)?;
        root.draw(&Text::new(name.to_string(), (x + 22, y), text_style(14, HPos::Left, VPos::Center)))
            .map_err(plot_error)?;
    }
    Ok(())
}

/// A range with room around it (a single value gets ±50% or ±1).
pub(super) fn padded(lo: f64, hi: f64) -> (f64, f64) {
    if hi > lo {
        (lo, hi)
    } else if lo == 0.0 {
        (0.0, 1.0)
    } else {
        (lo - 0.5 * lo.abs(), hi + 0.5 * hi.abs())
    }
}

/// Robust accuracy against ε for the curves of one norm, each with its confidence band; a curve whose grid
/// starts above 0 starts at ε = 0 with the clean accuracy (no budget, no attack). A single-ε evaluation has no
/// curve to draw: its figures are points with their intervals (and the clean accuracy at ε = 0), never lines.
pub(super) fn eps_curves(norm: &str, curves: &[&EpsCurve], clean: Interval) -> Result<Plot> {
    let names: Vec<String> = curves.iter().map(|c| c.attack.clone()).collect();
    let id = format!("plot-eps-{}", slug(norm));
    let single = curves.iter().all(|c| c.eps.len() == 1);
    render(&id, names, (720, 440), |root| {
        let hi = curves.iter().flat_map(|c| c.eps.iter().copied()).fold(0.0f64, f64::max);
        let (x0, x1) = if single { (-0.1 * hi, 1.25 * hi) } else { padded(0.0, hi) };
        let caption = if single {
            format!("Accuracy at ε = {hi} ({norm}) and clean, 95% intervals")
        } else {
            format!("Robust accuracy vs ε ({norm}), 95% bands")
        };
        let mut chart = xy_chart(root, &caption, (x0, x1), &format!("ε ({norm})"), "accuracy")?;
        if single {
            let black = RGBColor(0, 0, 0);
            draw_point_interval(&mut chart, 0.0, clean, black)?
                .label("clean (ε = 0)")
                .legend(move |(x, y)| Circle::new((x + 10, y), 4, black.filled()));
        }
        for (j, c) in curves.iter().enumerate() {
            let col = colour(j);
            if single {
                draw_point_interval(&mut chart, c.eps[0], c.accuracy[0], col)?
                    .label(c.attack.clone())
                    .legend(move |(x, y)| Circle::new((x + 10, y), 4, col.filled()));
                continue;
            }
            let mut points: Vec<(f64, Interval)> = c.eps.iter().copied().zip(c.accuracy.iter().copied()).collect();
            if c.eps.first().is_some_and(|&e| e > 0.0) {
                points.insert(0, (0.0, clean));
            }
            let mut band: Vec<(f64, f64)> = points.iter().map(|(e, a)| (*e, a.lo)).collect();
            band.extend(points.iter().rev().map(|(e, a)| (*e, a.hi)));
            chart.draw_series(std::iter::once(Polygon::new(band, col.mix(0.2).filled()))).map_err(plot_error)?;
            let line: Vec<(f64, f64)> = points.iter().map(|(e, a)| (*e, a.value)).collect();
            chart
                .draw_series(LineSeries::new(line.clone(), col.stroke_width(2)))
                .map_err(plot_error)?
                .label(c.attack.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2)));
            chart.draw_series(line.into_iter().map(|p| Circle::new(p, 3, col.filled()))).map_err(plot_error)?;
        }
        chart.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).draw().map_err(plot_error)
    })
}

/// A point at (`x`, `a.value`) with a vertical bar from `a.lo` to `a.hi` and caps; returns the point's series
/// for its legend entry.
fn draw_point_interval<'c, 'a, 'b>(
    chart: &'c mut XyChart<'a, 'b>,
    x: f64,
    a: Interval,
    col: RGBColor,
) -> Result<&'c mut plotters::chart::SeriesAnno<'a, SVGBackend<'b>>> {
    let (x0, x1) = (chart.x_range().start, chart.x_range().end);
    let cap = 0.012 * (x1 - x0);
    let bars =
        [vec![(x, a.lo), (x, a.hi)], vec![(x - cap, a.lo), (x + cap, a.lo)], vec![(x - cap, a.hi), (x + cap, a.hi)]];
    chart.draw_series(bars.into_iter().map(|p| PathElement::new(p, col.stroke_width(2)))).map_err(plot_error)?;
    chart.draw_series(std::iter::once(Circle::new((x, a.value), 5, col.filled()))).map_err(plot_error)
}

pub(super) type XyChart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A chart with x in `x0..x1` and y in [0, 1], its caption, grid and axis descriptions drawn.
fn xy_chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    caption: &str,
    x: (f64, f64),
    x_desc: &str,
    y_desc: &str,
) -> Result<XyChart<'a, 'b>> {
    xy_chart_within(root, caption, (x, (0.0, 1.0)), x_desc, y_desc)
}

/// A chart with x in `x0..x1` and y in `y0..y1`, its caption, grid and axis descriptions drawn.
pub(super) fn xy_chart_within<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    caption: &str,
    ((x0, x1), (y0, y1)): ((f64, f64), (f64, f64)),
    x_desc: &str,
    y_desc: &str,
) -> Result<XyChart<'a, 'b>> {
    let mut chart = ChartBuilder::on(root)
        .caption(caption, (FONT, 18))
        .margin(14)
        .x_label_area_size(42)
        .y_label_area_size(52)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(plot_error)?;
    chart.configure_mesh().label_style((FONT, 14)).x_desc(x_desc).y_desc(y_desc).draw().map_err(plot_error)?;
    Ok(chart)
}

/// The empirical CDF of the minimal perturbation norms of one norm: the fraction of *all* samples whose minimal
/// adversarial perturbation is at most t (samples where none was found never count, so a curve can stay
/// below 1).
pub(super) fn norm_cdf(norm: &str, dists: &[&NormDistribution]) -> Result<Plot> {
    let names: Vec<String> = dists.iter().map(|d| d.attack.clone()).collect();
    let id = format!("plot-norms-{}", slug(norm));
    render(&id, names, (720, 440), |root| {
        let hi = dists.iter().flat_map(|d| d.norms.iter().flatten().copied()).fold(0.0f64, f64::max);
        let (x0, x1) = padded(0.0, hi * 1.05);
        let caption = format!("Minimal perturbation norms ({norm}): CDF");
        let x_desc = format!("perturbation norm ({norm})");
        let mut chart = xy_chart(root, &caption, (x0, x1), &x_desc, "fraction of samples broken")?;
        for (j, d) in dists.iter().enumerate() {
            let col = colour(j);
            let steps = cdf_steps(&d.norms, x1);
            let found = d.norms.iter().flatten().count();
            line(&mut chart, steps, col, format!("{} ({found}/{} found)", d.attack, d.norms.len()))?;
        }
        legend_lower_right(&mut chart)
    })
}

/// A line series in colour `col`, with its legend entry `label`.
pub(super) fn line(chart: &mut XyChart<'_, '_>, points: Vec<(f64, f64)>, col: RGBColor, label: String) -> Result<()> {
    chart
        .draw_series(LineSeries::new(points, col.stroke_width(2)))
        .map_err(plot_error)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2)));
    Ok(())
}

/// The series' legend in the lower right corner.
pub(super) fn legend_lower_right<'a, 'b: 'a>(chart: &mut XyChart<'a, 'b>) -> Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)
}

/// The corners of the empirical CDF's staircase, from (0, 0) to (`end`, found / N).
fn cdf_steps(norms: &[Option<f64>], end: f64) -> Vec<(f64, f64)> {
    let n = norms.len().max(1) as f64;
    let mut found: Vec<f64> = norms.iter().flatten().copied().collect();
    found.sort_by(f64::total_cmp);
    let mut pts = vec![(0.0, 0.0)];
    for (k, v) in found.iter().enumerate() {
        pts.push((*v, k as f64 / n));
        pts.push((*v, (k + 1) as f64 / n));
    }
    pts.push((end, found.len() as f64 / n));
    pts
}

/// The class-flip matrix as a heat map: rows are true classes, columns adversarial predictions, white (0) to
/// red (the largest count), counts written in the cells when they fit.
pub(super) fn class_flips(f: &ClassFlips) -> Result<Plot> {
    let k = f.classes.len();
    let cell = (520 / k.max(1)).clamp(6, 44) as i32;
    let (left, top) = (120, 130);
    let side = cell * k as i32;
    let size = ((left + side + 30) as u32, (top + side + 60) as u32);
    render("plot-class-flips", vec!["class flips".to_string()], size, |root| {
        let max = f.counts.iter().flatten().copied().max().unwrap_or(0).max(1) as f64;
        draw!(
            root,
            Text::new(
                "Class flips: true class (rows) → adversarial prediction (columns)",
                (10, 18),
                text_style(16, HPos::Left, VPos::Center),
            )
        );
        for (i, row) in f.counts.iter().enumerate() {
            for (j, &count) in row.iter().enumerate() {
                let (x, y) = (left + cell * j as i32, top + cell * i as i32);
                let t = count as f64 / max;
                let shade = |full: u8| (255.0 - t * (255.0 - full as f64)).round() as u8;
                let fill = RGBColor(shade(200), shade(30), shade(30));
                draw!(root, Rectangle::new([(x, y), (x + cell, y + cell)], fill.filled()));
                draw!(root, Rectangle::new([(x, y), (x + cell, y + cell)], GREY.stroke_width(1)));
                if count > 0 && cell >= 18 {
                    let ink = if t > 0.6 { WHITE } else { BLACK };
                    let style = text_style(11, HPos::Center, VPos::Center).color(&ink);
                    draw!(root, Text::new(count.to_string(), (x + cell / 2, y + cell / 2), style));
                }
            }
        }
        let axis = text_style(14, HPos::Center, VPos::Center);
        draw!(root, Text::new("adversarial prediction", (left + side / 2, 40), axis.clone()));
        let rotated = axis.transform(FontTransform::Rotate270);
        draw!(root, Text::new("true class", (14, top + side / 2), rotated));
        let label = |s: &str| s.chars().take(14).collect::<String>();
        for (i, name) in f.classes.iter().enumerate() {
            let c = cell * i as i32 + cell / 2;
            draw!(root, Text::new(label(name), (left - 6, top + c), text_style(12, HPos::Right, VPos::Center)));
            let style = text_style(12, HPos::Left, VPos::Center).transform(FontTransform::Rotate270);
            draw!(root, Text::new(label(name), (left + c, top - 6), style));
        }
        Ok(())
    })
}

/// Clean accuracy and the robust accuracy after each attack of the cascade, as bars with their intervals.
pub(super) fn per_attack(clean: Interval, attacks: &[AttackSummary]) -> Result<Plot> {
    let mut names = vec!["clean".to_string()];
    names.extend(attacks.iter().map(|a| a.attack.clone()));
    let values: Vec<Interval> = std::iter::once(clean).chain(attacks.iter().map(|a| a.robust_accuracy_after)).collect();
    // A segmented range 0..m has m + 1 segments.
    let n = names.len() as i32;
    render("plot-per-attack", names.clone(), (720, 440), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption("Accuracy after each attack of the cascade (cumulative), 95% intervals", (FONT, 18))
            .margin(14)
            .x_label_area_size(56)
            .y_label_area_size(52)
            .build_cartesian_2d((0..n - 1).into_segmented(), 0.0..1.0)
            .map_err(plot_error)?;
        // The attack's registry name alone under its bar (the table and the legend-free SVG keep the settings).
        let label = |v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(i) => {
                names.get(*i as usize).map(|n| n.split('(').next().unwrap_or(n).to_string()).unwrap_or_default()
            }
            _ => String::new(),
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .label_style((FONT, 14))
            .x_labels(names.len() + 1)
            .x_label_formatter(&label)
            .x_desc("clean, then after each attack of the cascade")
            .y_desc("accuracy")
            .draw()
            .map_err(plot_error)?;
        draw_bars(&mut chart, &values)
    })
}

type BarChart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::ranged1d::SegmentedCoord<RangedCoordi32>, plotters::coord::types::RangedCoordf64>,
>;

fn draw_bars(chart: &mut BarChart, values: &[Interval]) -> Result<()> {
    for (i, v) in values.iter().enumerate() {
        let (i, col) = (i as i32, colour(i));
        let mut bar =
            Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), v.value)], col.filled());
        bar.set_margin(0, 0, 12, 12);
        chart.draw_series(std::iter::once(bar)).map_err(plot_error)?;
        let whisker = PathElement::new(
            vec![(SegmentValue::CenterOf(i), v.lo), (SegmentValue::CenterOf(i), v.hi)],
            BLACK.stroke_width(2),
        );
        chart.draw_series(std::iter::once(whisker)).map_err(plot_error)?;
        let text = Text::new(
            format!("{:.3}", v.value),
            (SegmentValue::CenterOf(i), (v.hi + 0.04).min(0.97)),
            text_style(12, HPos::Center, VPos::Center),
        );
        chart.draw_series(std::iter::once(text)).map_err(plot_error)?;
    }
    Ok(())
}

/// A name usable in an `id`: lower-case ASCII letters and digits, anything else as `-`.
pub(super) fn slug(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_steps_count_every_sample() {
        let s = cdf_steps(&[Some(0.3), None, Some(0.1), Some(0.2)], 0.5);
        assert_eq!(
            s,
            vec![(0.0, 0.0), (0.1, 0.0), (0.1, 0.25), (0.2, 0.25), (0.2, 0.5), (0.3, 0.5), (0.3, 0.75), (0.5, 0.75)]
        );
    }

    #[test]
    fn slugs_are_id_safe() {
        assert_eq!(slug("L∞ eps"), "l--eps");
        assert_eq!(slug("linf"), "linf");
    }
}
