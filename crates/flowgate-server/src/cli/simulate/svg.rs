//! The comparison as an SVG chart (`--svg FILE`): per case a heading, then per limiter a
//! panel of stacked bars — requests admitted (green) and denied (red) per bucket of time —
//! all panels of a case on the same axes, so their heights compare.
//!
//! Drawn with plotters' SVG backend alone (no font, bitmap or image dependencies: the SVG
//! names the font and the viewer renders the text). The output depends only on the report:
//! the same input gives the same bytes.

use flowgate::simulate::format_duration;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::Outcome;
use super::table::describe;

/// The chart's width, px.
const WIDTH: u32 = 960;
/// Height of a case's heading, px.
const HEADING: u32 = 52;
/// Height of one limiter's panel, px.
const PANEL: u32 = 170;
/// Admitted requests.
const ADMITTED: RGBColor = RGBColor(0x2e, 0x8b, 0x57);
/// Denied requests.
const DENIED: RGBColor = RGBColor(0xd6, 0x45, 0x45);

/// Draws every case into one SVG document.
pub(super) fn render(outcomes: &[Outcome]) -> Result<String, String> {
    let height: u32 = outcomes
        .iter()
        .map(|o| HEADING + PANEL * o.report.runs.len() as u32)
        .sum();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height.max(1))).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut rest = root;
        for outcome in outcomes {
            let case_height = HEADING + PANEL * outcome.report.runs.len() as u32;
            let (area, below) = rest.split_vertically(case_height);
            draw_case(&area, outcome).map_err(|e| e.to_string())?;
            rest = below;
        }
        rest.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type DrawResult<T> = Result<T, DrawingAreaErrorKind<std::io::Error>>;

fn draw_case(area: &Area<'_>, outcome: &Outcome) -> DrawResult<()> {
    let report = &outcome.report;
    let (heading, mut panels) = area.split_vertically(HEADING);
    heading.draw(&Text::new(
        outcome.case.title.clone(),
        (12, 8),
        ("sans-serif", 24).into_font().style(FontStyle::Bold),
    ))?;
    heading.draw(&Text::new(
        describe(report, outcome.retry),
        (12, 32),
        ("sans-serif", 16)
            .into_font()
            .color(&RGBColor(0x55, 0x55, 0x55)),
    ))?;
    let bucket_s = report.bucket.as_secs_f64();
    let buckets = report.runs.first().map_or(0, |r| r.series.admitted.len());
    let span_s = (buckets.max(1) as f64) * bucket_s;
    // The same height for every panel of the case, so that they compare at a glance.
    let top = report
        .runs
        .iter()
        .flat_map(|r| {
            r.series
                .admitted
                .iter()
                .zip(&r.series.denied)
                .map(|(a, d)| a + d)
        })
        .max()
        .unwrap_or(0)
        .max(1) as f64
        * 1.1;
    let window = format_duration(report.quota.period());
    for run in &report.runs {
        let (panel, below) = panels.split_vertically(PANEL);
        panels = below;
        let s = &run.summary;
        let mut caption = format!(
            "{}: admitted {}, denied {}, at most {} in any {window}",
            run.subject, s.admitted, s.denied, s.max_in_window
        );
        if let Some(wait) = s.wait {
            caption.push_str(&format!(", p99 wait {}", super::table::seconds(wait.p99)));
        }
        let mut chart = ChartBuilder::on(&panel)
            .caption(caption, ("sans-serif", 17))
            .margin_left(12)
            .margin_right(16)
            .margin_top(4)
            .x_label_area_size(40)
            .y_label_area_size(52)
            .build_cartesian_2d(0f64..span_s, 0f64..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .max_light_lines(0)
            .bold_line_style(RGBColor(0xe4, 0xe4, 0xe4))
            .y_labels(4)
            .x_labels(12)
            .x_desc("seconds from the start")
            .y_desc(format!("per {}", format_duration(report.bucket)))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 14))
            .draw()?;
        let bar = |i: usize, from: u64, to: u64, color: RGBColor| {
            let x0 = i as f64 * bucket_s;
            Rectangle::new(
                [(x0, from as f64), (x0 + bucket_s * 0.9, to as f64)],
                color.filled(),
            )
        };
        let series = &run.series;
        chart
            .draw_series(
                series
                    .admitted
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| **a > 0)
                    .map(|(i, &a)| bar(i, 0, a, ADMITTED)),
            )?
            .label("admitted")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], ADMITTED.filled()));
        chart
            .draw_series(
                series
                    .admitted
                    .iter()
                    .zip(&series.denied)
                    .enumerate()
                    .filter(|(_, (_, d))| **d > 0)
                    .map(|(i, (&a, &d))| bar(i, a, a + d, DENIED)),
            )?
            .label("denied")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], DENIED.filled()));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(0xaa, 0xaa, 0xaa))
            .draw()?;
    }
    Ok(())
}
