//! Learning curves of a run as a PNG: rollout reward at every step and held-out accuracy at each evaluation, read
//! from `<run>/monitor/metrics.jsonl`.
//!
//! A fresh machine (CI, a container) has no fonts and no plotting stack, so everything is drawn here: an RGB canvas
//! with anti-aliased lines and discs, a 5×7 bitmap font for printable ASCII, and the pure-Rust `png` crate to
//! encode. The figure is fixed on purpose — one shared y axis (rewards and accuracies are both "higher is better"
//! and, for the shipped tasks, both in [0, 1]), steps on the x axis, the legend below the plot so it never hides
//! data — because its job is to show at a glance whether a model learned, not to be a plotting library.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// The per-step rollout reward the explorer logs (mean over all rollouts of the step).
const REWARD_KEY: &str = "rollout/reward_mean";

const WIDTH: usize = 960;
const HEIGHT: usize = 560;

type Rgb = [u8; 3];

const BACKGROUND: Rgb = [255, 255, 255];
const GRID: Rgb = [228, 228, 228];
const FRAME: Rgb = [90, 90, 90];
const INK: Rgb = [40, 40, 40];
const REWARD_COLOR: Rgb = [31, 119, 180];
/// Colours of the eval series in order of first appearance (the tab10 palette after its blue, which is the
/// reward's), so the quickstart's single eval taskset is orange.
const EVAL_COLORS: [Rgb; 5] = [[255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189], [140, 86, 75]];

/// One curve: points in data space (step, value), drawn in one colour.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
    label: String,
    color: Rgb,
    points: Vec<(f64, f64)>,
    /// Whether this is an evaluation curve: eval points are sparse and each one matters, so they get thicker lines
    /// and larger markers than the every-step reward.
    eval: bool,
}

/// Reads a run's metrics file and plots it into `output`; the title defaults to the run's `<project>/<name>`.
pub(crate) fn plot_metrics(metrics: &Path, output: &Path, title: Option<&str>) -> Result<()> {
    let text = std::fs::read_to_string(metrics).with_context(|| format!("cannot read {}", metrics.display()))?;
    let series = read_series(&text).with_context(|| format!("cannot plot {}", metrics.display()))?;
    let title = title.map_or_else(|| default_title(metrics), str::to_owned);
    let png = Figure { title, series }.render().encode_png()?;
    if let Some(parent) = output.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(output, png).with_context(|| format!("cannot write {}", output.display()))
}

/// `<project>/<name>: ...` when the file sits where trinity writes it (`<project>/<name>/monitor/metrics.jsonl`),
/// otherwise the file name, so the PNG says which run it shows once it is copied elsewhere.
fn default_title(metrics: &Path) -> String {
    let run =
        metrics.parent().filter(|dir| dir.file_name().is_some_and(|name| name == "monitor")).and_then(Path::parent);
    let name = match run {
        Some(run) => {
            let names: Vec<String> =
                run.components().rev().take(2).map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            names.into_iter().rev().collect::<Vec<_>>().join("/")
        }
        None => metrics.file_name().map_or_else(String::new, |name| name.to_string_lossy().into_owned()),
    };
    format!("{name}: rollout reward and held-out accuracy")
}

/// The reward series and one accuracy series per eval taskset (`eval/<name>/accuracy`), from metrics.jsonl text.
///
/// Rows are merged by step, later values winning: a resumed run logs again the steps it re-explores, and the latest
/// row is what that run's model did.
pub(crate) fn read_series(text: &str) -> Result<Vec<Series>> {
    let mut rows: BTreeMap<u64, serde_json::Map<String, serde_json::Value>> = BTreeMap::new();
    // Eval taskset names in order of first appearance, so colours stay stable from one plot of a run to the next.
    let mut eval_names: Vec<String> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let number = index + 1;
        let row: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("line {number} is not a JSON object"))?;
        let serde_json::Value::Object(row) = row else { bail!("line {number} is not a JSON object") };
        let step = row
            .get("step")
            .and_then(serde_json::Value::as_u64)
            .with_context(|| format!("line {number} has no integer `step`"))?;
        for key in row.keys() {
            if let Some(name) = eval_accuracy_name(key)
                && !eval_names.iter().any(|known| known == name)
            {
                eval_names.push(name.to_owned());
            }
        }
        rows.entry(step).or_default().extend(row);
    }
    let points = |key: &str| -> Vec<(f64, f64)> {
        rows.iter()
            .filter_map(|(&step, row)| {
                row.get(key).and_then(serde_json::Value::as_f64).map(|value| (step as f64, value))
            })
            .filter(|(_, value)| value.is_finite())
            .collect()
    };
    let mut series = Vec::new();
    let reward = points(REWARD_KEY);
    if !reward.is_empty() {
        series.push(Series {
            label: "rollout reward (mean)".to_owned(),
            color: REWARD_COLOR,
            points: reward,
            eval: false,
        });
    }
    for (index, name) in eval_names.iter().enumerate() {
        let accuracy = points(&format!("eval/{name}/accuracy"));
        if !accuracy.is_empty() {
            let color = EVAL_COLORS[index % EVAL_COLORS.len()];
            series.push(Series { label: format!("eval accuracy: {name}"), color, points: accuracy, eval: true });
        }
    }
    if series.is_empty() {
        bail!("no `{REWARD_KEY}` or `eval/<name>/accuracy` values to plot");
    }
    Ok(series)
}

impl Series {
    /// Markers on a dense reward curve would merge into a thick smear; beyond ~60 steps the line says it all.
    fn has_markers(&self) -> bool {
        self.eval || self.points.len() <= 60
    }
}

fn eval_accuracy_name(key: &str) -> Option<&str> {
    key.strip_prefix("eval/")?.strip_suffix("/accuracy").filter(|name| !name.is_empty())
}

/// A titled figure of some series over steps.
#[derive(Debug)]
pub(crate) struct Figure {
    title: String,
    series: Vec<Series>,
}

/// Where the plot area sits on the canvas and which data ranges its edges stand for.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Layout {
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    x: Axis,
    y: Axis,
}

/// An axis range with its tick spacing.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Axis {
    lo: f64,
    hi: f64,
    step: f64,
}

/// Pixels between the plot frame and the data range, so points at the range's ends are not drawn over the frame.
const INNER_PAD: f64 = 12.0;
const TEXT_SCALE: usize = 2;
const TITLE_SCALE: usize = 3;
const LEGEND_ROW: f64 = 26.0;

impl Layout {
    fn for_figure(figure: &Figure, legend_rows: usize) -> Self {
        let all = || figure.series.iter().flat_map(|series| series.points.iter());
        let (x_min, x_max) = all().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &(x, _)| (lo.min(x), hi.max(x)));
        let (y_min, y_max) = all().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &(_, y)| (lo.min(y), hi.max(y)));
        let x_hi = if x_max > x_min { x_max } else { x_min + 1.0 };
        // Steps are integers: never a tick between two steps.
        let x = Axis { lo: x_min, hi: x_hi, step: nice_step(x_hi - x_min, 10).max(1.0) };
        // Keep [0, 1] in view so a reward of 0.3 looks like 0.3 of the way to perfect, and widen for data outside it.
        let (y_lo, y_hi) = (y_min.min(0.0), y_max.max(1.0));
        let y_step = nice_step(y_hi - y_lo, 5);
        let y = Axis { lo: (y_lo / y_step).floor() * y_step, hi: (y_hi / y_step).ceil() * y_step, step: y_step };
        let bottom = HEIGHT as f64 - 84.0 - LEGEND_ROW * legend_rows as f64;
        Layout { left: 96.0, right: WIDTH as f64 - 32.0, top: 64.0, bottom, x, y }
    }

    /// The canvas position of a data point (pixel centres are at half-integers).
    fn pixel_of(&self, (x, y): (f64, f64)) -> (f64, f64) {
        let px = self.left
            + INNER_PAD
            + (x - self.x.lo) / (self.x.hi - self.x.lo) * (self.right - self.left - 2.0 * INNER_PAD);
        let py = self.bottom
            - INNER_PAD
            - (y - self.y.lo) / (self.y.hi - self.y.lo) * (self.bottom - self.top - 2.0 * INNER_PAD);
        (px, py)
    }
}

impl Axis {
    fn ticks(&self) -> Vec<f64> {
        let first = (self.lo / self.step - 1e-9).ceil() as i64;
        let last = (self.hi / self.step + 1e-9).floor() as i64;
        (first..=last).map(|i| i as f64 * self.step).collect()
    }

    /// A tick label with as many decimals as the spacing needs (0.2 → "0.4", 0.25 → "0.50", 5 → "10").
    fn label(&self, value: f64) -> String {
        let mut decimals = 0;
        while decimals < 6
            && ((self.step * 10f64.powi(decimals)).round() - self.step * 10f64.powi(decimals)).abs() > 1e-6
        {
            decimals += 1;
        }
        // Snap -0.0 and float dust like 0.6000000001 to the tick grid.
        let value = if value.abs() < self.step * 1e-9 { 0.0 } else { value };
        format!("{value:.prec$}", prec = decimals as usize)
    }
}

/// The spacing among 1, 2, 2.5 and 5 times a power of ten that gives about `target` intervals over `span`.
fn nice_step(span: f64, target: usize) -> f64 {
    let raw = span / target as f64;
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    let nice = match raw / magnitude {
        n if n <= 1.0 => 1.0,
        n if n <= 2.0 => 2.0,
        n if n <= 2.5 => 2.5,
        n if n <= 5.0 => 5.0,
        _ => 10.0,
    };
    nice * magnitude
}

impl Figure {
    fn legend_rows(&self) -> Vec<Vec<usize>> {
        let max_width = WIDTH as f64 - 64.0;
        let mut rows: Vec<Vec<usize>> = vec![Vec::new()];
        let mut width = 0.0;
        for (index, series) in self.series.iter().enumerate() {
            let entry = legend_entry_width(&series.label);
            let current = rows.last_mut().expect("rows starts with one row and only grows");
            if !current.is_empty() && width + entry > max_width {
                rows.push(vec![index]);
                width = entry;
            } else {
                current.push(index);
                width += entry;
            }
        }
        rows
    }

    fn layout(&self) -> Layout {
        Layout::for_figure(self, self.legend_rows().len())
    }

    fn render(&self) -> Canvas {
        let layout = self.layout();
        let mut canvas = Canvas::new(WIDTH, HEIGHT, BACKGROUND);
        let (left, right, top, bottom) = (layout.left, layout.right, layout.top, layout.bottom);

        // Grid, frame, ticks and their labels.
        for x in layout.x.ticks() {
            let (px, _) = layout.pixel_of((x, layout.y.lo));
            let column = px.floor();
            canvas.fill_rect(column, top, column + 1.0, bottom, GRID);
            canvas.fill_rect(column, bottom, column + 1.0, bottom + 6.0, FRAME);
            let label = layout.x.label(x);
            canvas.text_centered(px, bottom + 12.0, &label, TEXT_SCALE, INK);
        }
        for y in layout.y.ticks() {
            let (_, py) = layout.pixel_of((layout.x.lo, y));
            let row = py.floor();
            canvas.fill_rect(left, row, right, row + 1.0, GRID);
            canvas.fill_rect(left - 6.0, row, left, row + 1.0, FRAME);
            let label = layout.y.label(y);
            let x = left - 12.0 - text_width(&label, TEXT_SCALE);
            canvas.text(x, py - text_height(TEXT_SCALE) / 2.0, &label, TEXT_SCALE, INK);
        }
        canvas.stroke_rect(left, top, right, bottom, FRAME);

        // Curves under markers, the reward under the evals: the sparse eval points are what the reader looks for.
        for series in &self.series {
            let points: Vec<(f64, f64)> = series.points.iter().map(|&point| layout.pixel_of(point)).collect();
            canvas.polyline(&points, if series.eval { 3.0 } else { 2.0 }, series.color);
        }
        for series in &self.series {
            if series.has_markers() {
                for &point in &series.points {
                    let (px, py) = layout.pixel_of(point);
                    let radius = if series.eval { 5.0 } else { 3.0 };
                    canvas.disc(px, py, radius + 1.5, BACKGROUND);
                    canvas.disc(px, py, radius, series.color);
                }
            }
        }

        // Title, axis names and the legend.
        let mut title_scale = TITLE_SCALE;
        while title_scale > 1 && text_width(&self.title, title_scale) > WIDTH as f64 - 32.0 {
            title_scale -= 1;
        }
        canvas.text_centered(WIDTH as f64 / 2.0, 20.0, &self.title, title_scale, INK);
        canvas.text_centered((left + right) / 2.0, bottom + 36.0, "step", TEXT_SCALE, INK);
        let y_name = "reward / accuracy";
        canvas.text_vertical(
            22.0,
            (top + bottom) / 2.0 + text_width(y_name, TEXT_SCALE) / 2.0,
            y_name,
            TEXT_SCALE,
            INK,
        );
        for (row_index, row) in self.legend_rows().iter().enumerate() {
            let total: f64 = row.iter().map(|&i| legend_entry_width(&self.series[i].label)).sum::<f64>() - LEGEND_GAP;
            let mut x = (WIDTH as f64 - total) / 2.0;
            let y = bottom + 66.0 + LEGEND_ROW * row_index as f64;
            for &index in row {
                let series = &self.series[index];
                let middle = y + text_height(TEXT_SCALE) / 2.0;
                canvas.polyline(
                    &[(x, middle), (x + LEGEND_SAMPLE, middle)],
                    if series.eval { 3.0 } else { 2.0 },
                    series.color,
                );
                if series.has_markers() {
                    canvas.disc(x + LEGEND_SAMPLE / 2.0, middle, if series.eval { 5.0 } else { 3.0 }, series.color);
                }
                canvas.text(x + LEGEND_SAMPLE + 8.0, y, &series.label, TEXT_SCALE, INK);
                x += legend_entry_width(&series.label);
            }
        }
        canvas
    }
}

const LEGEND_SAMPLE: f64 = 32.0;
const LEGEND_GAP: f64 = 36.0;

fn legend_entry_width(label: &str) -> f64 {
    LEGEND_SAMPLE + 8.0 + text_width(label, TEXT_SCALE) + LEGEND_GAP
}

/// An RGB image being drawn, 8 bits per channel, rows top to bottom.
#[derive(Debug)]
struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<u8>,
}

impl Canvas {
    fn new(width: usize, height: usize, background: Rgb) -> Self {
        Canvas { width, height, pixels: background.repeat(width * height) }
    }

    #[cfg(test)]
    fn pixel(&self, x: usize, y: usize) -> Rgb {
        let at = (y * self.width + x) * 3;
        [self.pixels[at], self.pixels[at + 1], self.pixels[at + 2]]
    }

    /// Mixes `color` into one pixel with the given coverage (0 = untouched, 1 = replaced); off-canvas is ignored.
    fn blend(&mut self, x: i64, y: i64, color: Rgb, coverage: f64) {
        if x < 0 || y < 0 || x >= self.width as i64 || y >= self.height as i64 || coverage <= 0.0 {
            return;
        }
        let coverage = coverage.min(1.0);
        let at = (y as usize * self.width + x as usize) * 3;
        for (channel, &value) in self.pixels[at..at + 3].iter_mut().zip(&color) {
            *channel = (f64::from(*channel) * (1.0 - coverage) + f64::from(value) * coverage).round() as u8;
        }
    }

    /// Fills the pixels whose centres lie in `[x0, x1) × [y0, y1)`.
    fn fill_rect(&mut self, x0: f64, y0: f64, x1: f64, y1: f64, color: Rgb) {
        for y in (y0.round() as i64)..(y1.round() as i64) {
            for x in (x0.round() as i64)..(x1.round() as i64) {
                self.blend(x, y, color, 1.0);
            }
        }
    }

    /// A one-pixel outline whose inside is `[x0, x1) × [y0, y1)`.
    fn stroke_rect(&mut self, x0: f64, y0: f64, x1: f64, y1: f64, color: Rgb) {
        self.fill_rect(x0 - 1.0, y0 - 1.0, x1 + 1.0, y0, color);
        self.fill_rect(x0 - 1.0, y1, x1 + 1.0, y1 + 1.0, color);
        self.fill_rect(x0 - 1.0, y0, x0, y1, color);
        self.fill_rect(x1, y0, x1 + 1.0, y1, color);
    }

    /// An anti-aliased polyline of the given width. Coverage is the maximum over segments, accumulated before
    /// blending, so joints are not painted twice (which would darken their soft edges).
    fn polyline(&mut self, points: &[(f64, f64)], width: f64, color: Rgb) {
        let half = width / 2.0;
        let mut coverage: BTreeMap<(i64, i64), f64> = BTreeMap::new();
        let segments: Vec<((f64, f64), (f64, f64))> = match points {
            [] => Vec::new(),
            [only] => vec![(*only, *only)],
            _ => points.windows(2).map(|pair| (pair[0], pair[1])).collect(),
        };
        for (a, b) in segments {
            let x0 = (a.0.min(b.0) - half - 1.0).floor() as i64;
            let x1 = (a.0.max(b.0) + half + 1.0).ceil() as i64;
            let y0 = (a.1.min(b.1) - half - 1.0).floor() as i64;
            let y1 = (a.1.max(b.1) + half + 1.0).ceil() as i64;
            for y in y0..=y1 {
                for x in x0..=x1 {
                    let d = distance_to_segment((x as f64 + 0.5, y as f64 + 0.5), a, b);
                    let c = (half + 0.5 - d).clamp(0.0, 1.0);
                    if c > 0.0 {
                        let cell = coverage.entry((x, y)).or_insert(0.0);
                        *cell = cell.max(c);
                    }
                }
            }
        }
        for ((x, y), c) in coverage {
            self.blend(x, y, color, c);
        }
    }

    /// An anti-aliased filled disc.
    fn disc(&mut self, cx: f64, cy: f64, radius: f64, color: Rgb) {
        for y in (cy - radius - 1.0).floor() as i64..=(cy + radius + 1.0).ceil() as i64 {
            for x in (cx - radius - 1.0).floor() as i64..=(cx + radius + 1.0).ceil() as i64 {
                let d = ((x as f64 + 0.5 - cx).powi(2) + (y as f64 + 0.5 - cy).powi(2)).sqrt();
                self.blend(x, y, color, radius + 0.5 - d);
            }
        }
    }

    /// Text with its top-left corner at (x, y); characters outside printable ASCII are drawn as `?`.
    fn text(&mut self, x: f64, y: f64, text: &str, scale: usize, color: Rgb) {
        let (x, y, s) = (x.round() as i64, y.round() as i64, scale as i64);
        for (index, ch) in text.chars().enumerate() {
            let left = x + index as i64 * GLYPH_ADVANCE as i64 * s;
            let drop = descent(ch) as i64;
            for (row, bits) in glyph(ch).iter().enumerate() {
                for column in 0..GLYPH_WIDTH {
                    if bits & (1 << (GLYPH_WIDTH - 1 - column)) != 0 {
                        let (gx, gy) = (left + column as i64 * s, y + (row as i64 + drop) * s);
                        for dy in 0..s {
                            for dx in 0..s {
                                self.blend(gx + dx, gy + dy, color, 1.0);
                            }
                        }
                    }
                }
            }
        }
    }

    fn text_centered(&mut self, center_x: f64, y: f64, text: &str, scale: usize, color: Rgb) {
        self.text(center_x - text_width(text, scale) / 2.0, y, text, scale, color);
    }

    /// Text turned 90° anticlockwise, read bottom to top, starting at (x, y) = its bottom-left corner.
    fn text_vertical(&mut self, x: f64, y: f64, text: &str, scale: usize, color: Rgb) {
        let (x, y, s) = (x.round() as i64, y.round() as i64, scale as i64);
        for (index, ch) in text.chars().enumerate() {
            let base = y - index as i64 * GLYPH_ADVANCE as i64 * s;
            let drop = descent(ch) as i64;
            for (row, bits) in glyph(ch).iter().enumerate() {
                for column in 0..GLYPH_WIDTH {
                    if bits & (1 << (GLYPH_WIDTH - 1 - column)) != 0 {
                        // Glyph column c goes up from the baseline; glyph row r goes right from the left edge.
                        let (gx, gy) = (x + (row as i64 + drop) * s, base - (column as i64 + 1) * s);
                        for dy in 0..s {
                            for dx in 0..s {
                                self.blend(gx + dx, gy + dy, color, 1.0);
                            }
                        }
                    }
                }
            }
        }
    }

    fn encode_png(&self) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        let width = u32::try_from(self.width).context("canvas too wide for PNG")?;
        let height = u32::try_from(self.height).context("canvas too tall for PNG")?;
        let mut encoder = png::Encoder::new(&mut bytes, width, height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().context("cannot start the PNG")?;
        writer.write_image_data(&self.pixels).context("cannot encode the PNG")?;
        writer.finish().context("cannot finish the PNG")?;
        Ok(bytes)
    }
}

fn distance_to_segment(p: (f64, f64), a: (f64, f64), b: (f64, f64)) -> f64 {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let length2 = dx * dx + dy * dy;
    let t = if length2 == 0.0 { 0.0 } else { (((p.0 - a.0) * dx + (p.1 - a.1) * dy) / length2).clamp(0.0, 1.0) };
    ((p.0 - a.0 - t * dx).powi(2) + (p.1 - a.1 - t * dy).powi(2)).sqrt()
}

const GLYPH_WIDTH: usize = 5;
const GLYPH_HEIGHT: usize = 7;
/// Glyph width plus one column of spacing.
const GLYPH_ADVANCE: usize = GLYPH_WIDTH + 1;

fn text_width(text: &str, scale: usize) -> f64 {
    let count = text.chars().count();
    if count == 0 { 0.0 } else { ((count * GLYPH_ADVANCE - 1) * scale) as f64 }
}

fn text_height(scale: usize) -> f64 {
    (GLYPH_HEIGHT * scale) as f64
}

fn glyph(ch: char) -> [u8; GLYPH_HEIGHT] {
    let index = if (' '..='~').contains(&ch) { ch as usize - ' ' as usize } else { '?' as usize - ' ' as usize };
    GLYPHS[index]
}

/// Rows a glyph is drawn below the top of its box: `g`, `p`, `q` and `y` hang their descenders below the
/// baseline (their table rows start at the x-height), so they do not read as `a`, `P`, `a` and `u`-with-a-tail.
fn descent(ch: char) -> usize {
    if matches!(ch, 'g' | 'p' | 'q' | 'y') { 2 } else { 0 }
}

/// Rows of each glyph, top to bottom, bit 4 = leftmost column; parsed at compile time from [`FONT`].
const GLYPHS: [[u8; GLYPH_HEIGHT]; 95] = parse_font(&FONT);

/// Turns the readable font table into bit rows; a malformed line is a compile error, not a garbled label.
const fn parse_font(font: &[&str; 95]) -> [[u8; GLYPH_HEIGHT]; 95] {
    let mut glyphs = [[0u8; GLYPH_HEIGHT]; 95];
    let mut index = 0;
    while index < 95 {
        let line = font[index].as_bytes();
        assert!(line.len() == 2 + GLYPH_HEIGHT * (GLYPH_WIDTH + 1) - 1, "font line has the wrong length");
        assert!(line[0] as usize == index + 32 && line[1] == b' ', "font lines must be in ASCII order");
        let mut row = 0;
        while row < GLYPH_HEIGHT {
            let mut bits = 0u8;
            let mut column = 0;
            while column < GLYPH_WIDTH {
                let cell = line[2 + row * (GLYPH_WIDTH + 1) + column];
                assert!(cell == b'#' || cell == b'.', "font cells are `#` or `.`");
                bits = (bits << 1) | (cell == b'#') as u8;
                column += 1;
            }
            glyphs[index][row] = bits;
            row += 1;
        }
        index += 1;
    }
    glyphs
}

/// A 5×7 font for printable ASCII in the style of the HD44780 character LCD: each line is the character, then its
/// seven rows top to bottom (`#` = ink). The rows of `g`, `p`, `q` and `y` start at the x-height (see [`descent`]).
#[rustfmt::skip]
const FONT: [&str; 95] = [
    "  ..... ..... ..... ..... ..... ..... .....",
    "! ..#.. ..#.. ..#.. ..#.. ..#.. ..... ..#..",
    "\" .#.#. .#.#. .#.#. ..... ..... ..... .....",
    "# .#.#. .#.#. ##### .#.#. ##### .#.#. .#.#.",
    "$ ..#.. .#### #.#.. .###. ..#.# ####. ..#..",
    "% ##... ##..# ...#. ..#.. .#... #..## ...##",
    "& .##.. #..#. #.#.. .#... #.#.# #..#. .##.#",
    "' .##.. ..#.. .#... ..... ..... ..... .....",
    "( ...#. ..#.. .#... .#... .#... ..#.. ...#.",
    ") .#... ..#.. ...#. ...#. ...#. ..#.. .#...",
    "* ..... ..#.. #.#.# .###. #.#.# ..#.. .....",
    "+ ..... ..#.. ..#.. ##### ..#.. ..#.. .....",
    ", ..... ..... ..... ..... .##.. ..#.. .#...",
    "- ..... ..... ..... ##### ..... ..... .....",
    ". ..... ..... ..... ..... ..... .##.. .##..",
    "/ ..... ....# ...#. ..#.. .#... #.... .....",
    "0 .###. #...# #..## #.#.# ##..# #...# .###.",
    "1 ..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    "2 .###. #...# ....# ...#. ..#.. .#... #####",
    "3 ##### ...#. ..#.. ...#. ....# #...# .###.",
    "4 ...#. ..##. .#.#. #..#. ##### ...#. ...#.",
    "5 ##### #.... ####. ....# ....# #...# .###.",
    "6 ..##. .#... #.... ####. #...# #...# .###.",
    "7 ##### ....# ...#. ..#.. .#... .#... .#...",
    "8 .###. #...# #...# .###. #...# #...# .###.",
    "9 .###. #...# #...# .#### ....# ...#. .##..",
    ": ..... .##.. .##.. ..... .##.. .##.. .....",
    "; ..... .##.. .##.. ..... .##.. ..#.. .#...",
    "< ...#. ..#.. .#... #.... .#... ..#.. ...#.",
    "= ..... ..... ##### ..... ##### ..... .....",
    "> .#... ..#.. ...#. ....# ...#. ..#.. .#...",
    "? .###. #...# ....# ...#. ..#.. ..... ..#..",
    "@ .###. #...# ....# .##.# #.#.# #.#.# .###.",
    "A .###. #...# #...# #...# ##### #...# #...#",
    "B ####. #...# #...# ####. #...# #...# ####.",
    "C .###. #...# #.... #.... #.... #...# .###.",
    "D ###.. #..#. #...# #...# #...# #..#. ###..",
    "E ##### #.... #.... ####. #.... #.... #####",
    "F ##### #.... #.... ####. #.... #.... #....",
    "G .###. #...# #.... #.### #...# #...# .####",
    "H #...# #...# #...# ##### #...# #...# #...#",
    "I .###. ..#.. ..#.. ..#.. ..#.. ..#.. .###.",
    "J ..### ...#. ...#. ...#. ...#. #..#. .##..",
    "K #...# #..#. #.#.. ##... #.#.. #..#. #...#",
    "L #.... #.... #.... #.... #.... #.... #####",
    "M #...# ##.## #.#.# #.#.# #...# #...# #...#",
    "N #...# #...# ##..# #.#.# #..## #...# #...#",
    "O .###. #...# #...# #...# #...# #...# .###.",
    "P ####. #...# #...# ####. #.... #.... #....",
    "Q .###. #...# #...# #...# #.#.# #..#. .##.#",
    "R ####. #...# #...# ####. #.#.. #..#. #...#",
    "S .#### #.... #.... .###. ....# ....# ####.",
    "T ##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#..",
    "U #...# #...# #...# #...# #...# #...# .###.",
    "V #...# #...# #...# #...# #...# .#.#. ..#..",
    "W #...# #...# #...# #.#.# #.#.# #.#.# .#.#.",
    "X #...# #...# .#.#. ..#.. .#.#. #...# #...#",
    "Y #...# #...# #...# .#.#. ..#.. ..#.. ..#..",
    "Z ##### ....# ...#. ..#.. .#... #.... #####",
    "[ .###. .#... .#... .#... .#... .#... .###.",
    "\\ ..... #.... .#... ..#.. ...#. ....# .....",
    "] .###. ...#. ...#. ...#. ...#. ...#. .###.",
    "^ ..#.. .#.#. #...# ..... ..... ..... .....",
    "_ ..... ..... ..... ..... ..... ..... #####",
    "` .#... ..#.. ...#. ..... ..... ..... .....",
    "a ..... ..... .###. ....# .#### #...# .####",
    "b #.... #.... #.##. ##..# #...# #...# ####.",
    "c ..... ..... .###. #.... #.... #...# .###.",
    "d ....# ....# .##.# #..## #...# #...# .####",
    "e ..... ..... .###. #...# ##### #.... .###.",
    "f ..##. .#..# .#... ###.. .#... .#... .#...",
    "g .#### #...# #...# #...# .#### ....# .###.",
    "h #.... #.... #.##. ##..# #...# #...# #...#",
    "i ..#.. ..... .##.. ..#.. ..#.. ..#.. .###.",
    "j ...#. ..... ..##. ...#. ...#. #..#. .##..",
    "k #.... #.... #..#. #.#.. ##... #.#.. #..#.",
    "l .##.. ..#.. ..#.. ..#.. ..#.. ..#.. .###.",
    "m ..... ..... ##.#. #.#.# #.#.# #...# #...#",
    "n ..... ..... #.##. ##..# #...# #...# #...#",
    "o ..... ..... .###. #...# #...# #...# .###.",
    "p ####. #...# #...# #...# ####. #.... #....",
    "q .#### #...# #...# #...# .#### ....# ....#",
    "r ..... ..... #.##. ##..# #.... #.... #....",
    "s ..... ..... .###. #.... .###. ....# ####.",
    "t .#... .#... ###.. .#... .#... .#..# ..##.",
    "u ..... ..... #...# #...# #...# #..## .##.#",
    "v ..... ..... #...# #...# #...# .#.#. ..#..",
    "w ..... ..... #...# #...# #.#.# #.#.# .#.#.",
    "x ..... ..... #...# .#.#. ..#.. .#.#. #...#",
    "y #...# #...# #...# #...# .#### ....# .###.",
    "z ..... ..... ##### ...#. ..#.. .#... #####",
    "{ ...#. ..#.. ..#.. .#... ..#.. ..#.. ...#.",
    "| ..#.. ..#.. ..#.. ..#.. ..#.. ..#.. ..#..",
    "} .#... ..#.. ..#.. ...#. ..#.. ..#.. .#...",
    "~ ..... ..... .#... #.#.# ...#. ..... .....",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Reward rising 0 → 1 over steps 1..=10, eval accuracy 0.1, 0.6, 0.3 at steps 0, 5, 10 (eval on startup).
    fn sample_metrics() -> String {
        let mut lines = vec![r#"{"step":0,"eval/addition-eval/accuracy":0.1}"#.to_owned()];
        for step in 1..=10 {
            let reward = f64::from(step) / 10.0;
            let eval = match step {
                5 => r#","eval/addition-eval/accuracy":0.6"#,
                10 => r#","eval/addition-eval/accuracy":0.3"#,
                _ => "",
            };
            lines.push(format!(r#"{{"step":{step},"rollout/reward_mean":{reward},"train/pg_loss":0.1{eval}}}"#));
        }
        lines.join("\n")
    }

    fn sample_figure() -> Figure {
        Figure {
            title: "quickstart/test: rollout reward and held-out accuracy".to_owned(),
            series: read_series(&sample_metrics()).unwrap(),
        }
    }

    fn decode(bytes: &[u8]) -> (png::OutputInfo, Vec<u8>) {
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes)).read_info().unwrap();
        let mut buffer = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buffer).unwrap();
        buffer.truncate(info.buffer_size());
        (info, buffer)
    }

    fn decoded_pixel(buffer: &[u8], width: usize, (x, y): (f64, f64)) -> Rgb {
        let at = (y.floor() as usize * width + x.floor() as usize) * 3;
        [buffer[at], buffer[at + 1], buffer[at + 2]]
    }

    #[test]
    fn png_decodes_with_the_figure_size() {
        let canvas = sample_figure().render();
        let (info, buffer) = decode(&canvas.encode_png().unwrap());
        assert_eq!((info.width, info.height), (WIDTH as u32, HEIGHT as u32));
        assert_eq!((info.color_type, info.bit_depth), (png::ColorType::Rgb, png::BitDepth::Eight));
        assert_eq!(buffer, canvas.pixels);
    }

    #[test]
    fn series_colours_sit_where_the_data_says() {
        let figure = sample_figure();
        let layout = figure.layout();
        let (info, buffer) = decode(&figure.render().encode_png().unwrap());
        let width = info.width as usize;
        for step in 1..=10 {
            let point = layout.pixel_of((f64::from(step), f64::from(step) / 10.0));
            assert_eq!(decoded_pixel(&buffer, width, point), REWARD_COLOR, "reward at step {step}");
        }
        let eval_color = EVAL_COLORS[0];
        for point in [(0.0, 0.1), (5.0, 0.6), (10.0, 0.3), (2.5, 0.35), (7.5, 0.45)] {
            assert_eq!(decoded_pixel(&buffer, width, layout.pixel_of(point)), eval_color, "accuracy at {point:?}");
        }
        // Where there is no data there is no series colour: nothing of either near (2, 0.9) or (8, 0.1).
        for point in [(2.0, 0.9), (8.0, 0.1)] {
            let (cx, cy) = layout.pixel_of(point);
            for dy in -8..=8 {
                for dx in -8..=8 {
                    let pixel = decoded_pixel(&buffer, width, (cx + f64::from(dx), cy + f64::from(dy)));
                    assert!(pixel != REWARD_COLOR && pixel != eval_color, "series colour near {point:?}");
                }
            }
        }
    }

    #[test]
    fn plot_metrics_writes_a_png_named_after_the_run() {
        let dir = std::env::temp_dir().join(format!("xtask-plot-{}", std::process::id()));
        let metrics = dir.join("quickstart/run-a/monitor/metrics.jsonl");
        std::fs::create_dir_all(metrics.parent().unwrap()).unwrap();
        std::fs::write(&metrics, sample_metrics()).unwrap();
        let output = dir.join("out/plot.png");
        plot_metrics(&metrics, &output, None).unwrap();
        let (info, _) = decode(&std::fs::read(&output).unwrap());
        assert_eq!((info.width, info.height), (WIDTH as u32, HEIGHT as u32));
        assert_eq!(default_title(&metrics), "quickstart/run-a: rollout reward and held-out accuracy");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rows_merge_by_step_and_every_eval_taskset_gets_a_series() {
        let text = r#"{"step":0,"eval/a/accuracy":0.25,"eval/b/accuracy":0.5}
{"step":1,"rollout/reward_mean":0.1}

{"step":2,"rollout/reward_mean":0.2}
{"step":2,"rollout/reward_mean":0.3,"eval/b/accuracy":0.75}"#;
        let series = read_series(text).unwrap();
        let expected = |label: &str, color: Rgb, points: &[(f64, f64)], eval: bool| Series {
            label: label.to_owned(),
            color,
            points: points.to_vec(),
            eval,
        };
        assert_eq!(
            series,
            [
                expected("rollout reward (mean)", REWARD_COLOR, &[(1.0, 0.1), (2.0, 0.3)], false),
                expected("eval accuracy: a", EVAL_COLORS[0], &[(0.0, 0.25)], true),
                expected("eval accuracy: b", EVAL_COLORS[1], &[(0.0, 0.5), (2.0, 0.75)], true),
            ]
        );
    }

    #[test]
    fn bad_metrics_name_the_line_or_the_missing_keys() {
        let error = read_series("{\"step\":0}\n{\"rollout/reward_mean\":1}").unwrap_err();
        assert_eq!(error.to_string(), "line 2 has no integer `step`");
        let error = read_series("{\"step\":0}\nnot json").unwrap_err();
        assert_eq!(error.to_string(), "line 2 is not a JSON object");
        let error = read_series("{\"step\":0,\"train/pg_loss\":0.5}").unwrap_err();
        assert_eq!(error.to_string(), "no `rollout/reward_mean` or `eval/<name>/accuracy` values to plot");
    }

    #[test]
    fn axes_get_round_ticks_and_labels() {
        let y = Axis { lo: 0.0, hi: 1.0, step: nice_step(1.0, 5) };
        let labels: Vec<String> = y.ticks().into_iter().map(|t| y.label(t)).collect();
        assert_eq!(labels, ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]);
        assert_eq!(nice_step(20.0, 10), 2.0);
        assert_eq!(nice_step(1.2, 5), 0.25);
        let quarter = Axis { lo: -0.5, hi: 0.5, step: 0.25 };
        let labels: Vec<String> = quarter.ticks().into_iter().map(|t| quarter.label(t)).collect();
        assert_eq!(labels, ["-0.50", "-0.25", "0.00", "0.25", "0.50"]);
        // A single step still gets a non-empty x range.
        let figure =
            Figure { title: String::new(), series: read_series("{\"step\":3,\"rollout/reward_mean\":0.5}").unwrap() };
        let layout = figure.layout();
        assert_eq!((layout.x.lo, layout.x.hi, layout.x.step), (3.0, 4.0, 1.0));
        assert_eq!((layout.y.lo, layout.y.hi), (0.0, 1.0));
    }

    #[test]
    fn text_draws_the_font_bits() {
        let mut canvas = Canvas::new(12, 7, BACKGROUND);
        canvas.text(0.0, 0.0, "1é", 1, INK);
        for (row, bits) in glyph('1').iter().enumerate() {
            for column in 0..GLYPH_WIDTH {
                let inked = bits & (1 << (GLYPH_WIDTH - 1 - column)) != 0;
                assert_eq!(canvas.pixel(column, row) == INK, inked, "row {row} column {column}");
            }
        }
        // Outside ASCII falls back to `?`, whose bottom dot sits in the middle column of the last row.
        assert_eq!(glyph('é'), glyph('?'));
        assert_eq!(canvas.pixel(GLYPH_ADVANCE + 2, GLYPH_HEIGHT - 1), INK);
        assert_eq!(glyph(' '), [0; GLYPH_HEIGHT]);
        // A descender hangs two rows below the baseline: `p`'s stem reaches row 8, its top starts at row 2.
        let mut canvas = Canvas::new(6, 9, BACKGROUND);
        canvas.text(0.0, 0.0, "p", 1, INK);
        assert_eq!((canvas.pixel(0, 1), canvas.pixel(0, 2), canvas.pixel(0, 8)), (BACKGROUND, INK, INK));
        assert_eq!(text_width("ab", 2), 22.0);
    }
}
