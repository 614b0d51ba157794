//! `--plot`: the results as an SVG or PNG chart (plotters).

use std::path::{Path, PathBuf};

use anyhow::bail;

use super::report::Record;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PlotKind {
    Svg,
    Png,
}

/// Checks `--plot` before any measuring: a known extension, an existing folder, a font for the text.
pub(super) fn check_plot_path(path: &Path) -> anyhow::Result<(PathBuf, PlotKind)> {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    let kind = match ext.as_deref() {
        Some("svg") => PlotKind::Svg,
        Some("png") => PlotKind::Png,
        _ => bail!("--plot {}: the file name must end in .svg or .png", path.display()),
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.is_dir()
    {
        bail!("--plot {}: the folder {} does not exist", path.display(), dir.display());
    }
    register_font()?;
    Ok((path.to_path_buf(), kind))
}

/// TrueType fonts tried for the chart's text, in order (`INFER_PLOT_FONT` first).
const FONT_CANDIDATES: [&str; 10] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Finds a TrueType font and registers it as the chart's "sans-serif" (once per process).
fn register_font() -> anyhow::Result<()> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(p) = std::env::var_os("INFER_PLOT_FONT") {
            candidates.push(PathBuf::from(p));
        }
        candidates.extend(FONT_CANDIDATES.iter().map(PathBuf::from));
        for dir in ["/usr/share/fonts", "/usr/local/share/fonts"] {
            find_ttf(Path::new(dir), 3, &mut candidates);
        }
        for path in &candidates {
            let Ok(bytes) = std::fs::read(path) else { continue };
            // The font must outlive every chart: leak it once.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, bytes).is_ok() {
                return Ok(());
            }
        }
        Err("--plot needs a TrueType font for the chart's text and found none (install fonts-dejavu-core, or set \
             INFER_PLOT_FONT=/path/to/font.ttf)"
            .to_string())
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// Adds the `.ttf` files under `dir` (to `depth` levels) to `out`.
fn find_ttf(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if depth > 0 {
                find_ttf(&p, depth - 1, out);
            }
        } else if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")) {
            out.push(p);
        }
    }
}

pub(super) fn draw_plot(path: &Path, kind: PlotKind, records: &[Record]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let has_curve = records.iter().any(|r| r.curve.is_some());
    let has_plain = records.iter().any(|r| r.curve.is_none());
    let panels = 2 * usize::from(has_curve) + usize::from(has_plain);
    let size = (560 * panels as u32, 460);
    match kind {
        PlotKind::Svg => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            draw_panels(&root, records, has_curve, has_plain, panels)?;
            root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        PlotKind::Png => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            draw_panels(&root, records, has_curve, has_plain, panels)?;
            root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
        }
    }
    Ok(())
}

fn draw_panels<DB: plotters::prelude::DrawingBackend>(
    root: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    records: &[Record],
    has_curve: bool,
    has_plain: bool,
    panels: usize,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e}");
    root.fill(&WHITE).map_err(err)?;
    let areas = root.split_evenly((1, panels));
    let mut next = 0;
    if has_curve {
        // One series per model, threads, settings and lengths.
        // Per series: its label and (B, S_TG, speed-up, S_TG from CPU time or NaN) points.
        type Series = (String, Vec<(f64, f64, f64, f64)>);
        let mut series: Vec<Series> = Vec::new();
        for r in records {
            let Some(c) = &r.curve else { continue };
            let label = format!("{} t{} {} pp{}/tg{}", r.model_type, r.n_threads, r.precision, r.n_prompt, r.n_gen);
            let point = (r.batch as f64, c.s_tg, c.speedup.unwrap_or(f64::NAN), r.avg_ts_cpu.unwrap_or(f64::NAN));
            match series.iter_mut().find(|(l, _)| *l == label) {
                Some((_, pts)) => pts.push(point),
                None => series.push((label, vec![point])),
            }
        }
        let max_b = series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)).fold(1.0, f64::max);
        let max_tg = series
            .iter()
            .flat_map(|(_, p)| p.iter().flat_map(|q| [q.1, q.3]).filter(|v| v.is_finite()))
            .fold(1.0, f64::max);
        let max_su = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.2).filter(|v| v.is_finite()))
            .fold(max_b.min(4.0), f64::max);
        let x_range = (0.8f64..max_b * 1.25).log_scale();

        let mut chart = ChartBuilder::on(&areas[next])
            .caption("Batched decode: aggregate tokens/s", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x_range.clone(), 0f64..max_tg * 1.15)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("B (parallel sequences)")
            .y_desc("S_TG (tokens/s); dashed: from CPU time")
            .light_line_style(TRANSPARENT)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .map_err(err)?;
        for (i, (label, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(pts.iter().map(|p| (p.0, p.1)), color.stroke_width(2)))
                .map_err(err)?
                .label(label.as_str())
                .legend(legend_mark(color.stroke_width(2)));
            chart.draw_series(pts.iter().map(|p| Circle::new((p.0, p.1), 4, color.filled()))).map_err(err)?;
            let cpu: Vec<(f64, f64)> = pts.iter().filter(|p| p.3.is_finite()).map(|p| (p.0, p.3)).collect();
            if cpu.len() > 1 {
                chart.draw_series(DashedLineSeries::new(cpu, 6, 4, color.stroke_width(1))).map_err(err)?;
            }
        }
        draw_legend(&mut chart).map_err(err)?;
        next += 1;

        let mut chart = ChartBuilder::on(&areas[next])
            .caption("Speed-up over B = 1", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(x_range, 0f64..max_su * 1.15)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("B (parallel sequences)")
            .y_desc("S_TG(B) / S_TG(1)")
            .light_line_style(TRANSPARENT)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .map_err(err)?;
        // Perfect scaling, for reference, drawn up to where it leaves the chart.
        let ideal_top = max_b.min(max_su * 1.15);
        chart
            .draw_series(DashedLineSeries::new(
                [(1.0, 1.0), (ideal_top, ideal_top)],
                6,
                4,
                BLACK.mix(0.4).stroke_width(1),
            ))
            .map_err(err)?
            .label("linear")
            .legend(legend_mark(BLACK.mix(0.4).into()));
        for (i, (label, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let pts: Vec<(f64, f64)> = pts.iter().filter(|p| p.2.is_finite()).map(|p| (p.0, p.2)).collect();
            if pts.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(err)?
                .label(label.as_str())
                .legend(legend_mark(color.stroke_width(2)));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(err)?;
        }
        draw_legend(&mut chart).map_err(err)?;
        next += 1;
    }
    if has_plain {
        let plain: Vec<&Record> = records.iter().filter(|r| r.curve.is_none()).collect();
        let arch_of = |r: &Record| r.model_type.split(' ').next().unwrap_or("").to_string();
        let labels: Vec<String> = plain.iter().map(|r| format!("{} {} t{}", arch_of(r), r.test, r.n_threads)).collect();
        let max_ts = plain.iter().map(|r| r.avg_ts + r.stddev_ts).fold(1.0, f64::max);
        let n = plain.len();
        let mut chart = ChartBuilder::on(&areas[next])
            .caption("Prefill (pp) and generation (tg), tokens/s", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((0..n - 1).into_segmented(), 0f64..max_ts * 1.15)
            .map_err(err)?;
        let label_of = |x: &SegmentValue<usize>| match x {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&label_of)
            .x_label_style(("sans-serif", 12))
            .y_desc("tokens/s (mean, ± sd)")
            .draw()
            .map_err(err)?;
        for (i, r) in plain.iter().enumerate() {
            let color = if r.n_gen > 0 { Palette99::pick(1) } else { Palette99::pick(0) };
            let mut bar =
                Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), r.avg_ts)], color.filled());
            bar.set_margin(0, 0, 12, 12);
            chart.draw_series([bar]).map_err(err)?;
            let mid = SegmentValue::CenterOf(i);
            if r.stddev_ts > 0.0 {
                let (lo, hi) = ((r.avg_ts - r.stddev_ts).max(0.0), r.avg_ts + r.stddev_ts);
                chart
                    .draw_series([PathElement::new(vec![(mid.clone(), lo), (mid.clone(), hi)], BLACK.stroke_width(1))])
                    .map_err(err)?;
            }
            chart
                .draw_series([Text::new(
                    format!("{:.1}", r.avg_ts),
                    (mid, r.avg_ts + r.stddev_ts + max_ts * 0.04),
                    ("sans-serif", 13).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom)),
                )])
                .map_err(err)?;
        }
    }
    Ok(())
}

/// The legend box both curve charts share: upper left, over a pale background.
fn draw_legend<'a, DB: plotters::prelude::DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut plotters::prelude::ChartContext<'a, DB, CT>,
) -> Result<(), plotters::prelude::DrawingAreaErrorKind<DB::ErrorType>> {
    use plotters::prelude::*;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
}

/// A legend entry's mark: a short line in the series' style.
fn legend_mark(
    style: plotters::style::ShapeStyle,
) -> impl Fn((i32, i32)) -> plotters::element::PathElement<(i32, i32)> {
    move |(x, y)| plotters::element::PathElement::new(vec![(x, y), (x + 18, y)], style)
}
